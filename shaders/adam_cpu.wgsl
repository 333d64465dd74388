// Multi-tensor Adam / AdamW for CPU adapters (lavapipe/llvmpipe): the words and formulas of
// adam_multi.wgsl, but each invocation updates a chunk of CHUNK consecutive elements of one
// parameter, so the per-parameter branch and its words are read once per chunk instead of once
// per element. Parameter k's elements occupy [start_k, end_k) of the launch's index space, where
// start_0 = 0 and start_k = end_{k-1} rounded up to CHUNK: no chunk spans two parameters.
// Words as in adam_multi.wgsl (the ends are in that padded index space).
{{DECLS}}

const CHUNK: u32 = {{CHUNK}}u;

fn adam_(p0: f32, g0: f32, m0: f32, v0: f32, step_size: f32, bc2_sqrt: f32) -> vec3<f32> {
    var p = p0;
    var g = g0;
    let wd = pf(4u);
    if (pu(5u) != 0u) { p = p * (1.0 - pf(0u) * wd); } else { g = g + wd * p; }
    let b1 = pf(1u);
    let b2 = pf(2u);
    let m = m0 + (1.0 - b1) * (g - m0);
    let v = b2 * v0 + (1.0 - b2) * g * g;
    let denom = sqrt(v) / bc2_sqrt + pf(3u);
    return vec3<f32>(p - step_size * (m / denom), m, v);
}

fn start_(end_prev: u32) -> u32 { return (end_prev + CHUNK - 1u) / CHUNK * CHUNK; }

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let c0 = linear_id(wid, nwg, lid, {{WG}}u) * CHUNK;
{{BODY}}
}
