// Layer normalisation over the last L elements of a contiguous [R, L] block.
// fwd: one workgroup per row; mean and rstd are saved for backward.
//   words: 0 R, 1 L, 2 x off, 3 w off, 4 b off, 5 y off, 6 eps, 7 has weight, 8 has bias
//   (without weight/bias the X buffer is bound in their place and never read).
// bwd: one workgroup per row computes dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)).
//   words: 0 R, 1 L, 2 x off, 3 g off, 4 w off, 5 has weight, 6 dx off
// wb: partial dweight / dbias over chunks of rows, one invocation per (column, chunk).
//   words: 0 R, 1 L, 2 x off, 3 g off, 4 rows per chunk, 5 chunks
// (the chunk partials are then added by shaders/colsum.wgsl)
// fwd_rows / bwd_rows: the same with one invocation per row and no barriers (CPU adapters).
// Define: WG (row workgroup size, power of two).
const WG: u32 = {{WG}}u;

// fwd bindings
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> W: array<f32>;
@group(0) @binding(3) var<storage, read> B: array<f32>;
@group(0) @binding(4) var<storage, read_write> Y: array<f32>;
@group(0) @binding(5) var<storage, read_write> MEAN: array<f32>;
@group(0) @binding(6) var<storage, read_write> RSTD: array<f32>;
// Every binding number has one access mode in all entry points (so the device builds an
// explicit layout with a dynamic parameter offset, and bind groups are cached).
// bwd bindings: X 1, G 2, W 3, DX 4, MEAN 5, RSTD 6 (mean / rstd declared read_write, read)
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read> WB: array<f32>;
@group(0) @binding(4) var<storage, read_write> DX: array<f32>;
// wb bindings: X 1, G 2, (3 unused, X again), PART 4 (rw, [2, chunks, L]), MEAN 5, RSTD 6
@group(0) @binding(4) var<storage, read_write> PART: array<f32>;

var<workgroup> sa: array<f32, WG>;
var<workgroup> sb: array<f32, WG>;

// Sum of (a, b) over the workgroup; call in uniform control flow.
fn wg_sum2(v: vec2<f32>, lid: u32) -> vec2<f32> {
    sa[lid] = v.x;
    sb[lid] = v.y;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            sa[lid] += sa[lid + k];
            sb[lid] += sb[lid + k];
        }
        workgroupBarrier();
    }
    let r = vec2<f32>(sa[0], sb[0]);
    workgroupBarrier();
    return r;
}

// The loops of one row, shared by both layouts: this invocation handles columns j0, j0 + dj, ...
fn row_sum(xb: u32, L: u32, j0: u32, dj: u32) -> f32 {
    var s = 0.0;
    for (var j = j0; j < L; j += dj) { s += X[xb + j]; }
    return s;
}

fn row_sqdev(xb: u32, L: u32, mean: f32, j0: u32, dj: u32) -> f32 {
    var q = 0.0;
    for (var j = j0; j < L; j += dj) { let d = X[xb + j] - mean; q += d * d; }
    return q;
}

fn fwd_write(r: u32, L: u32, xb: u32, mean: f32, rstd: f32, j0: u32, dj: u32) {
    let yb = pu(5u) + r * L;
    let hw = pu(7u) != 0u;
    let hb = pu(8u) != 0u;
    for (var j = j0; j < L; j += dj) {
        var y = (X[xb + j] - mean) * rstd;
        if (hw) { y *= W[pu(3u) + j]; }
        if (hb) { y += B[pu(4u) + j]; }
        Y[yb + j] = y;
    }
}

// Upstream gradient times weight at column j.
fn gw_at(gb: u32, j: u32) -> f32 {
    var gw = G[gb + j];
    if (pu(5u) != 0u) { gw *= WB[pu(4u) + j]; }
    return gw;
}

// bwd: (sum gw, sum gw * xhat) of this invocation's columns.
fn bwd_sums(xb: u32, gb: u32, L: u32, mean: f32, rstd: f32, j0: u32, dj: u32) -> vec2<f32> {
    var s1 = 0.0;
    var s2 = 0.0;
    for (var j = j0; j < L; j += dj) {
        let gw = gw_at(gb, j);
        s1 += gw;
        s2 += gw * (X[xb + j] - mean) * rstd;
    }
    return vec2<f32>(s1, s2);
}

fn bwd_write(r: u32, L: u32, xb: u32, gb: u32, mean: f32, rstd: f32, t: vec2<f32>,
             j0: u32, dj: u32) {
    let db = pu(6u) + r * L;
    for (var j = j0; j < L; j += dj) {
        let xh = (X[xb + j] - mean) * rstd;
        DX[db + j] = rstd * (gw_at(gb, j) - t.x - xh * t.y);
    }
}

