// Layer normalisation backward for CPU adapters whose subgroups are the SIMD lanes of one
// thread (llvmpipe): shaders/layernorm.wgsl's bwd_rowc (one invocation a row, the row read
// from storage once into private arrays) plus the weight and bias gradients' column sums over
// each subgroup's rows (subgroupAdd: a vector reduction on llvmpipe, no barrier), stored as
// PARTS [2, ceil(R / subgroup size), L] for shaders/colsum.wgsl. This replaces the `wb` pass
// over X and G. A file of its own: subgroup operations need the adapter's subgroup feature.
// Rows past R recompute row R - 1 and add nothing (every lane takes part in the sums); the
// subgroups are consecutive invocations (rows). Rows of at most ROWC elements.
// words: 0 R, 1 L, 2 x off, 3 g off, 4 w off, 5 has weight, 6 dx off, 7 parts off
@group(0) @binding(1) var<storage, read> X: array<f32>;
@group(0) @binding(2) var<storage, read> G: array<f32>;
@group(0) @binding(3) var<storage, read> WB: array<f32>;
@group(0) @binding(4) var<storage, read_write> DX: array<f32>;
@group(0) @binding(5) var<storage, read> MEAN: array<f32>;
@group(0) @binding(6) var<storage, read> RSTD: array<f32>;
@group(0) @binding(7) var<storage, read_write> PARTS: array<f32>;

@compute @workgroup_size(64)
fn bwd_wb_rowc(ids: Launch, @builtin(subgroup_invocation_id) lane: u32,
               @builtin(subgroup_size) sg: u32) {
    let r0 = thread_idx(ids, 64u);
    let R = pu(0u);
    let live = r0 < R;
    let r = min(r0, R - 1u);
    let L = pu(1u);
    let xb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let mean = MEAN[r];
    let rstd = RSTD[r];
    let c = r0 / sg;
    let nc = (R + sg - 1u) / sg;
    let pb = pu(7u);
    var xh: array<f32, ROWC>;
    var gw: array<f32, ROWC>;
    var t = vec2<f32>(0.0);
    for (var j = 0u; j < L; j++) {
        let g = G[gb + j];
        let h = (X[xb + j] - mean) * rstd;
        var w = g;
        if (pu(5u) != 0u) { w *= WB[pu(4u) + j]; }
        xh[j] = h;
        gw[j] = w;
        t += vec2<f32>(w, w * h);
        let p = subgroupAdd(select(vec2<f32>(0.0), vec2<f32>(g * h, g), live));
        if (lane == 0u && c < nc) {
            PARTS[pb + c * L + j] = p.x;
            PARTS[pb + (nc + c) * L + j] = p.y;
        }
    }
    t /= f32(L);
    if (!live) { return; }
    let db = pu(6u) + r * L;
    for (var j = 0u; j < L; j++) { DX[db + j] = rstd * (gw[j] - t.x - xh[j] * t.y); }
}
