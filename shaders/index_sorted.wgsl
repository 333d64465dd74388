// Backward of index_select / embedding in time linear in ids + rows (up to the sort's log^2):
// DX[o, a, :] = sum over k with IDX[k] == a of G[o, k, :], G viewed as [outer, K, inner], DX as
// [outer, A, inner] (ops/indexing.py; select_bwd in index.wgsl compares every index per row).
//   1. sort_init, sort_step: KEYS = (row, k) of every index, sorted (bitonic, padded to a power
//      of two N with rows 0xffffffff); k breaks ties, so each row's run is in ascending k.
//   2. seg_clear, seg_bounds: LO[a], HI[a] = the run [lo, hi) of row a in KEYS.
//   3. block_sums: BS[o, b, c] = sum of G over the sorted entries of block b (B entries), for
//      the blocks inside one row's run (the only ones seg_sum reads).
//   4. seg_sum: DX[o, a, c] = the run's sum: entries of its partial blocks one by one, its whole
//      blocks from BS; always in the same order (deterministic, no float atomics), and no
//      invocation loops more than 2 B + K / B times (the host picks B: ops/indexing.py).
// block_sums and seg_sum take CW columns an invocation (one index read for CW columns; CW
// divides inner, so the column loops have constant bounds and unroll).
// Words: sort_init 0 K, 1 N, 2 A, 3 idx off | sort_step 0 N / 2, 1 j, 2 k | seg_clear 0 A |
// seg_bounds 0 K | block_sums 0 K, 1 inner, 2 n blocks, 3 g off, 4 B, 5 invocations |
// seg_sum 0 A, 1 K, 2 inner, 3 n blocks, 4 g off, 5 B, 6 invocations
const CW: u32 = {{CW}}u;
@group(0) @binding(1) var<storage, read> G: array<f32>;
@group(0) @binding(2) var<storage, read> IDX: array<i32>;
@group(0) @binding(3) var<storage, read_write> KEYS: array<vec2<u32>>;
@group(0) @binding(4) var<storage, read_write> LO: array<u32>;
@group(0) @binding(5) var<storage, read_write> BS: array<f32>;
@group(0) @binding(6) var<storage, read_write> DX: array<f32>;
@group(0) @binding(7) var<storage, read_write> HI: array<u32>;

@compute @workgroup_size(256)
fn sort_init(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(1u)) { return; }
    var row = 0xffffffffu;
    if (i < pu(0u)) { row = norm_index(IDX[pu(3u) + i], pu(2u)); }
    KEYS[i] = vec2<u32>(row, i);
}

fn before(a: vec2<u32>, b: vec2<u32>) -> bool { return a.x < b.x || (a.x == b.x && a.y < b.y); }

@compute @workgroup_size(256)
fn sort_step(ids: Launch) {
    let t = thread_idx(ids, 256u);
    if (t >= pu(0u)) { return; }
    let j = pu(1u);
    let i = (t / j) * 2u * j + t % j;  // the pair (i, i + j), bit j of i clear
    let a = KEYS[i];
    let b = KEYS[i + j];
    if (before(b, a) == ((i & pu(2u)) == 0u)) {  // ascending where bit k of i is clear
        KEYS[i] = b;
        KEYS[i + j] = a;
    }
}

@compute @workgroup_size(256)
fn seg_clear(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    LO[i] = 0u;
    HI[i] = 0u;
}

@compute @workgroup_size(256)
fn seg_bounds(ids: Launch) {
    let p = thread_idx(ids, 256u);
    let K = pu(0u);
    if (p >= K) { return; }
    let a = KEYS[p].x;
    if (p == 0u || KEYS[p - 1u].x != a) { LO[a] = p; }
    if (p + 1u == K || KEYS[p + 1u].x != a) { HI[a] = p + 1u; }
}

// s += G[o, k(p), c0 .. c0 + CW) for sorted entry p
fn add_row(s: ptr<function, array<f32, CW>>, o: u32, p: u32, c0: u32, K: u32, inner: u32,
           goff: u32) {
    let base = goff + (o * K + KEYS[p].y) * inner + c0;
    for (var j = 0u; j < CW; j++) { (*s)[j] += G[base + j]; }
}

@compute @workgroup_size(256)
fn block_sums(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(5u)) { return; }
    let K = pu(0u);
    let inner = pu(1u);
    let nb = pu(2u);
    let B = pu(4u);
    let nc = (inner + CW - 1u) / CW;
    let c0 = (i % nc) * CW;
    let b = (i / nc) % nb;
    let o = i / (nc * nb);
    if (b * B + B > K || KEYS[b * B].x != KEYS[b * B + B - 1u].x) { return; }  // not inside a run
    var s: array<f32, CW>;
    for (var p = b * B; p < b * B + B; p++) { add_row(&s, o, p, c0, K, inner, pu(3u)); }
    let out = (o * nb + b) * inner + c0;
    for (var j = 0u; j < CW; j++) { BS[out + j] = s[j]; }
}

@compute @workgroup_size(256)
fn seg_sum(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(6u)) { return; }
    let A = pu(0u);
    let K = pu(1u);
    let inner = pu(2u);
    let nb = pu(3u);
    let goff = pu(4u);
    let B = pu(5u);
    let nc = (inner + CW - 1u) / CW;
    let c0 = (i % nc) * CW;
    let a = (i / nc) % A;
    let o = i / (nc * A);
    let lo = LO[a];
    let hi = HI[a];
    let b0 = (lo + B - 1u) / B;  // the run's whole blocks: b0 <= b < b1
    let b1 = hi / B;
    var s: array<f32, CW>;
    if (b0 < b1) {
        for (var p = lo; p < b0 * B; p++) { add_row(&s, o, p, c0, K, inner, goff); }
        for (var b = b0; b < b1; b++) {
            let bb = (o * nb + b) * inner + c0;
            for (var j = 0u; j < CW; j++) { s[j] += BS[bb + j]; }
        }
        for (var p = b1 * B; p < hi; p++) { add_row(&s, o, p, c0, K, inner, goff); }
    } else {
        for (var p = lo; p < hi; p++) { add_row(&s, o, p, c0, K, inner, goff); }
    }
    let out = (o * A + a) * inner + c0;
    for (var j = 0u; j < CW; j++) { DX[out + j] = s[j]; }
}
