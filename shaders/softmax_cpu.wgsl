// Row softmax / log_softmax for CPU adapters (thread row mode, rows of at most ROWC elements):
// entries fwd_rowc / bwd_rowc with softmax.wgsl's words and bindings (X 1 and Y 2; backward YS 1,
// DX 2, G 3), one invocation a row, the row read once into private arrays (on llvmpipe a
// storage read is a loop over the SIMD lanes, a private array indexed by the shared loop
// counter one vector load). IN_DECLS: the inputs and their element loads ex_X, ex_YS, ex_G
// (ops/texread.py): storage arrays, or textures holding copies of them (their offset words
// then the first element's place in the texture, 0-3).
{{IN_DECLS}}
@group(0) @binding(2) var<storage, read_write> Y: array<f32>;
@group(0) @binding(2) var<storage, read_write> DX: array<f32>;

const LOG: bool = {{LOG}};

@compute @workgroup_size(64)
fn fwd_rowc(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let K = keys(r, L, pu(5u));
    let xb = pu(2u) + r * L;
    let yb = pu(3u) + r * L;
    var xs: array<f32, ROWC>;
    var ms = vec2<f32>(LOWEST_F32, 0.0);
    for (var j = 0u; j < K; j++) {
        let x = ex_X(xb + j) * pf(4u);
        xs[j] = x;
        ms = lse_push(ms, x);
    }
    if (LOG) {
        let ls = log(ms.y);  // (x - max) - log(sum): exact at large offsets, unlike x - lse
        for (var j = 0u; j < K; j++) { Y[yb + j] = (xs[j] - ms.x) - ls; }
        for (var j = K; j < L; j++) { Y[yb + j] = bitcast<f32>(0xff800000u); }
    } else {
        let inv = 1.0 / ms.y;
        for (var j = 0u; j < K; j++) { Y[yb + j] = exp(xs[j] - ms.x) * inv; }
        for (var j = K; j < L; j++) { Y[yb + j] = 0.0; }
    }
}

@compute @workgroup_size(64)
fn bwd_rowc(ids: Launch) {
    let r = thread_idx(ids, 64u);
    if (r >= pu(0u)) { return; }
    let L = pu(1u);
    let K = keys(r, L, pu(6u));
    let yb = pu(2u) + r * L;
    let gb = pu(3u) + r * L;
    let db = pu(4u) + r * L;
    let sc = pf(5u);
    var ys: array<f32, ROWC>;
    var gs: array<f32, ROWC>;
    var dot = 0.0;
    for (var j = 0u; j < K; j++) {
        let y = ex_YS(yb + j);
        let g = ex_G(gb + j);
        ys[j] = y;
        gs[j] = g;
        if (LOG) { dot += g; } else { dot += g * y; }
    }
    for (var j = 0u; j < K; j++) {
        if (LOG) {
            DX[db + j] = sc * (gs[j] - exp(ys[j]) * dot);
        } else {
            DX[db + j] = sc * ys[j] * (gs[j] - dot);
        }
    }
    for (var j = K; j < L; j++) { DX[db + j] = 0.0; }
}
