// Reductions of a contiguous [R, L] block (row r at IN[off + r * L]).
// main / arg: one workgroup of 256 per (row, chunk): row r is cut into NC chunks of CL elements,
// so no invocation loops more than CL / 256 times (llvmpipe stops a loop after 65,535
// iterations per invocation); the NC partials of a row are reduced again by another launch.
// Work units are spread over (x, y) workgroups past 65535.
// rows / arg_rows: one invocation per row, for short rows (L bounded by the caller).
// Words: 0 units (R * NC), 1 L, 2 input offset, 3 output scale (mean), 4 output offset,
// 5 init (bits of an A value), 6 CL, 7 NC, 8 arg: candidate indices come from IX, 9 IX offset,
// 10 VOUT offset.
// Defines: T (storage type), A (arithmetic type: f32 or i32), TO (output type), INIT (A
// expression), COMBINE(x, y) as an A expression, FIN(v) the output expression, GT (">" argmax,
// "<" argmin), ISNAN(x) (a bool expression; "false" for integers).
@group(0) @binding(1) var<storage, read> IN: array<{{T}}>;
@group(0) @binding(2) var<storage, read_write> OUT: array<{{TO}}>;
// arg only: indices of the candidates (second pass) and the winning values (first pass)
@group(0) @binding(3) var<storage, read> IX: array<i32>;
@group(0) @binding(4) var<storage, read_write> VOUT: array<{{T}}>;

var<workgroup> sv: array<{{A}}, 256>;
var<workgroup> si: array<u32, 256>;

fn isnan_a(x: {{A}}) -> bool { return {{ISNAN}}; }
fn combine(x: {{A}}, y: {{A}}) -> {{A}} { return {{COMBINE}}; }
fn fin(v: {{A}}) -> {{TO}} { return {{FIN}}; }

// [lo, hi) of work unit u = (row, chunk) and the row's base in IN.
fn unit_range(u: u32) -> vec3<u32> {
    let L = pu(1u);
    let nc = pu(7u);
    let r = u / nc;
    let lo = (u % nc) * pu(6u);
    return vec3<u32>(pu(2u) + r * L, lo, min(L, lo + pu(6u)));
}

@compute @workgroup_size(256)
fn main(ids: Launch) {
    let u = group_idx(ids);
    if (u >= pu(0u)) { return; }  // uniform per workgroup
    let rg = unit_range(u);
    var acc: {{A}} = {{INIT}};
    for (var j = rg.y + ids.lid; j < rg.z; j += 256u) {
        acc = combine(acc, {{A}}(IN[rg.x + j]));
    }
    sv[ids.lid] = acc;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (ids.lid < s) { sv[ids.lid] = combine(sv[ids.lid], sv[ids.lid + s]); }
        workgroupBarrier();
    }
    if (ids.lid == 0u) { OUT[pu(4u) + u] = fin(sv[0]); }
}

@compute @workgroup_size(64)
fn rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var acc: {{A}} = {{INIT}};
    for (var j = 0u; j < L; j++) { acc = combine(acc, {{A}}(IN[base + j])); }
    OUT[pu(4u) + r] = fin(acc);
}

const NONE: u32 = 0xffffffffu;

// Does value v at index i beat (bv, bi)? NaN beats every number (PyTorch's argmax / argmin
// return the first NaN); ties go to the lower index.
fn better(v: {{A}}, i: u32, bv: {{A}}, bi: u32) -> bool {
    if (i == NONE) { return false; }
    if (bi == NONE) { return true; }
    let nv = isnan_a(v);
    let nb = isnan_a(bv);
    if (nv || nb) { return nv && (!nb || i < bi); }
    return v {{GT}} bv || (v == bv && i < bi);
}

// Candidate index of element j of row base..: j itself, or (second pass) the index saved by
// the first pass.
fn cand(base: u32, j: u32) -> u32 {
    if (pu(8u) != 0u) { return u32(IX[pu(9u) + base - pu(2u) + j]); }
    return j;
}

@compute @workgroup_size(256)
fn arg(ids: Launch) {
    let u = group_idx(ids);
    if (u >= pu(0u)) { return; }
    let rg = unit_range(u);
    var best: {{A}} = {{INIT}};
    var bi: u32 = NONE;
    for (var j = rg.y + ids.lid; j < rg.z; j += 256u) {
        let v = {{A}}(IN[rg.x + j]);
        let i = cand(rg.x, j);
        if (better(v, i, best, bi)) { best = v; bi = i; }
    }
    sv[ids.lid] = best;
    si[ids.lid] = bi;
    workgroupBarrier();
    for (var s = 128u; s > 0u; s >>= 1u) {
        if (ids.lid < s && better(sv[ids.lid + s], si[ids.lid + s], sv[ids.lid], si[ids.lid])) {
            sv[ids.lid] = sv[ids.lid + s];
            si[ids.lid] = si[ids.lid + s];
        }
        workgroupBarrier();
    }
    if (ids.lid == 0u) {
        OUT[pu(4u) + u] = {{TO}}(si[0]);
        VOUT[pu(10u) + u] = {{T}}(sv[0]);
    }
}

@compute @workgroup_size(64)
fn arg_rows(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let base = pu(2u) + r * L;
    var best: {{A}} = {{INIT}};
    var bi: u32 = NONE;
    for (var j = 0u; j < L; j++) {
        let v = {{A}}(IN[base + j]);
        if (better(v, j, best, bi)) { best = v; bi = j; }
    }
    OUT[pu(4u) + r] = {{TO}}(bi);
}
