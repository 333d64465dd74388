// GradScaler's unscale and inf/NaN check over up to K gradients in one dispatch (their
// concatenated element range): U_k = G_k / scale, and FLAG[flag offset] |= 1 and the scaler's
// found word |= 1 where a value is inf or NaN (all exponent bits set: exact, whatever the
// compiler assumes about NaN). The scale is read on the device (the scaler's state, see
// shaders/amp.wgsl: [scale bits, found, ...] at the state offset), so no word changes with it.
// Words: 0 state offset, 1 flag offset; gradient k at 4 + 3k: end of its range (cumulative
// element count), G offset, U offset. Python generates the declarations and the branches
// (G_k at binding 3 + 2k, U_k at 4 + 2k), which read gradient k's words through end_, g_, u_.
@group(0) @binding(1) var<storage, read_write> FLAG: array<atomic<u32>>;
@group(0) @binding(2) var<storage, read_write> STATE: array<atomic<u32>>;
{{DECLS}}

fn end_(k: u32) -> u32 { return pu(4u + 3u * k); }
fn g_(k: u32) -> u32 { return pu(5u + 3u * k); }
fn u_(k: u32) -> u32 { return pu(6u + 3u * k); }

fn unscale_(g: f32, inv_scale: f32) -> f32 {
    if ((bitcast<u32>(g) & 0x7f800000u) == 0x7f800000u) {
        atomicOr(&FLAG[pu(1u)], 1u);
        atomicOr(&STATE[pu(0u) + 1u], 1u);
    }
    return g * inv_scale;
}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    let inv_scale = 1.0 / bitcast<f32>(atomicLoad(&STATE[pu(0u)]));
{{BODY}}
}
