// Bandwidth-bound GPU variants of the row ops of softmax.wgsl and layernorm.wgsl (same words,
// same results), for a contiguous [R, L] block: G invocations per row, RPW rows per workgroup
// (WG = G * RPW; short rows share a workgroup), elements read as VT (f32, or vec4<f32> where
// L and every offset are multiples of 4: VEC = 4), row reductions through subgroup operations
// (SG, adapters with the `subgroup` feature and subgroups of at most G invocations) or a
// workgroup-memory tree, and with NR > 0 the row held in registers (NR VT per invocation, so
// each element is read from memory once). ops/rowops.py picks the variant.
// sm_fwd words: 0 R, 1 L, 2 x off, 3 y off, 4 scale, 5 Tq (causal mask as in softmax.wgsl)
// sm_bwd words: 0 R, 1 L, 2 y off, 3 g off, 4 dx off, 5 scale, 6 Tq
// ln_fwd words: 0 R, 1 L, 2 x off, 3 w off, 4 b off, 5 y off, 6 eps, 7 has w, 8 has b
// ln_bwd words: 0 R, 1 L, 2 x off, 3 g off, 4 w off, 5 has w, 6 dx off
// xe_stats (cross-entropy's row pass): MEAN[r] = max, MEAN[R + r] = log(sum exp(x - max)),
//   RSTD[r] = sum of row r of X; words
//   0 R, 1 L, 2 x off (xent.wgsl's loss_rows then makes the losses of them)
// Offsets and L are in elements; with VEC = 4 they are divided by 4 here.
// Bindings (one access mode per number in every entry): 1 X / saved softmax output, 2 W / G,
// 3 B / weight of ln_bwd, 4 Y / DX, 5 MEAN, 6 RSTD (unused ones bound to another buffer).
@group(0) @binding(1) var<storage, read> X: array<{{VT}}>;
@group(0) @binding(2) var<storage, read> P2: array<{{VT}}>;
@group(0) @binding(3) var<storage, read> P3: array<{{VT}}>;
@group(0) @binding(4) var<storage, read_write> Y: array<{{VT}}>;
@group(0) @binding(5) var<storage, read_write> MEAN: array<f32>;
@group(0) @binding(6) var<storage, read_write> RSTD: array<f32>;

const WG: u32 = {{WG}}u;
const G: u32 = {{G}}u;
const V: u32 = {{VEC}}u;
const NR: u32 = {{NR}}u;
const NRA: u32 = {{NRA}}u;  // max(NR, 1): array length
const LOG: bool = {{LOG}};
alias VT = {{VT}};

var<workgroup> red: array<vec2<f32>, WG>;

fn hsum(v: VT) -> f32 { return {{HSUM}}; }
fn hmax(v: VT) -> f32 { return {{HMAX}}; }

// Merge two (max, sum exp) pairs (lse) or add two pairs.
fn merge(a: vec2<f32>, b: vec2<f32>, lse: bool) -> vec2<f32> {
    if (lse) { return lse_merge(a, b); }
    return a + b;
}

// Workgroup-memory tree over the G invocations of a row (the reduction without subgroups).
fn tree_reduce(v: vec2<f32>, lid: u32, lse: bool) -> vec2<f32> {
    red[lid] = v;
    workgroupBarrier();
    let j = lid % G;
    for (var k = G / 2u; k > 0u; k >>= 1u) {
        if (j < k) { red[lid] = merge(red[lid], red[lid + k], lse); }
        workgroupBarrier();
    }
    let r = red[lid - j];
    workgroupBarrier();
    return r;
}

// struct Sub (the entry points' subgroup builtins) and row_reduce(v, lid, sub, lse): v reduced
// over the G invocations of this invocation's row; call in uniform control flow.
{{SUBGROUP}}

// This invocation's row r (ok: r < R), first quad j0, row length L and quads lq (0 past R).
struct RowAt { r: u32, ok: bool, j0: u32, L: u32, lq: u32 }

fn row_at(ids: Launch) -> RowAt {
    let r = group_idx(ids) * (WG / G) + ids.lid / G;
    let ok = r < pu(0u);
    return RowAt(r, ok, ids.lid % G, pu(1u), select(0u, pu(1u) / V, ok));
}

