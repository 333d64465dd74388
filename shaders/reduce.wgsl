// Row reductions of a contiguous [R, L] block (row r at IN[off + r * L]) into OUT[r].
// One workgroup of 256 per row; rows are spread over (x, y) workgroups past 65535.
// Words: 0 R, 1 L, 2 input offset, 3 output scale (mean), 4 output offset.
// Defines: T (storage type), INIT, COMBINE(x, y) as an expression of x and y.
@group(0) @binding(1) var<storage, read> IN: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> OUT: array<{{TO}}>;

var<workgroup> sv: array<f32, 256>;
var<workgroup> si: array<u32, 256>;

fn combine(x: f32, y: f32) -> f32 { return {{COMBINE}}; }

@compute @workgroup_size(256)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    let R = pu(0u);
    if (r >= R) { return; }  // uniform per workgroup
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var acc: f32 = {{INIT}};
    for (var j = lid; j < L; j += 256u) {
        acc = combine(acc, f32(IN[base + j]));
    }
    sv[lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) { sv[lid] = combine(sv[lid], sv[lid + s]); }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[pu(4u) + r] = {{TO}}(sv[0] * pf(3u)); }
}

// Index of the max (GT = ">") or min ("<") of each row; ties resolve to the first index.
@compute @workgroup_size(256)
fn arg(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
       @builtin(local_invocation_index) lid: u32) {
    let r = wid.y * nwg.x + wid.x;
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var best: f32 = {{INIT}};
    var bi: u32 = 0xffffffffu;
    for (var j = lid; j < L; j += 256u) {
        let v = f32(IN[base + j]);
        if (v {{GT}} best || bi == 0xffffffffu) { best = v; bi = j; }
    }
    sv[lid] = best;
    si[lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (lid < s) {
            let v = sv[lid + s];
            let i = si[lid + s];
            if (i != 0xffffffffu && (si[lid] == 0xffffffffu || v {{GT}} sv[lid]
                                     || (v == sv[lid] && i < si[lid]))) {
                sv[lid] = v;
                si[lid] = i;
            }
        }
        workgroupBarrier();
    }
    if (lid == 0u) { OUT[pu(4u) + r] = {{TO}}(si[0]); }
}
