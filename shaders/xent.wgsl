// Cross-entropy with integer targets over a contiguous [N, C] block of logits, fused with
// log-softmax (PyTorch semantics: ignore_index rows give 0 and are not counted; label smoothing
// eps mixes in the uniform distribution). A target outside [0, C) that is not ignore_index
// gives a NaN loss and sets the device's assert flag (runtime/asserts.py; raised on the next
// host read).
// fwd (one workgroup per row): LOSS[r]; LSE[r] = max of row r, LSE[N + r] = log(sum exp(x - max))
//   (kept apart: max + log(sum) rounds at large logits, 0.5 at 1e7).
//   words: 0 N, 1 C, 2 x off, 3 t off, 4 ignore_index (i32), 5 eps, 6 op code of the flag
// fwd_rows: the same with one invocation per row and no barriers (CPU adapters).
// loss_rows (one invocation per row): the same from row statistics already computed (GPU row
//   variants, ops/rowops.py): LSE holds the rows' (max, log sum) and LOSS[r] the row sum on entry.
// finish (one workgroup): OUT[0] = sum or mean of LOSS over counted rows, OUT[1] = count.
//   words: 0 N, 1 t off, 2 ignore_index, 3 mean (1) or sum (0)
// bwd (one invocation per logit): dx = scale * (softmax - (1 - eps) onehot - eps / C).
//   words: 0 N, 1 C, 2 x off, 3 t off, 4 ignore_index, 5 eps, 6 mode (0 mean, 1 sum, 2 none),
//   7 g off, 8 count off
const WG: u32 = {{WG}}u;

@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> T: array<i32>;
@group(0) @binding(3) var<storage, read_write> LOSS: array<f32>;
@group(0) @binding(4) var<storage, read_write> LSE: array<f32>;
@group(0) @binding(5) var<storage, read_write> FLAG: array<atomic<u32>>;
@group(0) @binding(6) var<storage, read> GR: array<f32>;
@group(0) @binding(7) var<storage, read> CNT: array<f32>;

var<workgroup> sm: array<f32, WG>;
var<workgroup> ss: array<f32, WG>;
var<workgroup> sx: array<f32, WG>;

// (max, sum exp(x - max), sum x) of the row columns j0, j0 + dj, ... below C.
fn row_stats(xb: u32, C: u32, j0: u32, dj: u32) -> vec3<f32> {
    var ms = vec2<f32>(LOWEST_F32, 0.0);
    var sum = 0.0;
    for (var j = j0; j < C; j += dj) {
        let v = X[xb + j];
        ms = lse_push(ms, v);
        sum += v;
    }
    return vec3<f32>(ms, sum);
}

// Loss of row r from its max m, log(sum exp(x - m)) ls and sum of x; (m, ls) kept in LSE. The
// target's term is (m - x_t) + ls, never (m + ls) - x_t: exact at large offsets, and +inf (as in
// PyTorch) for a -inf target logit.
fn row_loss(r: u32, C: u32, xb: u32, m: f32, ls: f32, sum: f32) {
    let t = T[pu(3u) + r];
    let eps = pf(5u);
    var loss = 0.0;
    if (t != pi(4u)) {
        if (t < 0 || u32(t) >= C) {
            loss = bitcast<f32>(0x7fc00000u);
            let f = atomicCompareExchangeWeak(&FLAG[0], 0u, pu(6u));
            if (f.exchanged || f.old_value == 0u) {
                atomicStore(&FLAG[0], pu(6u));
                atomicStore(&FLAG[1], bitcast<u32>(t));
                atomicStore(&FLAG[2], C);
            }
        } else {
            loss = (1.0 - eps) * ((m - X[xb + u32(t)]) + ls);
            if (eps != 0.0) { loss += eps * ((m - sum / f32(C)) + ls); }
        }
    }
    LOSS[r] = loss;
    LSE[r] = m;
    LSE[pu(0u) + r] = ls;
}

