// The elementwise map of map.wgsl for CPU adapters (lavapipe/llvmpipe): same words, same
// generated expression, but each invocation maps CHUNK consecutive output elements. A strided
// operand's offset is worked out (one div and mod per dimension) once per chunk and at each
// wrap of the innermost dimension, and otherwise stepped by the innermost stride, so the index
// math of a copy or a transpose is paid once per row instead of per element. Loop back-edges
// per invocation: CHUNK plus ndim per wrap, far below llvmpipe's 65,535.
{{DECLS}}

const CHUNK: u32 = {{CHUNK}}u;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i0 = linear_id(wid, nwg, lid, {{WG}}u) * CHUNK;
    let n = pu(0u);
    if (i0 >= n) { return; }
    let i1 = min(n, i0 + CHUNK);
    let nd = pu(1u);
    let inner = pu(1u + nd);  // the innermost (coalesced) dimension's size
    var j = i0 % inner;
{{SETUP}}
    for (var i = i0; i < i1; i++) {
        if (j == inner) {
            j = 0u;
{{WRAP}}
        }
{{BODY}}
{{STEP}}
        j++;
    }
}

// quads: every operand contiguous f32 and in quads (the inputs read through textures, the
// output stored a quad at a time as B1Q): CHUNK / 4 quads an invocation, the expression
// applied per component (QBODY). llvmpipe pays a storage access per lane and element, vec4 or
// not: a quad store is one access for four elements.
@compute @workgroup_size({{WG}})
fn quads(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) lid: u32) {
    let i0 = linear_id(wid, nwg, lid, {{WG}}u) * CHUNK;
    let n = pu(0u);
    if (i0 >= n) { return; }
    let q1 = min(n, i0 + CHUNK) / 4u;
    let qo = pu(18u) / 4u;
{{QSETUP}}
    for (var q = i0 / 4u; q < q1; q++) {
{{QBODY}}
    }
}
