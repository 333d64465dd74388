// Prefixed to every kernel. Binding 0 is a 256-byte parameter slot (64 u32 words) taken from the
// device's per-batch parameter arena; floats are passed bit-cast.
@group(0) @binding(0) var<uniform> PRM: array<vec4<u32>, 16>;

fn pu(i: u32) -> u32 { return PRM[i / 4u][i % 4u]; }
fn pi(i: u32) -> i32 { return bitcast<i32>(PRM[i / 4u][i % 4u]); }
fn pf(i: u32) -> f32 { return bitcast<f32>(PRM[i / 4u][i % 4u]); }

// Linear invocation index of a 1-D launch split over (x, y) workgroups to pass the 65535 limit.
fn linear_id(wid: vec3<u32>, nwg: vec3<u32>, lid: u32, wg: u32) -> u32 {
    return (wid.y * nwg.x + wid.x) * wg + lid;
}

// Linear workgroup index (one workgroup per row) of a launch split over (x, y) workgroups.
fn group_id(wid: vec3<u32>, nwg: vec3<u32>) -> u32 { return wid.y * nwg.x + wid.x; }

// The builtins of a 1-D launch folded over (x, y) workgroups, as one entry point parameter
// (`fn k(ids: Launch)`): thread_idx and group_idx are its linear_id and group_id.
struct Launch {
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
}
fn thread_idx(ids: Launch, wg: u32) -> u32 { return linear_id(ids.wid, ids.nwg, ids.lid, wg); }
fn group_idx(ids: Launch) -> u32 { return group_id(ids.wid, ids.nwg); }

// Longest row of the cached row kernels (entries *_rowc, CPU adapters): the length of their
// private arrays; ops/nnops.py ROWC is the same number.
const ROWC: u32 = 256u;

// Number of unmasked keys of a causal softmax's row r (L without a mask: tq 0): row r is
// query r % tq of tq against L keys aligned at the end (softmax, softmax_cpu, rowops).
fn keys(r: u32, L: u32, tq: u32) -> u32 {
    if (tq == 0u) { return L; }
    return u32(clamp(i32(r % tq) + i32(L) - i32(tq) + 1, 0, i32(L)));
}

// Online (max, sum of exp(x - max)) of a row: add value v to ms = (m, s). A -inf value adds
// exp(-inf) = 0; a +inf one makes the sum NaN, exp(inf - inf), as in PyTorch. Start from
// (LOWEST_F32, 0).
const LOWEST_F32: f32 = -3.4028234663852886e38;
fn lse_push(ms: vec2<f32>, v: f32) -> vec2<f32> {
    if (v > ms.x) {
        return vec2<f32>(v, ms.y * exp(ms.x - v) + select(1.0, nan_(), v > -LOWEST_F32));
    }
    return vec2<f32>(ms.x, ms.y + exp(v - ms.x));
}
// Merge two partial (max, sum of exp) pairs.
fn lse_merge(a: vec2<f32>, b: vec2<f32>) -> vec2<f32> {
    let mm = max(a.x, b.x);
    return vec2<f32>(mm, a.y * exp(a.x - mm) + b.y * exp(b.x - mm));
}

// Element offset of linear index `i` of a view: ndim at word `nd`, shape at `sh`, strides (i32)
// at `st`, base offset `off`. Shape words are shared by all operands of an elementwise op.
fn strided_offset(i: u32, nd: u32, sh: u32, st: u32, off: i32) -> u32 {
    var rem = i;
    var o = off;
    for (var k = i32(nd) - 1; k >= 0; k--) {
        let s = pu(sh + u32(k));
        let idx = rem % s;
        rem = rem / s;
        o += i32(idx) * pi(st + u32(k));
    }
    return u32(o);
}

// Row of index v into A rows (the index kernels): negatives count from the end, the rest are
// clamped (the forward kernels flag indices out of range).
fn norm_index(v: i32, A: u32) -> u32 {
    let w = select(v, v + i32(A), v < 0);
    return u32(clamp(w, 0, i32(A) - 1));
}

// erf with |error| < 1.5e-7 (Abramowitz & Stegun 7.1.26), enough for float32 GELU.
fn erf_(x: f32) -> f32 {
    let t = 1.0 / (1.0 + 0.3275911 * abs(x));
    let y = 1.0 - (((((1.061405429 * t - 1.453152027) * t) + 1.421413741) * t - 0.284496736) * t
                    + 0.254829592) * t * exp(-x * x);
    return select(-y, y, x >= 0.0);
}

// tanh that stays finite for large |x| (exp overflow would give inf/inf); below |x| = 0.4 its
// Taylor series, since 1 - e^-2|x| cancels near 0 (19% off at 1e-7).
fn tanh_(x: f32) -> f32 {
    if (abs(x) < 0.4) {
        let z = x * x;
        return x + x * z * (-0.33333333333 + z * (0.13333333333 + z * (-0.053968253968 + z
            * (0.021869488536 + z * (-0.0088632355299 + z * 0.0035921280366)))));
    }
    let t = exp(-2.0 * abs(x));
    return sign(x) * (1.0 - t) / (1.0 + t);
}

fn nan_() -> f32 { return bitcast<f32>(0x7fc00000u); }
// NaN test on the bits (a compiler may fold x != x to false).
fn isnan_(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }

