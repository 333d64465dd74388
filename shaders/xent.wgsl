// Cross-entropy with integer targets over a contiguous [N, C] block of logits, fused with
// log-softmax (PyTorch semantics: ignore_index rows give 0 and are not counted; label smoothing
// eps mixes in the uniform distribution). A target outside [0, C) that is not ignore_index
// gives a NaN loss (a GPU kernel cannot raise; NaN makes the bad label visible).
// fwd (one workgroup per row): LOSS[r], LSE[r] = logsumexp of row r.
//   words: 0 N, 1 C, 2 x off, 3 t off, 4 ignore_index (i32), 5 eps
// fwd_rows: the same with one invocation per row and no barriers (CPU adapters).
// finish (one workgroup): OUT[0] = sum or mean of LOSS over counted rows, OUT[1] = count.
//   words: 0 N, 1 t off, 2 ignore_index, 3 mean (1) or sum (0)
// bwd (one invocation per logit): dx = scale * (softmax - (1 - eps) onehot - eps / C).
//   words: 0 N, 1 C, 2 x off, 3 t off, 4 ignore_index, 5 eps, 6 mode (0 mean, 1 sum, 2 none),
//   7 g off, 8 count off
const WG: u32 = {{WG}}u;
const LOWEST: f32 = -3.4028234663852886e38;

@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> T: array<i32>;
@group(0) @binding(3) var<storage, read_write> LOSS: array<f32>;
@group(0) @binding(4) var<storage, read_write> LSE: array<f32>;
@group(0) @binding(5) var<storage, read> GR: array<f32>;
@group(0) @binding(6) var<storage, read> CNT: array<f32>;

var<workgroup> sm: array<f32, WG>;
var<workgroup> ss: array<f32, WG>;
var<workgroup> sx: array<f32, WG>;

@compute @workgroup_size(WG)
fn fwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    let xb = pu(2u) + r * C;
    var m = LOWEST;
    var s = 0.0;
    var sum = 0.0;
    for (var j = lid; j < C; j += WG) {
        let v = X[xb + j];
        if (v > m) { s = s * exp(m - v) + 1.0; m = v; } else { s += exp(v - m); }
        sum += v;
    }
    sm[lid] = m;
    ss[lid] = s;
    sx[lid] = sum;
    workgroupBarrier();
    for (var k = WG / 2u; k > 0u; k >>= 1u) {
        if (lid < k) {
            let m1 = sm[lid];
            let m2 = sm[lid + k];
            let mm = max(m1, m2);
            ss[lid] = ss[lid] * exp(m1 - mm) + ss[lid + k] * exp(m2 - mm);
            sm[lid] = mm;
            sx[lid] += sx[lid + k];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        let lse = sm[0] + log(ss[0]);
        let t = T[pu(3u) + r];
        let eps = pf(5u);
        var loss = 0.0;
        if (t != pi(4u)) {
            if (t < 0 || u32(t) >= C) {
                loss = bitcast<f32>(0x7fc00000u);
            } else {
                loss = lse - (1.0 - eps) * X[xb + u32(t)] - eps * sx[0] / f32(C);
            }
        }
        LOSS[r] = loss;
        LSE[r] = lse;
    }
}

@compute @workgroup_size(256)
fn finish(@builtin(local_invocation_index) lid: u32) {
    let N = pu(0u);
    var s = 0.0;
    var n = 0.0;
    for (var r = lid; r < N; r += 256u) {
        if (T[pu(1u) + r] != pi(2u)) {
            s += X[r];
            n += 1.0;
        }
    }
    sm[lid] = s;
    ss[lid] = n;
    workgroupBarrier();
    for (var k = 128u; k > 0u; k >>= 1u) {
        if (lid < k) {
            sm[lid] += sm[lid + k];
            ss[lid] += ss[lid + k];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        LOSS[0] = select(sm[0], sm[0] / ss[0], pu(3u) == 1u);
        LOSS[1] = ss[0];
    }
}

@compute @workgroup_size(256)
fn bwd(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
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
        let p = exp(X[pu(2u) + i] - LSE[r]);
        dx = scale * (p - select(0.0, 1.0 - eps, i32(j) == t) - eps / f32(C));
    }
    LOSS[i] = dx;
}

@compute @workgroup_size(64)
fn fwd_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) lid: u32) {
    let r = linear_id(wid, nwg, lid, 64u);
    if (r >= pu(0u)) { return; }
    let C = pu(1u);
    let xb = pu(2u) + r * C;
    var m = LOWEST;
    var s = 0.0;
    var sum = 0.0;
    for (var j = 0u; j < C; j++) {
        let v = X[xb + j];
        if (v > m) { s = s * exp(m - v) + 1.0; m = v; } else { s += exp(v - m); }
        sum += v;
    }
    let lse = m + log(s);
    let t = T[pu(3u) + r];
    let eps = pf(5u);
    var loss = 0.0;
    if (t != pi(4u)) {
        if (t < 0 || u32(t) >= C) {
            loss = bitcast<f32>(0x7fc00000u);
        } else {
            loss = lse - (1.0 - eps) * X[xb + u32(t)] - eps * sum / f32(C);
        }
    }
    LOSS[r] = loss;
    LSE[r] = lse;
}
