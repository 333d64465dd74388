// Backward of a Linear layer's fused epilogue y = act(u + bias) over a contiguous [R, L] block
// (R rows, L = out features): one kernel computes dz = g * act'(u + bias) and, in the same
// pass, partial column sums of dz over chunks of rows (the bias gradient), so the bias needs
// no transposed copy and no separate reduction. Invocation (j, c) walks the rows of chunk c
// down column j: neighbouring invocations read neighbouring columns (coalesced).
// bwd words: 0 R, 1 L, 2 g offset, 3 u offset, 4 bias offset, 5 rows per chunk, 6 chunks,
// 7 has bias (0/1), 8 write dz (0/1).
// Defines: ACT_GRAD, an expression of g and z (the pre-activation) giving dz; V 1 (VT f32) or,
// on CPU adapters where L and every offset are multiples of 4, V 4 (VT vec4<f32>): an
// invocation walks a quad of columns, each access one vec4 (llvmpipe pays its per-lane loop
// over a storage access once per quad instead of once per element), ACT_GRAD_V applying
// ACT_GRAD to each component; WG invocations a group.
// IN_DECLS: G (binding 1) and U (2) with their loads ld_G / ld_U (ops/texread.py): storage
// arrays of VT, or (CPU adapters, V 4) textures holding copies of them (offset words 0).
{{IN_DECLS}}
@group(0) @binding(3) var<storage, read> BIAS: array<{{VT}}>;
@group(0) @binding(4) var<storage, read_write> DZ: array<{{VT}}>;
@group(0) @binding(5) var<storage, read_write> PART: array<{{VT}}>;

const V: u32 = {{V}}u;

fn act_grad(g: f32, z: f32) -> f32 { return {{ACT_GRAD}}; }
fn act_grad_v(g: {{VT}}, z: {{VT}}) -> {{VT}} { return {{ACT_GRAD_V}}; }

@compute @workgroup_size({{WG}})
fn bwd(@builtin(global_invocation_id) gid: vec3<u32>) {
    let L = pu(1u) / V;
    let j = gid.x;
    let c = gid.y;
    if (j >= L) { return; }
    let R = pu(0u);
    let r0 = c * pu(5u);
    let r1 = min(R, r0 + pu(5u));
    var b = {{VT}}(0.0);
    if (pu(7u) != 0u) { b = BIAS[pu(4u) / V + j]; }
    let wdz = pu(8u) != 0u;
    var s = {{VT}}(0.0);
    for (var r = r0; r < r1; r++) {
        let k = r * L + j;
        let dz = act_grad_v(ld_G(pu(2u) / V + k), ld_U(pu(3u) / V + k) + b);
        if (wdz) { DZ[k] = dz; }
        s += dz;
    }
    PART[c * L + j] = s;
}
