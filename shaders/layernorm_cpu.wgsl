// Layer normalisation for CPU adapters whose subgroups are the SIMD lanes of one thread
// (llvmpipe), one invocation a row of at most ROWC elements, each row read from storage once
// into private arrays. A file of its own: subgroup operations need the adapter's subgroup
// feature. V 4 (VT vec4<f32>, where L and every offset are multiples of 4): rows walked a
// quad at a time, every storage access one vec4 (llvmpipe reads and writes storage in a loop
// over the lanes with a branch per lane and component: a quad pays the loop once); V 1 (VT
// f32) elsewhere. HSUM(v): the sum of v's components.
// fwd_rowc: as layernorm.wgsl's fwd (bindings X 1, W 2, B 3, Y 4, MEAN 5, RSTD 6; its words).
// bwd_wb_rowc: layernorm.wgsl's bwd_rowc plus the weight and bias gradients' column sums over
// each subgroup's rows (subgroupAdd: a vector reduction on llvmpipe, no barrier), stored as
// PARTS [2, ceil(R / subgroup size), L] for shaders/colsum.wgsl (this replaces the `wb` pass
// over X and G). Rows past R recompute row R - 1 and add nothing (every lane takes part in the
// sums); the subgroups are consecutive invocations (rows).
//   words: 0 R, 1 L, 2 x off, 3 g off, 4 w off, 5 has weight, 6 dx off, 7 parts off
//   bindings: X 1, G 2, WB 3, DX 4, MEAN 5, RSTD 6, PARTS 7
// IN_DECLS: the read-only X 1, W / G 2, B / WB 3 and their loads ld_X, ...: storage arrays of
// VT, or (V 4) textures holding copies of them (ops/texread.py; their offset words 0).
{{IN_DECLS}}
@group(0) @binding(4) var<storage, read_write> Y: array<{{VT}}>;
@group(0) @binding(4) var<storage, read_write> DX: array<{{VT}}>;
@group(0) @binding(5) var<storage, read_write> MEAN: array<f32>;
@group(0) @binding(6) var<storage, read_write> RSTD: array<f32>;
@group(0) @binding(7) var<storage, read_write> PARTS: array<{{VT}}>;

const V: u32 = {{V}}u;
// private row arrays of RN values (a power of two >= L / V, at most ROWC / V: WGSL zero-fills
// them at every invocation, so no longer than the row needs)
const RN: u32 = {{RN}}u;
fn hsum(v: {{VT}}) -> f32 { return {{HSUM}}; }

@compute @workgroup_size(64)
fn fwd_rowc(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let n = L / V;
    let xb = pu(2u) / V + r * n;
    var xs: array<{{VT}}, RN>;
    var s = {{VT}}(0.0);
    for (var j = 0u; j < n; j++) {
        let x = ld_X(xb + j);
        xs[j] = x;
        s += x;
    }
    let mean = hsum(s) / f32(L);
    var q = {{VT}}(0.0);
    for (var j = 0u; j < n; j++) {
        let d = xs[j] - mean;
        q += d * d;
    }
    let rstd = inverseSqrt(hsum(q) / f32(L) + pf(6u));
    let yb = pu(5u) / V + r * n;
    let wb = pu(3u) / V;
    let bb = pu(4u) / V;
    let hw = pu(7u) != 0u;
    let hb = pu(8u) != 0u;
    for (var j = 0u; j < n; j++) {
        var y = (xs[j] - mean) * rstd;
        if (hw) { y *= ld_W(wb + j); }
        if (hb) { y += ld_B(bb + j); }
        Y[yb + j] = y;
    }
    MEAN[r] = mean;
    RSTD[r] = rstd;
}

@compute @workgroup_size(64)
fn bwd_wb_rowc(ids: Launch, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sg: u32) {
    let r0 = thread_idx(ids, 64u);
    let R = pu(0u);
    let live = r0 < R;
    let r = min(r0, R - 1u);
    let L = pu(1u);
    let n = L / V;
    let xb = pu(2u) / V + r * n;
    let gb = pu(3u) / V + r * n;
    let wo = pu(4u) / V;
    let mean = MEAN[r];
    let rstd = RSTD[r];
    let c = r0 / sg;
    let nc = (R + sg - 1u) / sg;
    let pb = pu(7u) / V;
    var xh: array<{{VT}}, RN>;
    var gw: array<{{VT}}, RN>;
    var t1 = {{VT}}(0.0);
    var t2 = {{VT}}(0.0);
    for (var j = 0u; j < n; j++) {
        let g = ld_G(gb + j);
        let h = (ld_X(xb + j) - mean) * rstd;
        var w = g;
        if (pu(5u) != 0u) { w *= ld_WB(wo + j); }
        xh[j] = h;
        gw[j] = w;
        t1 += w;
        t2 += w * h;
        let zero = {{VT}}(0.0);
        let pw = subgroupAdd(select(zero, g * h, live));
        let pbias = subgroupAdd(select(zero, g, live));
        if (lane == 0u && c < nc) {
            PARTS[pb + c * n + j] = pw;
            PARTS[pb + (nc + c) * n + j] = pbias;
        }
    }
    let m1 = hsum(t1) / f32(L);
    let m2 = hsum(t2) / f32(L);
    if (!live) { return; }
    let db = pu(6u) / V + r * n;
    for (var j = 0u; j < n; j++) { DX[db + j] = rstd * (gw[j] - m1 - xh[j] * m2); }
}
