// FlashAttention-2 for GPUs: softmax(scale * q k^T [causal]) v and its gradients with
// register-blocked tiles (ops/attention_tiles.py generates the entry point at the end, with
// literal register indices). A workgroup owns R "resident" rows of one (batch, head) (queries in
// fwd / bwd_q, keys in bwd_kv) and streams the other side in tiles of S rows through workgroup
// memory; invocation (tx, ty) of NX x NY computes the TM x TN block of scores of resident rows
// ty + NY i and streamed rows tx + NX j, and owns output quads tx + NX u of its resident rows.
// Q, K, V: contiguous [BH, T, D] of storage type T (f32 or f16), math in f32, scores in log2
// units (q or k pre-scaled by scale * log2(e), exp2). Causal (Tq == Tk): key j sees query i iff
// j <= i; key tiles past a query block's diagonal are never visited.
// Loops: llvmpipe ends an invocation's loops after 65,535 back-edges in all; staging and the
// register blocks are unrolled, the score and accumulation loops run <= 4 passes per tile.
// Words: 0 BH, 1 Tq, 2 Tk, 3 q off, 4 k off, 5 v off, 6 W1 off, 7 W2 off, 8 scale,
//        9 causal, 10 resident blocks per (batch, head), 11 O off, 12 dO off, 13 LSE off,
//        14 DSUM off.
//   fwd:    W1 = O [BH, Tq, D], W2 = LSE [BH, Tq] (natural log).
//   bwd_q:  W1 = dQ, W2 = DSUM = rowsum(dO * O); dQ = scale sum_j P (dP - DSUM) K_j.
//   bwd_kv: W1 = dK, W2 = dV (reads DSUM from bwd_q).
@group(0) @binding(1) var<storage, read> Q: array<{{QT}}>;
@group(0) @binding(2) var<storage, read> K: array<{{QT}}>;
@group(0) @binding(3) var<storage, read> V: array<{{QT}}>;
@group(0) @binding(4) var<storage, read_write> W1: array<f32>;
@group(0) @binding(5) var<storage, read_write> W2: array<f32>;
@group(0) @binding(6) var<storage, read> OS: array<{{OT}}>;
@group(0) @binding(7) var<storage, read> DO: array<{{OT}}>;
@group(0) @binding(8) var<storage, read> LS: array<f32>;
@group(0) @binding(9) var<storage, read> DS: array<f32>;

const D: u32 = {{D}}u;    // head size
const D4: u32 = {{D4}}u;  // quads per row holding data (ceil(D / 4))
const RP: u32 = {{RP}}u;  // row pitch of the row tiles in quads (zero padded past D4, odd)
const PQ: u32 = {{PQ}}u;  // row pitch of the score tiles in quads (S / 4 + 1)
const NX: u32 = {{NX}}u;
const LOG2E: f32 = 1.4426950408889634;
const LN2: f32 = 0.6931471805599453;

// Row tiles (resident A, B; streamed A, B), score tiles (P, dS), per-row values (RED, RV).
var<workgroup> RA: array<vec4<f32>, {{SRA}}>;
var<workgroup> RB: array<vec4<f32>, {{SRB}}>;
var<workgroup> TA: array<vec4<f32>, {{STA}}>;
var<workgroup> TB: array<vec4<f32>, {{STB}}>;
var<workgroup> PA: array<vec4<f32>, {{SPA}}>;
var<workgroup> PB: array<vec4<f32>, {{SPB}}>;
var<workgroup> RED: array<f32, {{SRED}}>;
var<workgroup> RV: array<vec4<f32>, {{SRV}}>;  // the forward's row reductions, in quads

// Which elements of quad qq < D4 lie inside a row of D (no loops: they would count against
// llvmpipe's budget).
fn inrow(qq: u32) -> vec4<bool> {
    if (D % 4u == 0u) { return vec4<bool>(true); }
    let c = 4u * qq;
    return vec4<bool>(c < D, c + 1u < D, c + 2u < D, c + 3u < D);
}

// Element indices of quad qq < D4 of the row at x: those past D repeat x. The family is compiled
// without wgpu's bounds checks (runtime/device.py TRUSTED_FAMILIES): every index stays in range.
fn quad(x: u32, qq: u32) -> vec4<u32> {
    let m = inrow(qq);
    return vec4<u32>(x, select(x, x + 1u, m.y), select(x, x + 2u, m.z), select(x, x + 3u, m.w));
}

// ld_q, ld_k, ld_v, ld_o, ld_do(base, row, qq, n): quad qq of row `row` (zero past n rows or
// past D) of a [T, D] block at element `base`; element loads, or quad loads where the arrays
// are quads (V4: D and the offsets multiples of 4).
{{LOADS}}

// Quad qq of W1's / W2's row at element x (its elements < D).
fn st_w1(x: u32, qq: u32, v: vec4<f32>) {
    if (qq >= D4) { return; }
    let i = x + 4u * qq;
    let m = inrow(qq);
    W1[i] = v.x;
    if (m.y) { W1[i + 1u] = v.y; }
    if (m.z) { W1[i + 2u] = v.z; }
    if (m.w) { W1[i + 3u] = v.w; }
}
fn st_w2(x: u32, qq: u32, v: vec4<f32>) {
    if (qq >= D4) { return; }
    let i = x + 4u * qq;
    let m = inrow(qq);
    W2[i] = v.x;
    if (m.y) { W2[i + 1u] = v.y; }
    if (m.z) { W2[i + 2u] = v.z; }
    if (m.w) { W2[i + 3u] = v.w; }
}

// Score c of streamed column c into a score tile row (quads of 4 columns).
fn put_pa(row: u32, c: u32, v: f32) { PA[row * PQ + c / 4u][c % 4u] = v; }
fn put_pb(row: u32, c: u32, v: f32) { PB[row * PQ + c / 4u][c % 4u] = v; }

{{ENTRY}}