// Quad index of the row's start in the operand whose element offset is word w.
fn row_base(at: RowAt, w: u32) -> u32 { return pu(w) / V + at.r * (at.L / V); }

fn neg_inf() -> f32 { return bitcast<f32>(0xff800000u); }

// Online (max, sum exp) with the scaled quad s added.
fn push(ms: vec2<f32>, s: VT) -> vec2<f32> {
    let m = max(ms.x, hmax(s));
    return vec2<f32>(m, ms.y * exp(ms.x - m) + hsum(exp(s - VT(m))));
}

// ls: log(sum exp(x - m)); log_softmax is (s - m) - ls, exact at large offsets
fn sm_out(s: VT, q: u32, K: u32, m: f32, ls: f32, inv: f32) -> VT {
    if (LOG) { return select((s - VT(m)) - VT(ls), VT(neg_inf()), {{MASK}}); }
    return select(exp(s - VT(m)) * inv, VT(0.0), {{MASK}});
}

@compute @workgroup_size(WG)
fn sm_fwd(ids: Launch, sub: Sub) {
    let at = row_at(ids);
    let L = at.L;
    let LQ = L / V;
    var K = 0u;  // rows past R (in a shared last workgroup) reduce nothing and write nothing
    if (at.ok) { K = keys(at.r, L, pu(5u)); }
    let KQ = (K + V - 1u) / V;
    let xb = row_base(at, 2u);
    let sc = pf(4u);
    var xs: array<VT, NRA>;
    var ms = vec2<f32>(LOWEST_F32, 0.0);
    if (NR > 0u) {
        for (var c = 0u; c < NR; c++) {
            let q = at.j0 + c * G;
            if (q < KQ) {
                xs[c] = select(X[xb + q] * sc, VT(neg_inf()), {{MASK}});
                ms = push(ms, xs[c]);
            }
        }
    } else {
        for (var q = at.j0; q < KQ; q += G) {
            ms = push(ms, select(X[xb + q] * sc, VT(neg_inf()), {{MASK}}));
        }
    }
    ms = row_reduce(ms, ids.lid, sub, true);
    if (!at.ok) { return; }
    let yb = row_base(at, 3u);
    let lse = log(ms.y);
    let inv = 1.0 / ms.y;
    if (NR > 0u) {
        for (var c = 0u; c < NR; c++) {  // quads past K: xs[c] is 0, every lane masked
            let q = at.j0 + c * G;
            if (q < LQ) { Y[yb + q] = sm_out(xs[c], q, K, ms.x, lse, inv); }
        }
    } else {
        for (var q = at.j0; q < LQ; q += G) {
            Y[yb + q] = sm_out(X[xb + q] * sc, q, K, ms.x, lse, inv);
        }
    }
}

@compute @workgroup_size(WG)
fn sm_bwd(ids: Launch, sub: Sub) {
    // X: the saved output y, P2: the upstream gradient g, Y: dx
    let at = row_at(ids);
    let L = at.L;
    let LQ = L / V;
    var K = 0u;
    if (at.ok) { K = keys(at.r, L, pu(6u)); }
    let KQ = (K + V - 1u) / V;
    let yb = row_base(at, 2u);
    let gb = row_base(at, 3u);
    var acc = 0.0;
    for (var q = at.j0; q < KQ; q += G) {
        // (select, not a product: masked g may be unwritten memory, NaN included)
        var w = select(P2[gb + q], VT(0.0), {{MASK}});  // log_softmax: sum g; softmax: sum g * y
        if (!LOG) { w *= X[yb + q]; }
        acc += hsum(w);
    }
    let dot = row_reduce(vec2<f32>(acc, 0.0), ids.lid, sub, false).x;
    if (!at.ok) { return; }
    let db = row_base(at, 4u);
    let sc = pf(5u);
    for (var q = at.j0; q < LQ; q += G) {
        let y = X[yb + q];
        var d: VT;
        if (LOG) { d = sc * (P2[gb + q] - exp(y) * dot); } else { d = sc * y * (P2[gb + q] - dot); }
        Y[db + q] = select(d, VT(0.0), {{MASK}});
    }
}

