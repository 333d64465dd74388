// Index ops on a contiguous source viewed as [outer, A, inner] (A = the indexed axis).
// An index i < 0 counts from the end (numpy); indices still outside [0, A) are clamped, and the
// forward kernels report them in the device's assert flag (runtime/asserts.py), raised on the
// next host read. Forward words 6 op code of the flag, 7 negatives allowed (0: only 0..A-1).
// Define T: storage type of the data (f32 or i32).
// select_fwd (one invocation per output element): OUT[o, k, in] = X[o, IDX[k], in]
//   words: 0 n out, 1 A, 2 K, 3 inner, 4 x off, 5 idx off
// select_rows_fwd (one workgroup of 64 per output row (o, k), for wide rows: one index read
//   and no divisions per element). Words as select_fwd.
// select_rows_cpu: select_rows_fwd without a workgroup per row (CPU adapters, where each
//   workgroup costs ~1.5 us): one invocation per 32 columns of an output row. Words as select_fwd.
// select_bwd (one workgroup per destination row (o, a)): DX[o, a, :] = sum over k with
//   IDX[k] == a of G[o, k, :]. The workgroup compacts the matching k of each chunk of 256
//   indices (prefix sum) and adds them in ascending k: deterministic, no atomics. Cost
//   outer * A * K index comparisons: small tables only (index_sorted.wgsl sorts past that).
//   words: 0 rows (outer * A), 1 A, 2 K, 3 inner, 4 g off, 5 idx off, 6 k0, 7 k1 (this pass
//   adds the indices k0 <= k < k1: long index lists take several passes so that no loop runs
//   long), 8 accumulate (0: the first pass, which also zeroes DX)
// select_bwd_rows: the same without barriers (CPU adapters): one invocation per 32 columns of
//   a destination row, looping over the indices of the pass. Words as select_bwd.
// gather_fwd (one invocation per output element): OUT[o, j, in] = X[o, IDX[o, j, in], in]
//   words: 0 n out, 1 A, 2 J, 3 inner, 4 x off, 5 idx off
// gather_bwd (one invocation per element of DX): DX[o, a, in] = sum over j with
//   IDX[o, j, in] == a of G[o, j, in]. Cost numel(x) * J: meant for small J.
//   words: 0 n dx, 1 A, 2 J, 3 inner, 4 g off, 5 idx off, 6 j0, 7 j1, 8 accumulate (passes
//   over j as in select_bwd)
@group(0) @binding(1) var<storage, read> X: array<{{T}}>;
@group(0) @binding(2) var<storage, read> IDX: array<i32>;
@group(0) @binding(3) var<storage, read_write> OUT: array<{{T}}>;
@group(0) @binding(4) var<storage, read_write> FLAG: array<atomic<u32>>;

// Record a bad index in the assert flag (the first op to fail keeps it).
fn flag_bad(v: i32, A: u32) {
    let r = atomicCompareExchangeWeak(&FLAG[0], 0u, pu(6u));
    if (r.exchanged || r.old_value == 0u) {
        atomicStore(&FLAG[0], pu(6u));
        atomicStore(&FLAG[1], bitcast<u32>(v));
        atomicStore(&FLAG[2], A);
    }
}

// norm_index of a forward kernel, reporting indices out of range.
fn fwd_index(v: i32, A: u32) -> u32 {
    if (v >= i32(A) || v < select(0, -i32(A), pu(7u) != 0u)) { flag_bad(v, A); }
    return norm_index(v, A);
}

// X[o, IDX[e], col] for output element i = (o, k or j, col) of [outer, K or J, inner]
// (words 1 A, 2 K or J, 3 inner, 4 x off, 5 idx off); e is the index element to read.
fn pick(i: u32, e: u32) -> {{T}} {
    let A = pu(1u);
    let inner = pu(3u);
    let o = i / (inner * pu(2u));
    return X[pu(4u) + (o * A + fwd_index(IDX[pu(5u) + e], A)) * inner + i % inner];
}

@compute @workgroup_size(256)
fn select_fwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    OUT[i] = pick(i, (i / pu(3u)) % pu(2u));
}

@compute @workgroup_size(64)
fn select_rows_fwd(ids: Launch) {
    let row = group_idx(ids);
    let inner = pu(3u);
    let K = pu(2u);
    if (row * inner >= pu(0u)) { return; }
    let A = pu(1u);
    let a = fwd_index(IDX[pu(5u) + row % K], A);
    let src = pu(4u) + ((row / K) * A + a) * inner;
    let dst = row * inner;
    for (var c = ids.lid; c < inner; c += 64u) { OUT[dst + c] = X[src + c]; }
}

