// Fused optimizer updates: one dispatch per parameter reads the gradient and updates the
// parameter and its state buffers in place. Every hyperparameter is a params word, so changing
// the learning rate (schedulers) never recompiles. Formulas are PyTorch's (torch.optim, the
// single-tensor "for-loop" implementations).
// Words: 0 n, 1 param offset, 2 grad offset, 3 state offset (elements; state buffers are
// contiguous tensors of their own, same offset for each), then per entry below.
@group(0) @binding(1) var<storage, read_write> P: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read_write> S0: array<f32>;
// Optional skip on a device flag (GradScaler's inf/NaN check, wgrumus/optim/skip.py): AMP
// declares what sgd_skip_, adam_skip_ and adam_coef_ read (the flag, Adam's device step counts).
{{AMP}}

// SGD. Words: 4 lr, 5 momentum, 6 dampening, 7 weight_decay, 8 nesterov (0/1),
// 9 first step (0/1: the momentum buffer starts as the gradient), 10 (AMP) flag offset.
@compute @workgroup_size(256)
fn sgd(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u) || sgd_skip_()) { return; }
    let ip = pu(1u) + i;
    let p = P[ip];
    var g = G[pu(2u) + i] + pf(7u) * p;
    let mom = pf(5u);
    if (mom != 0.0) {
        let is = pu(3u) + i;
        var buf = g;
        if (pu(9u) == 0u) { buf = mom * S0[is] + (1.0 - pf(6u)) * g; }
        S0[is] = buf;
        if (pu(8u) != 0u) { g = g + mom * buf; } else { g = buf; }
    }
    P[ip] = p - pf(4u) * g;
}

// Adam / AdamW. Words: 4 lr, 5 beta1, 6 beta2, 7 eps, 8 weight_decay, 9 decoupled (0 Adam L2,
// 1 AdamW), 10 step_size = lr / (1 - beta1^t), 11 sqrt(1 - beta2^t) (AMP: 10 the parameter's
// slot among the optimizer's device step counts, which hold both).
@group(0) @binding(4) var<storage, read_write> S1: array<f32>;

@compute @workgroup_size(256)
fn adam(ids: Launch) {
    let i = thread_idx(ids, 256u);
    if (i >= pu(0u) || adam_skip_()) { return; }
    let ip = pu(1u) + i;
    let is = pu(3u) + i;
    var p = P[ip];
    var g = G[pu(2u) + i];
    let wd = pf(8u);
    if (pu(9u) != 0u) { p = p * (1.0 - pf(4u) * wd); } else { g = g + wd * p; }
    let b1 = pf(5u);
    let b2 = pf(6u);
    let m0 = S0[is];
    let m = m0 + (1.0 - b1) * (g - m0);          // exp_avg.lerp_(grad, 1 - beta1)
    let v = b2 * S1[is] + (1.0 - b2) * g * g;     // exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2)
    S0[is] = m;
    S1[is] = v;
    let c = adam_coef_();  // (step_size, sqrt(1 - beta2^t))
    let denom = sqrt(v) / c.y + pf(7u);
    P[ip] = p - c.x * (m / denom);
}