@compute @workgroup_size(WG)
fn fwd(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let mean = wg_sum2(vec2<f32>(row_sum(xb, L, ids.lid, WG), 0.0), ids.lid).x / f32(L);
    let q = wg_sum2(vec2<f32>(row_sqdev(xb, L, mean, ids.lid, WG), 0.0), ids.lid).x;
    let rstd = inverseSqrt(q / f32(L) + pf(6u));
    fwd_write(r, L, xb, mean, rstd, ids.lid, WG);
    if (ids.lid == 0u) {
        MEAN[r] = mean;
        RSTD[r] = rstd;
    }
}

@compute @workgroup_size(WG)
fn bwd(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let t = wg_sum2(bwd_sums(xb, gb, L, MEAN[r], RSTD[r], ids.lid, WG), ids.lid) / f32(L);
    bwd_write(r, L, xb, gb, MEAN[r], RSTD[r], t, ids.lid, WG);
}

@compute @workgroup_size(64)
fn wb(@builtin(global_invocation_id) gid: vec3<u32>) {
    let L = pu(1u);
    let j = gid.x;
    let c = gid.y;
    if (j >= L || c >= pu(5u)) { return; }
    let R = pu(0u);
    let r0 = c * pu(4u);
    let r1 = min(R, r0 + pu(4u));
    var dw = 0.0;
    var db = 0.0;
    for (var r = r0; r < r1; r++) {
        let g = G[pu(3u) + r * L + j];
        dw += g * (X[pu(2u) + r * L + j] - MEAN[r]) * RSTD[r];
        db += g;
    }
    PART[c * L + j] = dw;
    PART[(pu(5u) + c) * L + j] = db;
}

@compute @workgroup_size(64)
fn fwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let mean = row_sum(xb, L, 0u, 1u) / f32(L);
    let rstd = inverseSqrt(row_sqdev(xb, L, mean, 0u, 1u) / f32(L) + pf(6u));
    fwd_write(r, L, xb, mean, rstd, 0u, 1u);
    MEAN[r] = mean;
    RSTD[r] = rstd;
}

@compute @workgroup_size(64)
fn bwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let t = bwd_sums(xb, gb, L, MEAN[r], RSTD[r], 0u, 1u) / f32(L);
    bwd_write(r, L, xb, gb, MEAN[r], RSTD[r], t, 0u, 1u);
}

// fwd_rowc / bwd_rowc: the row kernels for rows of at most ROWC elements (CPU adapters), each
// row read from storage once into private arrays. llvmpipe reads a storage value in a loop
// over the SIMD lanes with a branch per lane, while a private array indexed by the loop
// counter (the same in every lane) is one vector load a step; with L <= ROWC the zero-filled
// tail of the arrays is never read.

@compute @workgroup_size(64)
fn fwd_rowc(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    var xs: array<f32, ROWC>;
    var s = 0.0;
    for (var j = 0u; j < L; j++) {
        let x = X[xb + j];
        xs[j] = x;
        s += x;
    }
    let mean = s / f32(L);
    var q = 0.0;
    for (var j = 0u; j < L; j++) {
        let d = xs[j] - mean;
        q += d * d;
    }
    let rstd = inverseSqrt(q / f32(L) + pf(6u));
    let yb = pu(5u) + r * L;
    let hw = pu(7u) != 0u;
    let hb = pu(8u) != 0u;
    for (var j = 0u; j < L; j++) {
        var y = (xs[j] - mean) * rstd;
        if (hw) { y *= W[pu(3u) + j]; }
        if (hb) { y += B[pu(4u) + j]; }
        Y[yb + j] = y;
    }
    MEAN[r] = mean;
    RSTD[r] = rstd;
}

@compute @workgroup_size(64)
fn bwd_rowc(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let mean = MEAN[r];
    let rstd = RSTD[r];
    var xh: array<f32, ROWC>;
    var gw: array<f32, ROWC>;
    var t = vec2<f32>(0.0);
    for (var j = 0u; j < L; j++) {
        let h = (X[xb + j] - mean) * rstd;
        let w = gw_at(gb, j);
        xh[j] = h;
        gw[j] = w;
        t += vec2<f32>(w, w * h);
    }
    t /= f32(L);
    let db = pu(6u) + r * L;
    for (var j = 0u; j < L; j++) { DX[db + j] = rstd * (gw[j] - t.x - xh[j] * t.y); }
}
