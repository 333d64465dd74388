// C[b] = A[b] @ B[b] for strided A (M x K) and B (K x N); C contiguous (M x N) per batch.
// Register-blocked: a 16x16 workgroup computes a TILEM x TILEN block of C (16 * TM x 16 * TN),
// each invocation TM x TN outputs, over K in steps of BK staged through double-buffered workgroup
// tiles (one barrier per step: the next step's operands are fetched into registers while the
// current tile is consumed). Operands are read as vec4 along their contiguous dimension; the
// load mode per operand is chosen on the host from the strides (ops/matmul.py), so transposed
// views (Linear's weight, backward's A^T and B^T) need no copy:
//   AM 0: A's K is contiguous (row-major)   1: A's M is contiguous (a transposed view)
//   BM 0: B's N is contiguous (row-major)   1: B's K is contiguous (a transposed view)
//   2 (either): any strides, element-wise gathers (the fallback for odd strides/sizes).
// Words: 0 M, 1 N, 2 K, 3..6 A (offset, batch, row, col stride), 7..10 B (same), 11 C offset,
// 12 batch offset (for batches split over several dispatches), 15 K per slice (split-K),
// 16 batches in all; with TWO (a two-level batch and/or a strided C, no split-K): 17 inner
// batches (batch bz is outer bz / w17, inner bz % w17), 18 / 19 A's / B's inner batch stride
// (4 / 8: outer), 20 / 21 / 22 C's outer / inner batch and row strides. Attention's head views
// of a packed [B, T, 3, H, d] projection so need no copy, and its products store into heads
// merged in place.
// Variants (ops/matmul.py's table picks them per adapter and shape):
//   SPLIT > 1: split-K, workgroup z = batch * SPLIT + slice; slice s covers K [s * w15, ...) and
//     stores its partial product at C + (s * w16 + batch) * M * N (f32; the host adds them up).
//   EXACT: the host guarantees M % TILEM, N % TILEN and K % BK (per slice) are 0: no range checks.
//   EXMN: only M % TILEM and N % TILEN are: k is still checked (K = 4096 in k steps of 24).
//   HALF (f16 storage only): packed f16 math: workgroup tiles and FMAs in vec4<f16>, the f16
//     partial sums added into the f32 accumulators every few BK k steps (short f16 runs).
// T: storage type (f32, or f16 with F16=1: f16 operands and result, f32 accumulation); TC: C's
// type (T, or f32 for split-K partials); S: type of the workgroup tiles (f16 with HALF). R16
// (f32 storage, autocast): the operands are rounded to f16 as they are read (see ld).
// Epilogue (2-D f32 only): EPI is the stored value as an expression of x (the product), n (its
// column) and i (its index in C); it may read a bias (words 13: offset) and a contiguous residual
// of C's shape (word 14: offset), declared by EPI_DECLS at bindings 4 and 5. Linear's bias,
// residual add and ReLU so cost no pass of their own. EPI_PRE (fused GELU-type linears) also
// stores the activation's argument z for the backward (word 14: its offset).
@group(0) @binding(1) var<storage, read> A: array<vec4<{{T}}>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<{{T}}>>;
@group(0) @binding(3) var<storage, read_write> C: array<{{TC}}>;
{{EPI_DECLS}}

fn epi(i: u32, n: u32, x: f32) -> f32 { {{EPI_PRE}}return {{EPI}}; }

const TILEM: u32 = {{TILEM}}u;  // 16 * TM
const TILEN: u32 = {{TILEN}}u;  // 16 * TN
const TQA: u32 = {{TQA}}u;  // TILEM / 4: vec4 quads per row of the A tile
const TQB: u32 = {{TQB}}u;  // TILEN / 4
const TQPA: u32 = {{TQPA}}u;  // row pitch of the workgroup tiles in quads (TQA + padding;
                              // with AK: BK / 4, A's tile is [TILEM m][BK / 4 k-quads])
const TQPB: u32 = {{TQPB}}u;
const BK: u32 = {{BK}}u;
const AM: u32 = {{AM}}u;
const BM: u32 = {{BM}}u;
const SWZ: u32 = {{SWZ}}u;
const SPLIT: u32 = {{SPLIT}}u;
const EXACT: bool = {{EXACT}};
const EXMN: bool = {{EXMN}};
const TWO: bool = {{TWO}};
const CAUSAL: u32 = {{CAUSAL}}u;  // 0, or a part of ops/matmul.py's CAUSAL_PARTS

