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
fn main(ids: Launch) {
    let r = group_idx(ids);
    let R = pu(0u);
    if (r >= R) { return; }  // uniform per workgroup
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var acc: f32 = {{INIT}};
    for (var j = ids.lid; j < L; j += 256u) {
        acc = combine(acc, f32(IN[base + j]));
    }
    sv[ids.lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (ids.lid < s) { sv[ids.lid] = combine(sv[ids.lid], sv[ids.lid + s]); }
        workgroupBarrier();
    }
    if (ids.lid == 0u) { OUT[pu(4u) + r] = {{TO}}(sv[0] * pf(3u)); }
}

// Index of the max (GT = ">") or min ("<") of each row; ties resolve to the first index.
@compute @workgroup_size(256)
fn arg(ids: Launch) {
    let r = group_idx(ids);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var best: f32 = {{INIT}};
    var bi: u32 = 0xffffffffu;
    for (var j = ids.lid; j < L; j += 256u) {
        let v = f32(IN[base + j]);
        if (v {{GT}} best || bi == 0xffffffffu) { best = v; bi = j; }
    }
    sv[ids.lid] = best;
    si[ids.lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (ids.lid < s) {
            let v = sv[ids.lid + s];
            let i = si[ids.lid + s];
            if (i != 0xffffffffu && (si[ids.lid] == 0xffffffffu || v {{GT}} sv[ids.lid]
                                     || (v == sv[ids.lid] && i < si[ids.lid]))) {
                sv[ids.lid] = v;
                si[ids.lid] = i;
            }
        }
        workgroupBarrier();
    }
    if (ids.lid == 0u) { OUT[pu(4u) + r] = {{TO}}(si[0]); }
}
