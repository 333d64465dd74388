// The device-side bookkeeping of a capturable GradScaler (wgrumus/amp.py) and of optimizer
// steps it may skip (wgrumus/optim/skip.py): nothing is read back to the host, so a wr.jit
// capture replays a whole mixed-precision step.
@group(0) @binding(1) var<storage, read_write> A: array<u32>;
@group(0) @binding(2) var<storage, read_write> B: array<u32>;

fn finite_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7f800000u) != 0x7f800000u; }

// Entry `update`: the scaler's state A = [scale (f32 bits), found inf/NaN since the last
// update, growth tracker, skipped steps]. Words: 0 growth factor, 1 backoff factor,
// 2 growth interval, 3 mode (0 dynamic, 1 set the scale to word 4), 4 new scale.
@compute @workgroup_size(1)
fn update() {
    var scale = bitcast<f32>(A[0]);
    var tracker = A[2];
    if (pu(3u) == 1u) {
        scale = pf(4u);
        tracker = 0u;
    } else if (A[1] != 0u) {
        scale = scale * pf(1u);
        tracker = 0u;
        A[3] = A[3] + 1u;
    } else {
        tracker = tracker + 1u;
        if (tracker == pu(2u)) {
            let grown = scale * pf(0u);
            if (finite_(grown)) { scale = grown; }
            tracker = 0u;
        }
    }
    A[0] = bitcast<u32>(scale);
    A[1] = 0u;
    A[2] = tracker;
}

// 1 - exp(x) for x <= 0 (x = t ln(beta)) without the cancellation of 1 - exp(x) near 0.
fn one_minus_exp_(x: f32) -> f32 {
    if (x > -0.5) {  // -expm1(x) by its series to x^9 (truncation < 3e-9 relative)
        var s = 1.0 / 362880.0;
        s = s * x + 1.0 / 40320.0;
        s = s * x + 1.0 / 5040.0;
        s = s * x + 1.0 / 720.0;
        s = s * x + 1.0 / 120.0;
        s = s * x + 1.0 / 24.0;
        s = s * x + 1.0 / 6.0;
        s = s * x + 0.5;
        s = s * x + 1.0;
        return -(s * x);
    }
    return 1.0 - exp(x);
}

// Entry `steps`: Adam's step counts of parameters [word 1, word 1 + word 2) of one optimizer
// on one device, B = [skip, then per parameter k at 1 + 3k: step, 1 / (1 - beta1^step),
// sqrt(1 - beta2^step) (f32 bits)]. Copies the optimizer's inf/NaN flag A[word 0] to B[0] (the
// update kernels skip on it) and, unless it is set, advances each count and its bias
// corrections. Words: 3 ln(beta1), 4 ln(beta2).
@compute @workgroup_size(64)
fn steps(@builtin(global_invocation_id) gid: vec3<u32>) {
    let k = gid.x;
    if (k >= pu(2u)) { return; }
    let found = A[pu(0u)];
    if (k == 0u) { B[0] = found; }
    if (found != 0u) { return; }
    let s = 1u + 3u * (pu(1u) + k);
    let t = B[s] + 1u;
    B[s] = t;
    B[s + 1u] = bitcast<u32>(1.0 / one_minus_exp_(f32(t) * pf(3u)));
    B[s + 2u] = bitcast<u32>(sqrt(one_minus_exp_(f32(t) * pf(4u))));
}