const ABUF: u32 = {{ABUF}}u;  // quads per buffer of As (BK * TQPA, or TILEM * TQPA with AK)
const AK: bool = {{AK}};  // A (k-contiguous) staged as it is read, no transposing stores
var<workgroup> As: array<vec4<{{S}}>, {{SMEMA}}>;  // [2 buffers][BK k][TQPA m-quads] (AK: [m][k])
var<workgroup> Bs: array<vec4<{{S}}>, {{SMEMB}}>;  // [2 buffers][BK k][TQPB n-quads]

// An operand quad as read: LD is vec4<S>(v), or rounds v to f16 first (R16: autocast's float32
// operands, converted on load instead of by a cast pass of their own).
fn ld(v: vec4<{{T}}>) -> vec4<{{S}}> { return {{LD}}; }
fn elem_a(i: u32) -> {{S}} { return ld(A[i >> 2u])[i & 3u]; }
fn elem_b(i: u32) -> {{S}} { return ld(B[i >> 2u])[i & 3u]; }

// Fetch the q-th quad of A's (row0, k0) tile into a register (K: end of this slice's k range).
fn fetch_a(q: u32, row0: u32, k0: u32, M: u32, K: u32, a0: u32, ars: u32, acs: u32) -> vec4<{{S}}> {
    if (AM == 0u) {  // quad along k
        let m = row0 + q / (BK / 4u);
        let k = k0 + (q % (BK / 4u)) * 4u;
        if (EXACT || ((EXMN || m < M) && k < K)) { return ld(A[(a0 + m * ars + k) >> 2u]); }
        return vec4<{{S}}>(0.0);
    }
    let m = row0 + (q % TQA) * 4u;  // quad along m
    let k = k0 + q / TQA;
    if (AM == 1u) {
        if (EXACT || ((EXMN || m < M) && k < K)) { return ld(A[(a0 + m + k * acs) >> 2u]); }
        return vec4<{{S}}>(0.0);
    }
    var v = vec4<{{S}}>(0.0);
    if (k < K) {
        for (var e = 0u; e < 4u; e++) {
            if (m + e < M) { v[e] = elem_a(a0 + (m + e) * ars + k * acs); }
        }
    }
    return v;
}

fn stage_a(q: u32, base: u32, v: vec4<{{S}}>) {
    if (AK) {
        As[base + q] = v;  // quad q is row q / (BK / 4), k-quad q % (BK / 4)
    } else if (AM == 0u) {
        let mm = q / (BK / 4u);
        let kk = (q % (BK / 4u)) * 4u;
        for (var e = 0u; e < 4u; e++) { As[base + (kk + e) * TQPA + mm / 4u][mm % 4u] = v[e]; }
    } else {
        As[base + (q / TQA) * TQPA + q % TQA] = v;
    }
}

fn fetch_b(q: u32, col0: u32, k0: u32, N: u32, K: u32, b0: u32, brs: u32, bcs: u32) -> vec4<{{S}}> {
    if (BM == 1u) {  // quad along k
        let n = col0 + q / (BK / 4u);
        let k = k0 + (q % (BK / 4u)) * 4u;
        if (EXACT || ((EXMN || n < N) && k < K)) { return ld(B[(b0 + n * bcs + k) >> 2u]); }
        return vec4<{{S}}>(0.0);
    }
    let n = col0 + (q % TQB) * 4u;  // quad along n
    let k = k0 + q / TQB;
    if (BM == 0u) {
        if (EXACT || ((EXMN || n < N) && k < K)) { return ld(B[(b0 + k * brs + n) >> 2u]); }
        return vec4<{{S}}>(0.0);
    }
    var v = vec4<{{S}}>(0.0);
    if (k < K) {
        for (var e = 0u; e < 4u; e++) {
            if (n + e < N) { v[e] = elem_b(b0 + k * brs + (n + e) * bcs); }
        }
    }
    return v;
}