@compute @workgroup_size(WG)
fn ln_fwd(ids: Launch, sub: Sub) {
    let at = row_at(ids);
    let L = at.L;
    let LQ = at.lq;
    let xb = row_base(at, 2u);
    var xs: array<VT, NRA>;
    var s = 0.0;
    if (NR > 0u) {
        for (var c = 0u; c < NR; c++) {
            let q = at.j0 + c * G;
            if (q < LQ) { xs[c] = X[xb + q]; s += hsum(xs[c]); }
        }
    } else {
        for (var q = at.j0; q < LQ; q += G) { s += hsum(X[xb + q]); }
    }
    let mean = row_reduce(vec2<f32>(s, 0.0), ids.lid, sub, false).x / f32(L);
    var d2 = 0.0;
    if (NR > 0u) {
        for (var c = 0u; c < NR; c++) {
            if (at.j0 + c * G < LQ) { let d = xs[c] - VT(mean); d2 += hsum(d * d); }
        }
    } else {
        for (var q = at.j0; q < LQ; q += G) { let d = X[xb + q] - VT(mean); d2 += hsum(d * d); }
    }
    let q2 = row_reduce(vec2<f32>(d2, 0.0), ids.lid, sub, false).x;
    let rstd = inverseSqrt(q2 / f32(L) + pf(6u));
    if (!at.ok) { return; }
    let yb = row_base(at, 5u);
    if (NR > 0u) {
        for (var c = 0u; c < NR; c++) {
            let q = at.j0 + c * G;
            if (q < LQ) { Y[yb + q] = ln_out(xs[c], q, mean, rstd); }
        }
    } else {
        for (var q = at.j0; q < LQ; q += G) { Y[yb + q] = ln_out(X[xb + q], q, mean, rstd); }
    }
    if (at.j0 == 0u) {
        MEAN[at.r] = mean;
        RSTD[at.r] = rstd;
    }
}

fn ln_out(x: VT, q: u32, mean: f32, rstd: f32) -> VT {
    var y = (x - VT(mean)) * rstd;
    if (pu(7u) != 0u) { y *= P2[pu(3u) / V + q]; }
    if (pu(8u) != 0u) { y += P3[pu(4u) / V + q]; }
    return y;
}

fn gw_at(gb: u32, q: u32) -> VT {
    var gw = P2[gb + q];
    if (pu(5u) != 0u) { gw *= P3[pu(4u) / V + q]; }
    return gw;
}

@compute @workgroup_size(WG)
fn ln_bwd(ids: Launch, sub: Sub) {
    // X: x, P2: g, P3: weight, Y: dx
    let at = row_at(ids);
    let L = at.L;
    let LQ = at.lq;
    var mean = 0.0;
    var rstd = 0.0;
    if (at.ok) {
        mean = MEAN[at.r];
        rstd = RSTD[at.r];
    }
    let xb = row_base(at, 2u);
    let gb = row_base(at, 3u);
    var t = vec2<f32>(0.0);
    for (var q = at.j0; q < LQ; q += G) {
        let gw = gw_at(gb, q);
        t += vec2<f32>(hsum(gw), hsum(gw * (X[xb + q] - VT(mean)) * rstd));
    }
    t = row_reduce(t, ids.lid, sub, false) / f32(L);
    if (!at.ok) { return; }
    let db = row_base(at, 6u);
    for (var q = at.j0; q < LQ; q += G) {
        let xh = (X[xb + q] - VT(mean)) * rstd;
        Y[db + q] = rstd * (gw_at(gb, q) - VT(t.x) - xh * t.y);
    }
}

@compute @workgroup_size(WG)
fn xe_stats(ids: Launch, sub: Sub) {
    let at = row_at(ids);
    let xb = row_base(at, 2u);
    var ms = vec2<f32>(LOWEST_F32, 0.0);
    var sx = 0.0;
    for (var q = at.j0; q < at.lq; q += G) {
        let x = X[xb + q];
        ms = push(ms, x);
        sx += hsum(x);
    }
    ms = row_reduce(ms, ids.lid, sub, true);
    sx = row_reduce(vec2<f32>(sx, 0.0), ids.lid, sub, false).x;
    if (at.ok && at.j0 == 0u) {
        MEAN[at.r] = ms.x;  // the row max, and log(sum exp(x - max)) N words on (xent.wgsl)
        MEAN[pu(0u) + at.r] = log(ms.y);
        RSTD[at.r] = sx;
    }
}