// a^e for an integer e by squaring: exact where the result is (PyTorch's (-1.5)**2 is 2.25).
fn powi_(a: f32, e: i32) -> f32 {
    var n = u32(abs(e));
    var base = a;
    var r = 1.0;
    while (n > 0u) {
        if ((n & 1u) != 0u) { r *= base; }
        base *= base;
        n = n >> 1u;
    }
    return select(r, 1.0 / r, e < 0);
}
// Integer a^e (wrapping, like PyTorch's integer pow); a negative e gives 0 but for |a| = 1.
fn ipow_(a: i32, e: i32) -> i32 {
    if (e < 0) { return select(select(0, 1, a == 1), select(1, -1, (e & 1) != 0), a == -1); }
    var n = u32(e);
    var base = a;
    var r = 1;
    while (n > 0u) {
        if ((n & 1u) != 0u) { r *= base; }
        base *= base;
        n = n >> 1u;
    }
    return r;
}

// numpy semantics for a negative base with an integral exponent; small integral exponents
// exact (by squaring); (-inf)^b as C's pow (inf for b > 0, 0 for b < 0).
fn pow_(a: f32, b: f32) -> f32 {
    if (b == 0.0) { return 1.0; }
    if (isnan_(a) || isnan_(b)) { return select(nan_(), 1.0, a == 1.0); }  // 1 ** nan is 1
    if (fract(b) == 0.0 && abs(b) <= 64.0) { return powi_(a, i32(b)); }
    if (a == 0.0) { return select(0.0, bitcast<f32>(0x7f800000u), b < 0.0); }
    if (a == bitcast<f32>(0xff800000u) && fract(b) != 0.0) {
        return select(0.0, bitcast<f32>(0x7f800000u), b > 0.0);
    }
    if (a > 0.0) { return exp2(b * log2(a)); }
    if (fract(b) != 0.0) { return nan_(); }
    let r = exp2(b * log2(-a));
    return select(r, -r, fract(b * 0.5) != 0.0);
}

fn gelu_(x: f32) -> f32 { return 0.5 * x * (1.0 + erf_(x * 0.70710678118654752)); }
fn gelu_grad_(x: f32) -> f32 {
    return 0.5 * (1.0 + erf_(x * 0.70710678118654752)) + x * 0.3989422804014327 * exp(-0.5 * x * x);
}
fn gelu_tanh_(x: f32) -> f32 {
    return 0.5 * x * (1.0 + tanh_(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}
fn gelu_tanh_grad_(x: f32) -> f32 {
    let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
    let t = tanh_(u);
    return 0.5 * (1.0 + t) + 0.5 * x * (1.0 - t * t) * 0.7978845608028654 * (1.0 + 0.134145 * x * x);
}

// Counter-based random numbers (PCG hash chain): value k of stream `seed` is the same on every
// device and for every launch shape, so seeded results do not depend on the parallel layout.
fn pcg_(v: u32) -> u32 {
    let s = v * 747796405u + 2891336453u;
    let w = ((s >> ((s >> 28u) + 4u)) ^ s) * 277803737u;
    return (w >> 22u) ^ w;
}
fn uniform_(seed: u32, k: u32, stream: u32) -> f32 {
    let h = pcg_(pcg_(pcg_(k ^ (stream * 0x9E3779B9u)) ^ seed) + k);
    return (f32(h >> 8u) + 0.5) * (1.0 / 16777216.0);  // (0, 1)
}

// x rounded to the nearest f16 value (ties to even), as an f32, in integer arithmetic: drivers
// may fold f32 -> f16 -> f32 conversions away (the NVIDIA Vulkan driver folds every form, also
// pack2x16float/unpack2x16float), which would leave autocast's operands unrounded on one
// adapter and rounded on another.
fn round_f16_(x: f32) -> f32 {
    let u = bitcast<u32>(x);
    let s = u & 0x80000000u;
    let a = u & 0x7FFFFFFFu;
    if (a >= 0x477FF000u) {  // 65520 and up (and inf, NaN): inf, NaN kept
        return bitcast<f32>(s | select(0x7F800000u, a, a > 0x7F800000u));
    }
    if (a >= 0x38800000u) {  // normal f16 range: 10 mantissa bits kept
        return bitcast<f32>(s | ((a + 0xFFFu + ((a >> 13u) & 1u)) & 0xFFFFE000u));
    }
    let e = a >> 23u;
    if (e < 102u) {  // below 2^-25: zero
        return bitcast<f32>(s);
    }
    let m = (a & 0x7FFFFFu) | 0x800000u;  // subnormal f16: a multiple of 2^-24
    let sh = 126u - e;
    let q = (m + (1u << (sh - 1u)) - 1u + ((m >> sh) & 1u)) >> sh;
    return select(1.0, -1.0, s != 0u) * f32(q) * 5.9604644775390625e-8;
}
fn round_f16x4_(v: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(round_f16_(v.x), round_f16_(v.y), round_f16_(v.z), round_f16_(v.w));
}

// log(1 + x) and exp(x) - 1 accurate near 0: a series where 1 + x would round (WGSL has
// neither; Goldberg's (u - 1) correction is folded away by compilers that reassociate).
fn log1p_(x: f32) -> f32 {
    if (abs(x) < 0.1) {
        return x * (1.0 + x * (-0.5 + x * (0.33333333 + x * (-0.25 + x * (0.2 + x * (
            -0.16666667 + x * (0.14285714 + x * -0.125)))))));
    }
    return log(1.0 + x);
}
fn expm1_(x: f32) -> f32 {
    if (abs(x) < 0.1) {
        return x * (1.0 + x * (0.5 + x * (0.16666667 + x * (0.041666668 + x * (
            0.0083333338 + x * (0.0013888889 + x * 0.00019841270))))));
    }
    return exp(x) - 1.0;
}
// log(1 + exp(x)) without overflow.
fn softplus_(x: f32) -> f32 { return max(x, 0.0) + log1p_(exp(-abs(x))); }
fn sigmoid_(x: f32) -> f32 { return 1.0 / (1.0 + exp(-x)); }