fn stage_b(q: u32, base: u32, v: vec4<{{S}}>) {
    if (BM == 1u) {
        let nn = q / (BK / 4u);
        let kk = (q % (BK / 4u)) * 4u;
        for (var e = 0u; e < 4u; e++) { Bs[base + (kk + e) * TQPB + nn / 4u][nn % 4u] = v[e]; }
    } else {
        Bs[base + (q / TQB) * TQPB + q % TQB] = v;
    }
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let M = pu(0u);
    let N = pu(1u);
    let slice = wid.z % SPLIT;
    let bz = wid.z / SPLIT + pu(12u);
    var kbeg = 0u;
    var K = pu(2u);  // end of this workgroup's k range
    if (SPLIT > 1u) {
        kbeg = slice * pu(15u);
        K = min(K, kbeg + pu(15u));
    }
    var bo = bz;
    var bi = 0u;
    if (TWO) {
        bo = bz / pu(17u);
        bi = bz % pu(17u);
    }
    let a0 = pu(3u) + bo * pu(4u) + bi * pu(18u);
    let ars = pu(5u);
    let acs = pu(6u);
    let b0 = pu(7u) + bo * pu(8u) + bi * pu(19u);
    let brs = pu(9u);
    let bcs = pu(10u);
    // Grouped order (SWZ > 0): consecutive workgroups walk SWZ tile rows column by column, so
    // the A and B tiles they share are still in L2.
    var bx = wid.x;
    var by = wid.y;
    if (SWZ > 0u) {
        let lin = wid.y * nwg.x + wid.x;
        let group = SWZ * nwg.x;
        let first = (lin / group) * SWZ;
        let rows = min(nwg.y - first, SWZ);
        by = first + (lin % group) % rows;
        bx = (lin % group) / rows;
    }
    let row0 = by * TILEM;
    let col0 = bx * TILEN;
    // Causal products (square T x T per batch): only what a causal attention reads is computed.
    if (CAUSAL == 1u && col0 >= row0 + TILEM) { return; }  // scores above the diagonal
    if (CAUSAL == 2u) { K = min(K, row0 + TILEM); }  // A zero above its diagonal
    if (CAUSAL == 3u) { kbeg = max(kbeg, row0); }  // A zero below its diagonal
    let tx = lid.x;
    let ty = lid.y;
    let t = ty * 16u + tx;
    var acc: array<vec4<f32>, {{ACC}}>;  // [TM rows][TN / 4 column quads]
{{ACCH}}
    // Register code is unrolled on the host (literal indices keep every array in registers).
{{STAGE0}}
    workgroupBarrier();
    var cur = 0u;
    for (var k0 = kbeg; k0 < K; k0 += BK) {
        let k1 = k0 + BK;
        let more = k1 < K;
        var ra: array<vec4<{{S}}>, {{LOADA}}>;
        var rb: array<vec4<{{S}}>, {{LOADB}}>;
        if (more) {  // fetch the next step while this one computes
{{PREFETCH}}
        }
        let ba = cur * ABUF;
        let bb = cur * BK * TQPB;
{{FMA}}
{{FLUSH}}
        if (more) {
            let na = (cur ^ 1u) * ABUF;
            let nb = (cur ^ 1u) * BK * TQPB;
{{STAGE}}
        }
        cur ^= 1u;
        workgroupBarrier();
    }

    // Invocation (tx, ty) owns rows (ty + 16 i) * 4 + r and columns (tx + 16 j) * 4 + e.
    var c0 = pu(11u) + (slice * pu(16u) + bz) * M * N;
    var cr = N;  // C's row stride
    if (TWO) {
        c0 = pu(11u) + bo * pu(20u) + bi * pu(21u);
        cr = pu(22u);
    }
    let full = EXACT || EXMN || col0 + TILEN <= N;
{{STORE}}
}

fn store_quad(row: u32, n: u32, N: u32, full: bool, v: vec4<f32>) {
    let i = row + n;
    if (full) {
        C[i] = {{TC}}(epi(i, n, v.x));
        C[i + 1u] = {{TC}}(epi(i + 1u, n + 1u, v.y));
        C[i + 2u] = {{TC}}(epi(i + 2u, n + 2u, v.z));
        C[i + 3u] = {{TC}}(epi(i + 3u, n + 3u, v.w));
        return;
    }
    for (var e = 0u; e < 4u; e++) {
        if (n + e < N) { C[i + e] = {{TC}}(epi(i + e, n + e, v[e])); }
    }
}