@compute @workgroup_size(64)
fn select_rows_cpu(ids: Launch) {
    let i = thread_idx(ids, 64u);
    let inner = pu(3u);
    let nch = (inner + CHUNK - 1u) / CHUNK;
    let row = i / nch;
    if (row * inner >= pu(0u)) { return; }
    let K = pu(2u);
    let A = pu(1u);
    let a = fwd_index(IDX[pu(5u) + row % K], A);
    let c0 = (i % nch) * CHUNK;
    let c1 = min(inner, c0 + CHUNK);
    let src = pu(4u) + ((row / K) * A + a) * inner;
    let dst = row * inner;
    for (var c = c0; c < c1; c++) { OUT[dst + c] = X[src + c]; }
}

var<workgroup> scan: array<u32, 256>;
var<workgroup> hits: array<u32, 256>;

@compute @workgroup_size(256)
fn select_bwd(ids: Launch) {
    let row = group_idx(ids);
    if (row >= pu(0u)) { return; }  // uniform per workgroup
    let A = pu(1u);
    let K = pu(2u);
    let inner = pu(3u);
    let a = row % A;
    let o = row / A;
    let gbase = pu(4u) + o * K * inner;
    let dbase = row * inner;
    if (pu(8u) == 0u) {
        for (var c = ids.lid; c < inner; c += 256u) { OUT[dbase + c] = {{T}}(0); }
    }
    let kend = pu(7u);
    for (var k0 = pu(6u); k0 < kend; k0 += 256u) {
        let k = k0 + ids.lid;
        var f = 0u;
        if (k < kend) { f = select(0u, 1u, norm_index(IDX[pu(5u) + k], A) == a); }
        scan[ids.lid] = f;
        workgroupBarrier();
        for (var s = 1u; s < 256u; s <<= 1u) {
            var v = scan[ids.lid];
            if (ids.lid >= s) { v += scan[ids.lid - s]; }
            workgroupBarrier();
            scan[ids.lid] = v;
            workgroupBarrier();
        }
        if (f == 1u) { hits[scan[ids.lid] - 1u] = k; }
        let n = workgroupUniformLoad(&scan[255]);
        for (var h = 0u; h < n; h++) {
            let kk = hits[h];
            for (var c = ids.lid; c < inner; c += 256u) {
                OUT[dbase + c] += X[gbase + kk * inner + c];
            }
        }
        workgroupBarrier();
    }
}

const CHUNK: u32 = 32u;

@compute @workgroup_size(64)
fn select_bwd_rows(ids: Launch) {
    let i = thread_idx(ids, 64u);
    let inner = pu(3u);
    let nch = (inner + CHUNK - 1u) / CHUNK;
    if (i >= pu(0u) * nch) { return; }
    let A = pu(1u);
    let K = pu(2u);
    let row = i / nch;
    let c0 = (i % nch) * CHUNK;
    let c1 = min(inner, c0 + CHUNK);
    let a = row % A;
    let gbase = pu(4u) + (row / A) * K * inner;
    let dbase = row * inner;
    if (pu(8u) == 0u) {
        for (var c = c0; c < c1; c++) { OUT[dbase + c] = {{T}}(0); }
    }
    for (var k = pu(6u); k < pu(7u); k++) {
        if (norm_index(IDX[pu(5u) + k], A) == a) {
            for (var c = c0; c < c1; c++) { OUT[dbase + c] += X[gbase + k * inner + c]; }
        }
    }
}

@compute @workgroup_size(256)
fn gather_fwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    OUT[i] = pick(i, i);
}

@compute @workgroup_size(256)
fn gather_bwd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u)) { return; }
    let A = pu(1u);
    let J = pu(2u);
    let inner = pu(3u);
    let col = i % inner;
    let a = (i / inner) % A;
    let o = i / (inner * A);
    var acc = {{T}}(0);
    if (pu(8u) != 0u) { acc = OUT[i]; }
    for (var j = pu(6u); j < pu(7u); j++) {
        let e = (o * J + j) * inner + col;
        if (norm_index(IDX[pu(5u) + e], A) == a) { acc += X[pu(4u) + e]; }
    }
    OUT[i] = acc;
}
