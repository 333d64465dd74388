// Row softmax / log_softmax of a contiguous [R, L] block. fwd / bwd: one workgroup per row
// (rows spread over (x, y) workgroups past 65535); fwd_rows / bwd_rows: one invocation per row,
// no barriers (CPU adapters, where workgroup barriers are expensive). Forward: one online pass
// for (max, sum of exp), one pass to write. Backward: one pass for the row dot product, one
// pass to write.
// Defines: WG (workgroup size, a power of two), LOG (true for log_softmax).
// The input is scaled by `scale` first, and with Tq > 0 a causal mask is applied: row r is
// query (r % Tq) of Tq queries against the L keys (aligned at the end, as in PyTorch's
// is_causal), so keys j > r % Tq + L - Tq are masked (softmax 0, log_softmax -inf).
// fwd words: 0 R, 1 L, 2 x offset, 3 y offset, 4 scale, 5 Tq (0: no mask).
// bwd words: 0 R, 1 L, 2 y offset, 3 g offset, 4 dx offset, 5 scale, 6 Tq.
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
// backward: Y (saved output) at 1, DX at 2, G at 3 (each binding number has one access mode
// in every entry point, so the device can build an explicit layout and cache bind groups)
@group(0) @binding(1) var<storage, read> YS: array<f32>;
@group(0) @binding(2) var<storage, read_write> DX: array<f32>;
@group(0) @binding(3) var<storage, read> G: array<f32>;

const WG: u32 = {{WG}}u;
const LOG: bool = {{LOG}};

var<workgroup> sm: array<f32, WG>;
var<workgroup> ss: array<f32, WG>;

// Workgroup reduction of each invocation's v: (max, sum exp) pairs merged (lse) or, without lse,
// the sums v.y added; call in uniform control flow.
fn wg_reduce(v: vec2<f32>, lid: u32, lse: bool) -> vec2<f32> {
    sm[lid] = v.x;
    ss[lid] = v.y;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k && lse) {
            let m = lse_merge(vec2<f32>(sm[lid], ss[lid]), vec2<f32>(sm[lid + k], ss[lid + k]));
            sm[lid] = m.x;
            ss[lid] = m.y;
        } else if (lid < k) {
            ss[lid] += ss[lid + k];
        }
        workgroupBarrier();
    }
    return vec2<f32>(sm[0], ss[0]);
}

// The loops of one row, shared by both layouts: this invocation handles columns j0, j0 + dj, ...
// fwd: online (max, sum exp(x - max)) of the K unmasked scaled inputs.
fn fwd_stats(xb: u32, K: u32, sc: f32, j0: u32, dj: u32) -> vec2<f32> {
    var ms = vec2<f32>(LOWEST_F32, 0.0);
    for (var j = j0; j < K; j += dj) { ms = lse_push(ms, X[xb + j] * sc); }
    return ms;
}

fn fwd_write(xb: u32, yb: u32, K: u32, L: u32, sc: f32, ms: vec2<f32>, j0: u32, dj: u32) {
    if (LOG) {
        let ls = log(ms.y);  // (x - max) - log(sum): exact at large offsets, unlike x - lse
        for (var j = j0; j < K; j += dj) { Y[yb + j] = (X[xb + j] * sc - ms.x) - ls; }
        for (var j = K + j0; j < L; j += dj) { Y[yb + j] = bitcast<f32>(0xff800000u); }
    } else {
        let inv = 1.0 / ms.y;
        for (var j = j0; j < K; j += dj) { Y[yb + j] = exp(X[xb + j] * sc - ms.x) * inv; }
        for (var j = K + j0; j < L; j += dj) { Y[yb + j] = 0.0; }
    }
}

// bwd: softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g)
fn bwd_dot(yb: u32, gb: u32, K: u32, j0: u32, dj: u32) -> f32 {
    var acc = 0.0;
    for (var j = j0; j < K; j += dj) {
        if (LOG) { acc += G[gb + j]; } else { acc += G[gb + j] * YS[yb + j]; }
    }
    return acc;
}

fn bwd_write(yb: u32, gb: u32, db: u32, K: u32, L: u32, sc: f32, dot: f32, j0: u32, dj: u32) {
    for (var j = j0; j < K; j += dj) {
        let y = YS[yb + j];
        if (LOG) {
            DX[db + j] = sc * (G[gb + j] - exp(y) * dot);
        } else {
            DX[db + j] = sc * y * (G[gb + j] - dot);
        }
    }
    for (var j = K + j0; j < L; j += dj) { DX[db + j] = 0.0; }
}

@compute @workgroup_size(WG)
fn fwd(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }  // uniform per workgroup
    let L = pu(1u);
    let K = keys(r, L, pu(5u));
    let ms = wg_reduce(fwd_stats(pu(2u) + r * L, K, pf(4u), ids.lid, WG), ids.lid, true);
    fwd_write(pu(2u) + r * L, pu(3u) + r * L, K, L, pf(4u), ms, ids.lid, WG);
}

@compute @workgroup_size(WG)
fn bwd(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let K = keys(r, L, pu(6u));
    let part = bwd_dot(pu(2u) + r * L, pu(3u) + r * L, K, ids.lid, WG);
    let dot = wg_reduce(vec2<f32>(0.0, part), ids.lid, false).y;
    bwd_write(pu(2u) + r * L, pu(3u) + r * L, pu(4u) + r * L, K, L, pf(5u), dot, ids.lid, WG);
}

@compute @workgroup_size(64)
fn fwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let K = keys(r, L, pu(5u));
    let ms = fwd_stats(pu(2u) + r * L, K, pf(4u), 0u, 1u);
    fwd_write(pu(2u) + r * L, pu(3u) + r * L, K, L, pf(4u), ms, 0u, 1u);
}

@compute @workgroup_size(64)
fn bwd_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let K = keys(r, L, pu(6u));
    let dot = bwd_dot(pu(2u) + r * L, pu(3u) + r * L, K, 0u, 1u);
    bwd_write(pu(2u) + r * L, pu(3u) + r * L, pu(4u) + r * L, K, L, pf(5u), dot, 0u, 1u);
}
