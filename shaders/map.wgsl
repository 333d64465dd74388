// Elementwise map over up to three strided inputs into a (possibly strided) output.
// Python generates the declarations and the body: see wgrumus/ops/launch.py.
// Words: 0 n, 1 ndim, 2..9 shape, operand k (0 = output) strides at 10+9k, offset at 18+9k,
// scalars from 48.
{{DECLS}}

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = linear_id(wid, nwg, lid, 256u);
    if (i >= pu(0u)) { return; }
{{BODY}}
}
