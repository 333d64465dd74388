// Multi-tensor Adam / AdamW: one dispatch updates up to K parameters (each with its gradient
// and exp_avg / exp_avg_sq state buffers, bound at 1 + 4k .. 4 + 4k) over their concatenated
// element range, so an optimizer step costs ceil(params / K) dispatches instead of one per
// parameter. Formulas as in optim.wgsl (torch.optim's single-tensor Adam / AdamW).
// Words: 0 lr, 1 beta1, 2 beta2, 3 eps, 4 weight_decay, 5 decoupled (0 Adam L2, 1 AdamW);
// parameter k at 8 + 7k: end of its range (cumulative element count), param offset,
// grad offset, exp_avg offset, exp_avg_sq offset, step_size = lr / (1 - beta1^t),
// sqrt(1 - beta2^t). Python generates the declarations and the per-parameter branches, which
// read parameter k's words through part_(k) and end_(k). AMP (wgrumus/optim/skip.py): the
// optimizer's device step counts bound after the parameters; skip_() reads its skip flag and
// coef_(w) the step size and sqrt(1 - beta2^t) of the slot in word w + 5.
{{DECLS}}
{{AMP}}

struct Part { p: u32, g: u32, m: u32, v: u32, step_size: f32, bc2_sqrt: f32 }
fn end_(k: u32) -> u32 { return pu(8u + 7u * k); }
fn part_(k: u32) -> Part {
    let w = 8u + 7u * k;
    let c = coef_(w);
    return Part(pu(w + 1u), pu(w + 2u), pu(w + 3u), pu(w + 4u), c.x, c.y);
}

// (p, exp_avg, exp_avg_sq) after one step, of one element (AT f32) or of a quad of them (AT
// vec4<f32>: entry `cpu` with VEC 4, every storage access a vec4).
struct Upd { p: {{AT}}, m: {{AT}}, v: {{AT}} }
fn adam_(p0: {{AT}}, g0: {{AT}}, m0: {{AT}}, v0: {{AT}}, step_size: f32, bc2_sqrt: f32) -> Upd {
    var p = p0;
    var g = g0;
    let wd = pf(4u);
    if (pu(5u) != 0u) { p = p * (1.0 - pf(0u) * wd); } else { g = g + wd * p; }
    let b1 = pf(1u);
    let b2 = pf(2u);
    let m = m0 + (1.0 - b1) * (g - m0);
    let v = b2 * v0 + (1.0 - b2) * g * g;
    let denom = sqrt(v) / bc2_sqrt + pf(3u);
    return Upd(p - step_size * (m / denom), m, v);
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (skip_()) { return; }
{{BODY}}
}

// Entry `cpu`, for CPU adapters (lavapipe/llvmpipe, whose workgroup invocations are the SIMD
// lanes of one thread): each invocation updates CHUNK consecutive elements of one parameter, so
// the per-parameter branch and its words are read once per chunk instead of once per element.
// Parameter k occupies [start_k, end_k) of the launch's index space, start_0 = 0 and start_k =
// end_{k-1} rounded up to CHUNK, so no chunk spans two parameters (the ends in the words are
// in that space). Python generates CPU_BODY (empty in the `main` kernel, as BODY is in `cpu`).
// VEC 4 (every parameter's size and offsets multiples of 4): the index space, offsets and ends
// count quads, the arrays are of vec4 (llvmpipe pays its per-lane loop over a storage access
// once per quad instead of once per element).
const CHUNK: u32 = {{CHUNK}}u;

fn start_(end_prev: u32) -> u32 { return (end_prev + CHUNK - 1u) / CHUNK * CHUNK; }

@compute @workgroup_size({{CPU_WG}})
fn cpu(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let c0 = linear_id(wid, nwg, lid, {{CPU_WG}}u) * CHUNK;
    if (skip_()) { return; }
{{CPU_BODY}}
}