// Workgroup reduction of each invocation's v: (v.x, v.y) as (max, sum exp) pairs merged (lse)
// or, without lse, v.y added; v.z always added. Call in uniform control flow.
fn wg_reduce(v: vec3<f32>, lid: u32, lse: bool) -> vec3<f32> {
    sm[lid] = v.x;
    ss[lid] = v.y;
    sx[lid] = v.z;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k && lse) {
            let m = lse_merge(vec2<f32>(sm[lid], ss[lid]), vec2<f32>(sm[lid + k], ss[lid + k]));
            sm[lid] = m.x;
            ss[lid] = m.y;
        } else if (lid < k) {
            ss[lid] += ss[lid + k];
        }
        if (lid < k) { sx[lid] += sx[lid + k]; }
        workgroupBarrier();
    }
    return vec3<f32>(sm[0], ss[0], sx[0]);
}

@compute @workgroup_size(WG)
fn fwd(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    let xb = pu(2u) + r * C;
    let st = wg_reduce(row_stats(xb, C, ids.lid, WG), ids.lid, true);
    if (ids.lid == 0u) { row_loss(r, C, xb, st.x, log(st.y), st.z); }
}

@compute @workgroup_size(WG)
fn finish(@builtin(local_invocation_index) lid: u32) {
    let N = pu(0u);
    var s = 0.0;
    var n = 0.0;
    for (var r = lid; r < N; r += WG) {
        if (T[pu(1u) + r] != pi(2u)) {
            s += X[r];
            n += 1.0;
        }
    }
    let t = wg_reduce(vec3<f32>(0.0, n, s), lid, false);
    if (lid == 0u) {
        LOSS[0] = select(t.z, t.z / t.y, pu(3u) == 1u);
        LOSS[1] = t.y;
    }
}

@compute @workgroup_size(256)
fn bwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    let C = pu(1u);
    if (i >= pu(0u) * C) { return; }
    let r = i / C;
    let j = i % C;
    let t = T[pu(3u) + r];
    var dx = 0.0;
    if (t != pi(4u)) {
        let mode = pu(6u);
        var scale = GR[pu(7u)];
        if (mode == 0u) { scale /= CNT[pu(8u)]; } else if (mode == 2u) { scale = GR[pu(7u) + r]; }
        let eps = pf(5u);
        let p = exp((X[pu(2u) + i] - LSE[r]) - LSE[pu(0u) + r]);
        dx = scale * (p - select(0.0, 1.0 - eps, i32(j) == t) - eps / f32(C));
    }
    LOSS[i] = dx;
}

// bwd_rows: bwd with one invocation a row (CPU adapters, thread row mode, C within the loop
// budget): the row's target, scale and log-sum-exp read once, not once per element (llvmpipe
// pays a loop over the lanes for every storage read).
@compute @workgroup_size(64)
fn bwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    let t = T[pu(3u) + r];
    let ob = r * C;
    if (t == pi(4u)) {
        for (var j = 0u; j < C; j++) { LOSS[ob + j] = 0.0; }
        return;
    }
    let mode = pu(6u);
    var scale = GR[pu(7u)];
    if (mode == 0u) { scale /= CNT[pu(8u)]; } else if (mode == 2u) { scale = GR[pu(7u) + r]; }
    let eps = pf(5u);
    let m = LSE[r];
    let ls = LSE[pu(0u) + r];
    let xb = pu(2u) + ob;
    for (var j = 0u; j < C; j++) {
        let p = exp((X[xb + j] - m) - ls);
        LOSS[ob + j] = scale * (p - select(0.0, 1.0 - eps, i32(j) == t) - eps / f32(C));
    }
}

@compute @workgroup_size(64)
fn fwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    let xb = pu(2u) + r * C;
    let st = row_stats(xb, C, 0u, 1u);
    row_loss(r, C, xb, st.x, log(st.y), st.z);
}

@compute @workgroup_size(64)
fn loss_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    row_loss(r, C, pu(2u) + r * C, LSE[r], LSE[pu(0u) + r], LOSS[r]);
}
