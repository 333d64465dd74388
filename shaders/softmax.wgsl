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
const LOWEST: f32 = -3.4028234663852886e38;

// Number of unmasked keys of row r (L without a mask).
fn keys(r: u32, L: u32, tq: u32) -> u32 {
    if (tq == 0u) { return L; }
    return u32(clamp(i32(r % tq) + i32(L) - i32(tq) + 1, 0, i32(L)));
}

var<workgroup> sm: array<f32, WG>;
var<workgroup> ss: array<f32, WG>;

@compute @workgroup_size(WG)
fn fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if (r >= pu(0u)) { return; }  // uniform per workgroup
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let sc = pf(4u);
    let K = keys(r, L, pu(5u));
    // online (max, sum exp(x - max)); -inf entries (masks) contribute exp(-inf) = 0
    var m = LOWEST;
    var s = 0.0;
    for (var j = lid; j < K; j += WG) {
        let v = X[xb + j] * sc;
        if (v > m) { s = s * exp(m - v) + 1.0; m = v; } else { s += exp(v - m); }
    }
    sm[lid] = m;
    ss[lid] = s;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            let m1 = sm[lid];
            let m2 = sm[lid + k];
            let mm = max(m1, m2);
            ss[lid] = ss[lid] * exp(m1 - mm) + ss[lid + k] * exp(m2 - mm);
            sm[lid] = mm;
        }
        workgroupBarrier();
    }
    let mx = sm[0];
    let tot = ss[0];
    let yb = pu(3u) + r * L;
    if (LOG) {
        let lse = mx + log(tot);
        for (var j = lid; j < K; j += WG) { Y[yb + j] = X[xb + j] * sc - lse; }
        for (var j = K + lid; j < L; j += WG) { Y[yb + j] = bitcast<f32>(0xff800000u); }
    } else {
        let inv = 1.0 / tot;
        for (var j = lid; j < K; j += WG) { Y[yb + j] = exp(X[xb + j] * sc - mx) * inv; }
        for (var j = K + lid; j < L; j += WG) { Y[yb + j] = 0.0; }
    }
}

@compute @workgroup_size(WG)
fn bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let yb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let sc = pf(5u);
    let K = keys(r, L, pu(6u));
    // softmax: dx = y * (g - sum(g * y)); log_softmax: dx = g - exp(y) * sum(g)
    var acc = 0.0;
    for (var j = lid; j < K; j += WG) {
        if (LOG) { acc += G[gb + j]; } else { acc += G[gb + j] * YS[yb + j]; }
    }
    ss[lid] = acc;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) { ss[lid] += ss[lid + k]; }
        workgroupBarrier();
    }
    let dot = ss[0];
    let db = pu(4u) + r * L;
    for (var j = lid; j < K; j += WG) {
        let y = YS[yb + j];
        if (LOG) {
            DX[db + j] = sc * (G[gb + j] - exp(y) * dot);
        } else {
            DX[db + j] = sc * y * (G[gb + j] - dot);
        }
    }
    for (var j = K + lid; j < L; j += WG) { DX[db + j] = 0.0; }
}

@compute @workgroup_size(64)
fn fwd_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let r = linear_id(wid, nwg, lid, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let sc = pf(4u);
    let K = keys(r, L, pu(5u));
    var m = LOWEST;
    var s = 0.0;
    for (var j = 0u; j < K; j++) {
        let v = X[xb + j] * sc;
        if (v > m) { s = s * exp(m - v) + 1.0; m = v; } else { s += exp(v - m); }
    }
    let yb = pu(3u) + r * L;
    if (LOG) {
        let lse = m + log(s);
        for (var j = 0u; j < K; j++) { Y[yb + j] = X[xb + j] * sc - lse; }
        for (var j = K; j < L; j++) { Y[yb + j] = bitcast<f32>(0xff800000u); }
    } else {
        let inv = 1.0 / s;
        for (var j = 0u; j < K; j++) { Y[yb + j] = exp(X[xb + j] * sc - m) * inv; }
        for (var j = K; j < L; j++) { Y[yb + j] = 0.0; }
    }
}

@compute @workgroup_size(64)
fn bwd_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let r = linear_id(wid, nwg, lid, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let yb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let sc = pf(5u);
    let K = keys(r, L, pu(6u));
    var dot = 0.0;
    for (var j = 0u; j < K; j++) {
        if (LOG) { dot += G[gb + j]; } else { dot += G[gb + j] * YS[yb + j]; }
    }
    let db = pu(4u) + r * L;
    for (var j = 0u; j < K; j++) {
        let y = YS[yb + j];
        if (LOG) {
            DX[db + j] = sc * (G[gb + j] - exp(y) * dot);
        } else {
            DX[db + j] = sc * y * (G[gb + j] - dot);
        }
    }
    for (var j = K; j < L; j++) { DX[db + j] = 0.0; }
}
