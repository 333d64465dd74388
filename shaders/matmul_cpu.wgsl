// C[b] = A[b] @ B[b] on CPU adapters (lavapipe/llvmpipe); same operands and words as
// matmul.wgsl (0 M, 1 N, 2 K, 3..6 A offset/batch/row/col stride, 7..10 B, 11 C offset,
// 12 batch offset, 13/14 epilogue bias/residual offsets, 15 rows of a FLAT launch, 16/17 the
// K range of this pass, 18 inner batches of a two-level batch (1: one level), 19/20 A's / B's
// inner batch strides, 21/22/23 C's outer / inner batch and row strides: C may be a view whose
// rows are contiguous, e.g. attention's [B, H, T, d] output inside [B, T, H, d]).
// llvmpipe runs a workgroup's invocations as the SIMD lanes of one CPU thread, turns every
// workgroupBarrier into a context switch and reads storage (and workgroup) memory one lane and
// one component at a time, while arithmetic runs on all lanes at once. So this kernel has no
// barriers and no workgroup memory, and each invocation owns a TM x TN block of C in registers:
// per k it loads TM + TN values for TM * TN FMAs. VEC 1: K is walked 4 at a time with vec4
// loads along each operand's contiguous dimension (one lane visit loads 4 values); otherwise
// (and for the K % 4 tail) one k at a time, B as vec4 along n where it is contiguous (large
// blocks: their 4-k body takes llvmpipe too long to compile), else element-wise. The register
// code is unrolled on the host with literal indices (ops/matmul.py, _cpu_code).
//   AM 0: A's K contiguous, 1: A's M contiguous.  BM 0: B's N contiguous, 1: B's K contiguous.
//   FLAT 1 (TM 1): lanes walk the flattened (batch, row) index, for tiny batched matrices.
// llvmpipe silently stops looping once an invocation has taken 65,535 loop back-edges in total
// (one counter for all its loops), so a long K is split into passes (ops/matmul.py, CPU_KPASS).
// OPERANDS declares A and B and their quad loads qa(q) / qb(q) (ops/matmul.py, _operand_decls):
// storage arrays of vec4, or (f32) rgba32float textures holding the operands' buffer regions,
// quad q at texel (q % TEX_W, q / TEX_W). llvmpipe 22.3 reads a storage value in a loop over
// the lanes with a branch per lane and component; a texel fetch is straight-line code, one
// 16-byte load a lane (512^2: 7-10x the storage kernel's speed, BENCHMARKS.md).
// SG (texture operands, one subgroup a workgroup, all its lanes on the same rows): lane l
// fetches A's texels of rows m0 + l, m0 + 8 + l, ... (AM 0) or of the quad of rows m0 + 4l ..
// (AM 1) and subgroupBroadcast hands them to every lane (an extract and a splat on llvmpipe),
// so an invocation fetches TM / 8 (AM 1: 4) texels of A a 4-k step instead of TM.
{{OPERANDS}}
// C and the epilogue: FIN (ops/matmul.py, _fin_code) declares C and defines the stored value,
// fin(i, n, x) of one accumulator or (V4: C's rows, offsets and strides all multiples of 4)
// fin4(i, n, x) of a quad of them, stored as one vec4 (llvmpipe pays its per-lane store loop
// once per quad instead of once per element). ACC 1 (passes after the first over a long K)
// adds C's value so far; the epilogue act(z + bias + residual), z's store for the backward
// (EPI_PRE: fused GELU-type linears) included, runs in the last pass only.
{{FIN}}

// An operand quad as read: LD is vec4<f32>(v), or rounds v to f16 first (R16: autocast's
// float32 operands, converted on load instead of by a cast pass of their own).
fn ld(v: vec4<{{T}}>) -> vec4<f32> { return {{LD}}; }
fn ea(i: u32) -> f32 { return ld(qa(i >> 2u))[i & 3u]; }
fn eb(i: u32) -> f32 { return ld(qb(i >> 2u))[i & 3u]; }

const WGX: u32 = {{WGX}}u;  // invocations along n
const WGY: u32 = {{WGY}}u;  // invocations along m
const TM: u32 = {{TM}}u;
const TN: u32 = {{TN}}u;
const VEC: u32 = {{VEC}}u;
const FLAT: u32 = {{FLAT}}u;

@compute @workgroup_size({{WG}})
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32,
        @builtin(num_workgroups) nwg: vec3<u32>{{SG_ARGS}}) {
    let M = pu(0u);
    let N = pu(1u);
    let K = pu(2u);
    var bz: u32;
    var m0: u32;
    var n0: u32;
    var live = true;
    if (FLAT == 1u) {  // rows over (x, y) folded 1-D, column blocks over z
        let r = (wid.y * nwg.x + wid.x) * WGY + lid;
        live = r < pu(15u);
        let rr = select(0u, r, live);
        bz = rr / M;
        m0 = rr % M;
        n0 = wid.z * TN;
    } else {  // column blocks over x, row blocks over y, batches over z
        bz = wid.z + pu(12u);
        m0 = (wid.y * WGY + lid / WGX) * TM;
        n0 = (wid.x * WGX + lid % WGX) * TN;
    }
    // a two-level batch: bz = outer * pu(18u) + inner, A / B strides 4 / 19 and 8 / 20
    let bo = bz / pu(18u);
    let bi = bz % pu(18u);
    let abase = pu(3u) + bo * pu(4u) + bi * pu(19u);
    let ar = pu(5u);
    let ac = pu(6u);
    let bbase = pu(7u) + bo * pu(8u) + bi * pu(20u);
    let br = pu(9u);
    let bc = pu(10u);
    // Rows and columns past the edge read the last one (their sums are never stored); quads
    // along a contiguous dimension are aligned, that dimension a multiple of 4 (host-checked).
    let lm = M - 1u;
    let ln = N - 1u;
    let lqm = lm & ~3u;
    let lqn = ln & ~3u;
{{SETUP}}
    let kb = pu(16u);
    let ke = pu(17u);
    let k4 = select(kb, kb + ((ke - kb) & ~3u), VEC == 1u);
    for (var k = kb; k < k4; k += 4u) {
{{BODY4}}
    }
    for (var k = k4; k < ke; k++) {
{{BODY1}}
    }
    if (!live) { return; }
    let c0 = pu(11u) + bo * pu(21u) + bi * pu(22u);
    let cr = pu(23u);
{{STORE}}
}
