"""matmul: 2-D, batched, broadcast batch dims (numpy rules), any operand strides."""
from __future__ import annotations

import functools
import math
import re
import weakref

from ..autograd.tape import record
from ..runtime.adapters import is_cpu_adapter
from ..runtime.device import MAX_WG_PER_DIM, TEX_W, groups_1d, texture_loader
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, check_same_device, float16, float32
from . import texread
from .elementwise import cast, contiguous, fill_, unbroadcast
from .launch import broadcast_shapes, run_map
from .precision import autocast_dtype, in_forward_precision
from .shape import expand, reshape, transpose


def _batch_stride(t: Tensor, nb: int):
    """One stride that walks the first ``nb`` dims of ``t`` in order, or None."""
    dims = [(s, st) for s, st in zip(t.shape[:nb], t.strides[:nb]) if s != 1]
    if not dims:
        return 0
    for (_, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


def _two_level(ae: Tensor, be: Tensor, nb: int):
    """(A outer stride, B outer stride, inner batches, A inner stride, B inner stride) where
    each operand's batch dims but the last collapse into one stride (the kernels' two-level
    batch: a [B, H, T, d] head view of a packed [B, T, 3, H, d] projection needs no copy), or
    None."""
    if nb < 2:
        return None
    inner = ae.shape[nb - 1]
    outer = [_batch_stride(t, nb - 1) for t in (ae, be)]
    if None in outer:
        return None
    ins = [t.strides[nb - 1] if inner != 1 else 0 for t in (ae, be)]
    return outer[0], outer[1], inner, ins[0], ins[1]


def matmul(a: Tensor, b: Tensor) -> Tensor:
    if not isinstance(a, Tensor) or not isinstance(b, Tensor):
        raise TypeError("matmul needs two tensors")
    check_same_device(a, b, op="matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: 0-d operand (shapes {a.shape} and {b.shape}); use * instead")
    # float16 @ float16 stays in f16 storage (f32 accumulation) where the adapter has
    # shader-f16; every other mix computes in float32.
    dt = float16 if (a.dtype == b.dtype == float16
                     and "shader-f16" in a.device.features) else float32
    a = a if a.dtype == dt else cast(a, dt)
    b = b if b.dtype == dt else cast(b, dt)
    a2 = reshape(a, (1,) + a.shape) if a.ndim == 1 else a
    b2 = reshape(b, b.shape + (1,)) if b.ndim == 1 else b
    # autocast: the kernel rounds the f32 operands to f16 as it reads them and stores its f32
    # accumulators (ops/precision.py), no cast passes
    r16 = dt == float32 and autocast_dtype() == float16
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({K} != {K2})")
    if a2.ndim > 2 and b2.ndim == 2 and a2.is_contiguous():
        # A batched contiguous operand times a 2-D one is one 2-D product: one kernel over all
        # rows instead of a batch of (possibly tiny) products.
        rows = math.prod(a2.shape[:-1])
        out = reshape(matmul(reshape(a2, (rows, K)), b2), a2.shape[:-1] + (N,))
        return reshape(out, out.shape[:-1]) if b.ndim == 1 else out
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    nb = len(batch)
    ae = expand(a2, batch + (M, K)) if a2.shape[:-2] != batch else a2
    be = expand(b2, batch + (K, N)) if b2.shape[:-2] != batch else b2
    sa, sb = _batch_stride(ae, nb), _batch_stride(be, nb)
    two = None
    if sa is None or sb is None:
        two = _two_level(ae, be, nb)
    if two is not None:
        sa, sb = two[:2]
    if sa is None:
        ae, sa = contiguous(ae), M * K
    if sb is None:
        be, sb = contiguous(be), K * N
    nbatch = math.prod(batch)
    out = Tensor.empty(batch + (M, N), a.device, ae.dtype)
    if out.numel():
        if K == 0:
            fill_(out, 0.0)
        else:
            _launch(ae, be, out, M, N, K, sa, sb, nbatch, r16=r16,
                    inner=two[2:] if two else (1, 0, 0))

    def bw(g):
        g2 = reshape(g, batch + (M, N))
        ga = gb = None
        if a.requires_grad:
            ga = unbroadcast(matmul(g2, transpose(b2, -1, -2)), a2.shape)
            ga = reshape(ga, a.shape)
        if b.requires_grad:
            gb = unbroadcast(matmul(transpose(a2, -1, -2), g2), b2.shape)
            gb = reshape(gb, b.shape)
        return ga, gb
    record("matmul", out, [a, b], in_forward_precision(bw), saved=[a, b])
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, out.shape[:-2] + (N,))
    if b.ndim == 1:
        return reshape(out, out.shape[:-1])
    return out


CAUSAL_PARTS = {"out": 1, "a_lower": 2, "a_upper": 3}


def matmul_into(a: Tensor, b: Tensor, out: Tensor, part: str | None = None) -> Tensor:
    """out = a @ b (no autograd) for float32 [B, H, M, K] @ [B, H, K, N] into a float32
    [B, H, M, N] view whose rows are contiguous, in one launch (two-level batches, strided C):
    attention reads its heads inside the packed [B, T, 3, H, d] projection and stores them
    merged into [B, T, H, d], with no copy. ``part``: only what a causal attention reads, which
    the GPU kernel then skips: "out" (T x T scores: outputs above the diagonal are left
    unwritten), "a_lower" / "a_upper" (a is T x T and zero above / below its diagonal: each row
    tile's K range stops / starts there); CPU kernels compute the whole product."""
    B, H, M, K = a.shape
    N = b.shape[-1]
    if (b.shape != (B, H, K, N) or out.shape != (B, H, M, N) or out.strides[-1] != 1
            or out.dtype != float32):
        raise ShapeError(f"matmul_into: [B, H, M, K] @ [B, H, K, N] into a row-contiguous "
                         f"[B, H, M, N] f32 view, got {a.shape} @ {b.shape} into {out.shape} "
                         f"with strides {out.strides}")
    if part is not None and (part not in CAUSAL_PARTS or M != (N if part == "out" else K)):
        raise ShapeError(f"matmul_into: part {part!r} needs T x T scores (out) or a T x T a, "
                         f"got {a.shape} @ {b.shape}")
    check_same_device(a, b, out, op="matmul_into")
    if not out.numel():
        return out
    if K == 0:  # an empty sum
        return fill_(out, 0.0)
    a, b = (t if t.dtype == float32 else cast(t, float32) for t in (a, b))
    two = _two_level(a, b, 2)  # (one outer dim always has a stride)
    cst = (out.strides[0] if B > 1 else 0, out.strides[1] if H > 1 else 0, out.strides[2])
    _launch(a, b, out, M, N, K, two[0], two[1], B * H, inner=two[2:], cst=cst,
            r16=autocast_dtype() == float16, causal=CAUSAL_PARTS.get(part, 0))
    return out


def _unrolled(tm: int, bk: int, tn: int | None = None, half: bool = False,
              ak: bool = False, fe: int = 1, pipe: bool = False) -> dict:
    """Register-level code of the kernel, unrolled with literal indices: shader compilers keep
    such arrays in registers, while a loop index can push them to (slow) local memory. With
    ``half`` the FMAs run on vec4<f16> partial sums, added into the f32 accumulators every
    ``fe`` k steps (f16 runs of fe * BK products);
    with ``ak`` A's tile is [m][k] and each row's vec4 covers 4 k (4 k per pass); ``pipe``
    (with ``ak``) unrolls the passes and reads pass p + 1's operands during pass p's FMAs: the
    step's barrier lines all warps up, so no other warp hides their shared-memory latency."""
    tn = tm if tn is None else tn
    qa, qb = tm // 4, tn // 4
    la, lb = 16 * tm * bk // 1024, 16 * tn * bk // 1024
    ind = " " * 12
    acc, vt = ("acch", "vec4<f16>") if half else ("acc", "vec4<f32>")
    if ak:  # 4 k per pass: a{row} = 4 k of one row, b{c}_{j} = quad j of k + c
        passes = range(bk // 4) if pipe else ["kk / 4u"]

        def loads(p, ab="ab"):  # pass p's operands, named by p when unrolled
            n, ka, kb = (f"{p}_", f"{p}u", f"{4 * p}u") if pipe else ("", "kk / 4u", "kk")
            return ([f"let a{n}{i}{r} = As[ba + {ka} + (ty * 4u + {64 * i + r}u) * TQPA];"
                     for i in range(qa) for r in range(4) if "a" in ab]
                    + [f"let b{n}{c}_{j} = Bs[bb + ({kb} + {c}u) * TQPB + tx + {16 * j}u];"
                       for c in range(4) for j in range(qb) if "b" in ab])
        fma = loads(passes[0])
        for p in passes:
            n = f"{p}_" if pipe else ""
            for c, cc in enumerate("xyzw"):
                if pipe and c in (1, 2) and p + 1 < len(passes):  # B after the first k, A after
                    fma += loads(p + 1, {1: "b", 2: "a"}[c])  # the second (4% over both first)
                for i in range(qa):
                    for r in range(4):
                        for j in range(qb):
                            k = (i * 4 + r) * qb + j
                            fma.append(f"{acc}[{k}] = fma({vt}(a{n}{i}{r}.{cc}), b{n}{c}_{j}, "
                                       f"{acc}[{k}]);")
        head = "{" if pipe else "for (var kk = 0u; kk < BK; kk += 4u) {"
    else:
        fma = ["let ka = ba + kk * TQPA;", "let kb = bb + kk * TQPB;"]
        fma += [f"let a{i} = As[ka + ty + {16 * i}u];" for i in range(qa)]
        fma += [f"let b{j} = Bs[kb + tx + {16 * j}u];" for j in range(qb)]
        for i in range(qa):
            for r, c in enumerate("xyzw"):
                for j in range(qb):
                    k = (i * 4 + r) * qb + j
                    fma.append(f"{acc}[{k}] = fma({vt}(a{i}.{c}), b{j}, {acc}[{k}]);")
        head = "for (var kk = 0u; kk < BK; kk++) {"
    n = tm * tn // 4
    flush = [f"if (((k0 - kbeg) / BK) % {fe}u == {fe - 1}u || !more) {{"]
    flush += [f"    acc[{k}] += vec4<f32>(acch[{k}]); acch[{k}] = vec4<f16>(0.0);"
              for k in range(n)] + ["}"]
    stage0, pre, stage = [], [], []
    for l in range(max(la, lb)):
        qv = f"{256 * l}u + t"
        if l < la:
            stage0.append(f"stage_a({qv}, 0u, fetch_a({qv}, row0, kbeg, M, K, a0, ars, acs));")
            pre.append(f"ra[{l}] = fetch_a({qv}, row0, k1, M, K, a0, ars, acs);")
            stage.append(f"stage_a({qv}, na, ra[{l}]);")
        if l < lb:
            stage0.append(f"stage_b({qv}, 0u, fetch_b({qv}, col0, kbeg, N, K, b0, brs, bcs));")
            pre.append(f"rb[{l}] = fetch_b({qv}, col0, k1, N, K, b0, brs, bcs);")
            stage.append(f"stage_b({qv}, nb, rb[{l}]);")
    store = []
    for i in range(qa):
        for r in range(4):
            store.append(f"let m{i}{r} = row0 + (ty + {16 * i}u) * 4u + {r}u;")
            store.append(f"if (m{i}{r} < M) {{")
            for j in range(qb):
                k = (i * 4 + r) * qb + j
                store.append(f"    store_quad(c0 + m{i}{r} * cr, col0 + (tx + {16 * j}u) * 4u, N, "
                             f"full, acc[{k}]);")
            store.append("}")
    return {"FMA": "\n".join([" " * 8 + head] + [ind + x for x in fma] + [" " * 8 + "}"]),
            "FLUSH": "\n".join(" " * 8 + x for x in flush) if half else "",
            "ACCH": f"    var acch: array<vec4<f16>, {n}>;" if half else "",
            "STAGE0": "\n".join("    " + x for x in stage0),
            "PREFETCH": "\n".join(ind + x for x in pre),
            "STAGE": "\n".join(ind + x for x in stage),
            "STORE": "\n".join("    " + x for x in store)}


@functools.lru_cache(maxsize=256)
def kernel_for(tm: int, bk: int, am: int, bm: int, swz: int = 0, pad: int = 1,
               f16: bool = False, epilogue: tuple = (None, False, False), tn: int | None = None,
               split: int = 1, exact: bool = False, half: bool = False,
               ak: bool = False, fe: int = 1, r16: bool = False, causal: int = 0,
               two: bool = False, pipe: bool = False, exmn: bool = False) -> Kernel:
    """The matmul specialisation: TM x TN outputs per invocation (tiles 16*TM x 16*TN; TN
    defaults to TM), k step BK, load modes of A and B, launch-order swizzle and workgroup-tile
    row padding (see shaders/matmul.wgsl; one quad of padding keeps transposing stores free of
    bank conflicts); split-K slices (partials stored as f32), no range checks (``exact``; with
    ``exmn`` only k is checked),
    packed f16 FMAs (``half``, f16 storage only; added into f32 every ``fe`` k steps), A's tile
    staged k-contiguous (``ak``, A in load mode 0 only), f32 operands rounded to f16 as they
    are read (``r16``: autocast), a causal part (``causal``: CAUSAL_PARTS; no split-K), a
    two-level batch and strided C (``two``; no split-K, no epilogue).
    ``epilogue``: (activation template of {z} or None, bias?, residual?)."""
    tn = tm if tn is None else tn
    la, lb = 16 * tm * bk // 1024, 16 * tn * bk // 1024
    if la < 1 or lb < 1 or (16 * tm * bk) % 1024 or (16 * tn * bk) % 1024 or bk % 4 or tm % 4 \
            or tn % 4:
        raise ValueError(f"matmul tile {16 * tm}x{16 * tn} with k step {bk} does not split into "
                         f"whole quads per invocation")
    if half and not (f16 or r16):
        raise ValueError("packed f16 matmul math needs f16 operands (or r16)")
    if ak and am != 0:
        raise ValueError("a k-contiguous A tile needs A in load mode 0 (K contiguous)")
    t = "f16" if f16 else "f32"
    tqpa = bk // 4 if ak else 4 * tm + pad
    abuf = 16 * tm * tqpa if ak else bk * tqpa
    return Kernel.of("matmul", TILEM=16 * tm, TILEN=16 * tn, TQA=4 * tm, TQB=4 * tn,
                     TQPA=tqpa, TQPB=4 * tn + pad, BK=bk, LOADA=la, LOADB=lb, ABUF=abuf,
                     AK=str(bool(ak)).lower(), SMEMA=2 * abuf, SMEMB=2 * bk * (4 * tn + pad), T=t,
                     TC="f32" if split > 1 else t, S="f16" if half else "f32",
                     F16=int(f16 or r16), LD=_load(r16, "f16" if half else "f32"),
                     ACC=tm * tn // 4, AM=am, BM=bm, SWZ=swz, SPLIT=split,
                     EXACT=str(bool(exact)).lower(), EXMN=str(bool(exmn)).lower(),
                     CAUSAL=causal, TWO=str(two).lower(),
                     **{"EPI_PRE": "", **_epilogue_defines(*epilogue)},
                     **_unrolled(tm, bk, tn, half, ak, fe if half else 1, pipe and ak))


def _load(r16: bool, s: str) -> str:
    """The shaders' ld(v): an operand quad as the kernel computes with it (R16 into f32 tiles:
    rounded to f16 in integer arithmetic, common.wgsl, which no driver folds away; f16 tiles
    round by their own conversion, which is stored)."""
    return f"vec4<{s}>(round_f16x4_(v))" if r16 and s == "f32" else f"vec4<{s}>(v)"


def _epilogue_defines(act, bias: bool, residual: bool, pre: bool = False) -> dict:
    """EPI (and its bindings after C): act(x + bias + residual). ``pre`` (no residual): also
    store the activation's argument into PRE (offset in word 14), which the
    activation's backward reads; EPI_PRE is then the statement that stores it."""
    z, decls = "x", []
    if bias:
        decls.append("@group(0) @binding(4) var<storage, read> BIAS: array<f32>;")
        z += " + BIAS[pu(13u) + n]"
    if residual:
        decls.append(f"@group(0) @binding({4 + bias}) var<storage, read> RES: array<f32>;")
        z += " + RES[i - pu(11u) + pu(14u)]"
    if not pre:
        return {"EPI_DECLS": "\n".join(decls), "EPI": act.format(z=z) if act else z}
    if residual or not act:
        raise ValueError("matmul epilogue: storing the pre-activation needs an activation and "
                         "no residual")
    decls.append(f"@group(0) @binding({4 + bias}) var<storage, read_write> PRE: array<f32>;")
    return {"EPI_DECLS": "\n".join(decls), "EPI": act.format(z="z"),
            "EPI_PRE": f"let z = {z}; PRE[i - pu(11u) + pu(14u)] = z; "}


def _fin_code(t: str, acc: bool, epilogue: tuple, v4: bool, rtex: bool = False) -> str:
    """FIN of matmul_cpu.wgsl: C's declaration and the stored value, fin(i, n, x) per element
    or (``v4``, f32) fin4(i, n, x) per quad of a row, the epilogue's operands read as quads
    (``rtex``: the residual from a texture holding a copy of it, ops/texread.py)."""
    act, bias, residual, *pre = epilogue
    if not v4:
        d = {"EPI_PRE": "", **_epilogue_defines(act, bias, residual, *pre)}
        c = f"{t}(epi(i, n, x + f32(C[i])))" if acc else f"{t}(epi(i, n, x))"
        return (f"@group(0) @binding(3) var<storage, read_write> C: array<{t}>;\n"
                f"{d['EPI_DECLS']}\n"
                f"fn epi(i: u32, n: u32, x: f32) -> f32 {{ {d['EPI_PRE']}return {d['EPI']}; }}\n"
                f"fn fin(i: u32, n: u32, x: f32) -> {t} {{ return {c}; }}")
    if t != "f32" or (pre and (residual or not act)):
        raise ValueError("matmul_cpu: quad stores are f32 only; the pre-activation store needs "
                         "an activation and no residual")
    decls = ["@group(0) @binding(3) var<storage, read_write> C: array<vec4<f32>>;"]
    z = "x" + (" + C[i >> 2u]" if acc else "")
    e = "(i - pu(11u) + pu(14u)) >> 2u"  # the quad's index in RES / PRE
    if bias:  # (the caller loads the column quad's bias once: bq, _cpu_code)
        decls.append("@group(0) @binding(4) var<storage, read> BIAS: array<vec4<f32>>;")
        z += " + b"
    if residual:
        decls.append(texread.decls({"RES": 4 + bias}, rtex))
        z += f" + ld_RES({e})"
    body = [f"let z = {z};"]
    if pre:
        decls.append(f"@group(0) @binding({4 + bias}) var<storage, read_write> PRE: "
                     "array<vec4<f32>>;")
        body.append(f"PRE[{e}] = z;")
    ret = "z" if not act else "vec4<f32>(" + ", ".join(
        act.format(z=f"z.{q}") for q in _Q) + ")"
    args = ", b: vec4<f32>" if bias else ""
    return "\n".join(decls) + (f"\nfn fin4(i: u32, n: u32, x: vec4<f32>{args}) -> vec4<f32> {{"
                               "\n    " + "\n    ".join(body) + f"\n    return {ret};\n}}")


def linear_2d(x: Tensor, wt: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
              activation: str | None = None, r16: bool = False, pre: Tensor | None = None
              ) -> Tensor:
    """act(x @ wt + bias + residual) for float32 2-D x [M, K] and wt [K, N] (any strides), a
    contiguous bias [N] and residual [M, N], in one kernel. ``activation`` is a WGSL template
    of {z} (e.g. "max({z}, 0.0)"); ``r16``: the product of x and wt rounded to f16 (autocast).
    ``pre`` (an activation, no residual): a contiguous float32 [M, N] tensor that also
    receives the activation's argument x @ wt + bias, for its backward.
    No autograd: fused.linear records the node."""
    M, K = x.shape
    N = wt.shape[1]
    out = Tensor.empty((M, N), x.device, float32)
    if not out.numel():
        return out
    if K == 0:  # a zero product: only the epilogue is left, in a map kernel
        ins = [t for t in (bias, residual) if t is not None]
        z = " + ".join("ab"[:len(ins)]) or "0.0"
        if pre is not None:
            run_map(z, pre, ins)
        return run_map(activation.format(z=z) if activation else z, out, ins)
    _launch(x, wt, out, M, N, K, 0, 0, 1, bias=bias, residual=residual, activation=activation,
            r16=r16, pre=pre)
    return out


def _mode(off, sb, rs, cs, rows, cols, along_rows_ok=True):
    """Load mode of an operand viewed as (rows x cols) where rows is the output dimension and
    cols is K: 0 if K is contiguous, 1 if the output dimension is, else 2 (gathers). vec4 loads
    need 16-byte aligned quads, so offsets and the other strides must be multiples of 4 and the
    contiguous extent a multiple of 4."""
    aligned = off % 4 == 0 and sb % 4 == 0
    if aligned and (cs == 1 or cols == 1) and (rs % 4 == 0 or rows == 1) and cols % 4 == 0:
        return 0
    if aligned and (rs == 1 or rows == 1) and (cs % 4 == 0 or cols == 1) and rows % 4 == 0:
        return 1
    return 2


def _pick_tile(dev, M, N, nbatch) -> tuple:
    """(TM, BK, SWZ): on GPUs 8x8 per invocation (128x128 tiles) once there are enough tiles
    to fill the GPU, 4x4 (64x64 tiles) for small products so that they still spread over all
    cores. On CPU adapters this kernel runs only where forced (CPU_KERNEL False): 64x64
    tiles, fewer live registers per SIMD lane; _cpu_tile picks the CPU kernel's blocks."""
    if is_cpu_adapter(dev):
        return 4, 16, 0
    big = nbatch * (-(-M // 128)) * (-(-N // 128))
    if M >= 128 and N >= 128 and big >= BIG_TILE_MIN:
        return 8, BK_BIG, SWIZZLE
    return 4, 16, SWIZZLE


# Tuned on an H100 over Vulkan (BENCHMARKS.md): 4096^2 ran 31.7 TFLOP/s with 8x8/BK 8/swizzle
# 8, 8x8/BK 16 22.4, 4x4/BK 16 28.9; at 1024^2 the 64x64 tiles win (10.7 vs 6.8 TFLOP/s).
BIG_TILE_MIN = 256  # 128x128 tiles needed before the 8x8 kernel is used (132 SMs, 2 per SM)
BK_BIG = 8
SWIZZLE = 8  # tile rows per workgroup group (0: plain row-major launch order)


# GPU kernel variants, by name: keyword arguments of kernel_for (tm, bk, swz; tn: columns per
# invocation, default tm; split: split-K slices (2-4, plain products only); exact: no range
# checks where the shape divides into the tiles; half: packed f16 FMAs, f16 operands only (fe:
# k steps of f16 sums between adds into the f32 accumulators, default 1); ak:
# A's tile kept k-contiguous where A is (no transposing stores: A @ B and A @ B.T layouts)).
# A sweep of each against torch on the H100 chose the table below (BENCHMARKS.md, findings;
# "default" there: _pick_tile's 64x64 tiles (t64e without exact) or 128x128 tiles (t128e
# without exact)).
VARIANTS = {
    "t64e": dict(tm=4, bk=16, swz=8, exact=True),
    "t64k32": dict(tm=4, bk=32, swz=8, exact=True),
    "t128e": dict(tm=8, bk=8, swz=8, exact=True),
    "t128k16": dict(tm=8, bk=16, swz=8, exact=True),
    "t128ak": dict(tm=8, bk=8, swz=8, exact=True, ak=True),
    "t128k16ak": dict(tm=8, bk=16, swz=8, exact=True, ak=True),
    "t128k24akp": dict(tm=8, bk=24, swz=8, exact=True, ak=True, pad=0, pipe=True),
    "t64ak": dict(tm=4, bk=16, swz=8, exact=True, ak=True),
    "t128x256ak": dict(tm=8, tn=16, bk=8, swz=8, exact=True, ak=True),
    "t128s2ak": dict(tm=8, bk=8, swz=8, split=2, exact=True, ak=True),
    "t64s4ak": dict(tm=4, bk=16, swz=8, split=4, exact=True, ak=True),
    "t128x256": dict(tm=8, tn=16, bk=8, swz=8, exact=True),
    "t256x128": dict(tm=16, tn=8, bk=8, swz=8, exact=True),
    "t64x128": dict(tm=4, tn=8, bk=16, swz=8, exact=True),
    "t128x64": dict(tm=8, tn=4, bk=16, swz=8, exact=True),
    "t128x192": dict(tm=8, tn=12, bk=16, swz=8, exact=True),
    "t128x192ak": dict(tm=8, tn=12, bk=16, swz=8, exact=True, ak=True),
    "t128x192s4": dict(tm=8, tn=12, bk=16, swz=8, split=4, exact=True, ak=True),
    "t64s2": dict(tm=4, bk=16, swz=8, split=2, exact=True),
    "t64s3": dict(tm=4, bk=16, swz=8, split=3, exact=True),
    "t64s4": dict(tm=4, bk=16, swz=8, split=4, exact=True),
    "t128s2": dict(tm=8, bk=8, swz=8, split=2, exact=True),
    "t128s4": dict(tm=8, bk=8, swz=8, split=4, exact=True),
    "h64": dict(tm=4, bk=16, swz=8, exact=True, half=True),
    "h128": dict(tm=8, bk=8, swz=8, exact=True, half=True),
    "h128k16": dict(tm=8, bk=16, swz=8, exact=True, half=True),
    "h128ak": dict(tm=8, bk=8, swz=8, exact=True, half=True, ak=True),
    "h128k16ak": dict(tm=8, bk=16, swz=8, exact=True, half=True, ak=True),
    "h128x256": dict(tm=8, tn=16, bk=8, swz=8, exact=True, half=True),
    "h128x256ak": dict(tm=8, tn=16, bk=8, swz=8, exact=True, half=True, ak=True),
    "h64k32": dict(tm=4, bk=32, swz=8, exact=True, half=True),
    "h128s2": dict(tm=8, bk=8, swz=8, split=2, exact=True, half=True),
    "h64s4": dict(tm=4, bk=16, swz=8, split=4, exact=True, half=True),
    "h128f4": dict(tm=8, bk=8, swz=8, exact=True, half=True, fe=4),
    "h128akf4": dict(tm=8, bk=8, swz=8, exact=True, half=True, ak=True, fe=4),
    "h128k16f2": dict(tm=8, bk=16, swz=8, exact=True, half=True, fe=2),
    "h128x256akf4": dict(tm=8, tn=16, bk=8, swz=8, exact=True, half=True, ak=True, fe=4),
}

# Which variant runs, per (adapter class, operand dtype): rules tried in order, the first that
# matches names the variant ("default": _pick_tile's kernel; no entry or no match: the default):
#   (bound, name)                       nbatch * M * N <= bound
#   ("split", min_k, below, want, names) K >= min_k and fewer than ``below`` 64x64 output tiles:
#                                       split-K, s = ceil(want / tiles) slices (capped by the
#                                       names, which are for s = 2, 3, ...)
#   ("tile", tm, tn, min_groups, name[, min_k]) a tm x tn tile leaves >= min_groups workgroups
#                                       and fills >= 3/4 of its padded output (and K >= min_k)
#   ("wave", tm, tn, slots, min_k, name) K >= min_k and tm x tn tiles cover M x N exactly, in
#                                       >= 0.9 waves of ``slots`` resident workgroups (tiles
#                                       times the variant's split-K slices), the last wave >= 3/4
#                                       full; a split variant only where the tiles alone are
#                                       under 0.9 waves
# NVIDIA f32 from the H100 sweep (square sizes) and the GPT-2-width step's own products
# (BENCHMARKS.md): few output tiles over a long K (weight gradients) want split-K; the H100
# holds one 128x128 or 128x192 workgroup per SM (264 tiles take twice the time of 132), so
# 128x192 tiles win where they fill whole waves (4096 x 768 / 2304 / 3072: 37.5-40.8 TFLOP/s
# against 32.1-35.7), 128x128 tiles pay in whole waves or with >= ~2 waves of them, with k
# steps of 24 and their passes pipelined from K = 768 (4096^2: 42.7 against 37.0 TFLOP/s for k
# steps of 16; at K = 64, attention's scores, 21.6 against 23.6), 64-wide outputs (attention
# heads) want 128x64 tiles.
MATMUL_TABLE: dict = {
    ("nvidia", "f32"): ((262144, "t64s2"), ("wave", 128, 192, 132, 2048, "t128x192s4"),
                        ("wave", 128, 128, 132, 2048, "t128k24akp"),
                        ("split", 2048, 600, 800, ("t64s2", "t64s3", "t64s4")),
                        ("wave", 128, 192, 132, 0, "t128x192ak"),
                        ("tile", 128, 128, 240, "t128k24akp", 768),
                        ("tile", 128, 128, 240, "t128k16ak"), ("tile", 128, 64, 128, "t128x64"),
                        (1 << 62, "t64e")),
    ("nvidia", "f16"): ((262144, "t64s2"), (1048576, "h64k32"), (1 << 62, "h64")),
}


def adapter_class(dev) -> str:
    """'cpu', 'nvidia', 'amd', 'intel', 'apple' or 'gpu': the key of MATMUL_TABLE."""
    cls = getattr(dev, "_adapter_class", None)
    if cls is None:
        cls = "cpu" if is_cpu_adapter(dev) else "gpu"
        info = dev.adapter_info
        name = f"{info.get('vendor', '')} {info.get('device', '')}".lower()
        for c, ids in (("nvidia", (0x10DE,)), ("amd", (0x1002, 0x1022)), ("intel", (0x8086,)),
                       ("apple", (0x106B,))):
            if cls == "gpu" and (info.get("vendor_id", 0) in ids or c in name):
                cls = c
        dev._adapter_class = cls
    return cls


def _pick_variant(dev, M, N, nbatch, f16: bool, K: int = 0) -> dict | None:
    rows = MATMUL_TABLE.get((adapter_class(dev), "f16" if f16 else "f32"), ())
    groups = lambda tm, tn: nbatch * -(-M // tm) * -(-N // tn)
    for row in rows:
        if row[0] == "split":
            _, min_k, below, want, names = row
            t64 = groups(64, 64)
            if K >= min_k and t64 < below:
                return VARIANTS[names[min(len(names) + 1, max(2, -(-want // t64))) - 2]]
        elif row[0] == "wave":
            _, tm, tn, slots, min_k, name = row
            split = VARIANTS[name].get("split", 1)
            g = groups(tm, tn) * split
            if K < min_k or (split > 1 and 10 * g >= 9 * slots * split):
                continue
            if M % tm == 0 and N % tn == 0 and 10 * g >= 9 * slots \
                    and 4 * ((g - 1) % slots + 1) >= 3 * slots:
                return VARIANTS[name]
        elif row[0] == "tile":
            _, tm, tn, min_groups, name, *min_k = row
            g = groups(tm, tn)
            if K >= sum(min_k) and g >= min_groups and 4 * M * N >= 3 * g * tm * tn // nbatch:
                return VARIANTS.get(name)
        elif nbatch * M * N <= row[0]:
            return VARIANTS.get(row[1])
    return None


# CPU adapters (shaders/matmul_cpu.wgsl): outputs per invocation (TM x TN) and invocations per
# workgroup (WGX along n, WGY along m), from a sweep on lavapipe (AVX2; BENCHMARKS.md, findings).
# K per pass of the CPU kernel (element-wise, vec4): llvmpipe ends an invocation's loops after
# 65,535 back-edges in all; a vec4 step covers 4 K.
CPU_KPASS = (65_000, 260_000)
CPU_K1_BLOCK = 256  # blocks of this many outputs and more step K one at a time (compile time)
CPU_KERNEL = None  # None: per adapter type; True/False force it (tests cover both kernels)
CPU_TEX = None  # None: texture operands on CPU adapters; True/False force them
# Smaller products keep storage operands: there the two texture copies cost about what they
# save (4x4 @ 4x4: 0.5x, 4x64 @ 64x64 .. 32x64 @ 64x64: 0.8-1.6x, 128x64 @ 64x64: 3.4-4x;
# BENCHMARKS.md).
CPU_TEX_MIN = 1 << 18
CPU_WG = (4, 4)  # WGX, WGY
# Output sides from this long get 16-wide blocks: at 64 (1024x256 @ 256x64, 64x1024 @ 1024x64,
# ...: the GPT-default shapes) they ran 1.3-2.8x the 8-wide ones (fewer lanes busy, twice the
# FMAs per load); BENCHMARKS.md, lavapipe section.
CPU_SIDE16 = 64
CPU_FLAT = (1, 4, 1, 64, 1)  # tiny batched matrices: one row an invocation, 64 a workgroup
CPU_V4 = None  # None: C stored a quad at a time where aligned (f32); False: per element
CPU_TEX_WG = 8  # invocations a workgroup with texture operands: one AVX2 SIMD vector
CPU_SG = None  # None: A's rows shared over the subgroup where cpu_subgroup knows its size
# Texture operands: 16-row blocks where they still make this many workgroups (work for every
# CPU thread), else 8 (64x1024 @ 1024x64, A transposed: 7.3 vs 4.3 GFLOP/s; BENCHMARKS.md)
CPU_TEX_GROUPS = 16


def use_cpu_kernel(dev) -> bool:
    return is_cpu_adapter(dev) if CPU_KERNEL is None else CPU_KERNEL


def cpu_subgroup(dev) -> int:
    """Lanes of a subgroup where a CPU adapter's subgroup size is known: llvmpipe's is its
    vector width ("llvmpipe (LLVM 15.0.6, 256 bits)": 8 f32 lanes); 0 elsewhere, without the
    subgroup feature, or with CPU_SG False."""
    if CPU_SG is False or "subgroup" not in dev.features:
        return 0
    lanes = getattr(dev, "_cpu_lanes", None)  # (asked on every CPU launch: parsed once)
    if lanes is None:
        m = re.search(r"llvmpipe\b.*\b(\d+) bits", str(dev.adapter_info.get("device", "")))
        lanes = dev._cpu_lanes = int(m.group(1)) // 32 if m else 0
    return lanes


def use_cpu_textures(dev, f16: bool, work: int = CPU_TEX_MIN) -> bool:
    """f32 operands go through textures on CPU adapters (CPU_TEX None) for products of at least
    CPU_TEX_MIN multiply-adds (``work``); wr.jit captures replay the texture copies too."""
    on = is_cpu_adapter(dev) and work >= CPU_TEX_MIN if CPU_TEX is None else CPU_TEX
    return on and not f16


def _cpu_tile(M: int, N: int, nbatch: int, tex: bool = False, sg: bool = False) -> tuple:
    """(TM, TN, WGX, WGY, FLAT, TEX, SG). Storage operands: 16 x 16 blocks (the most FMAs per
    loaded value that llvmpipe still compiles in seconds) where the output has enough of them,
    smaller ones on thin sides so that fewer lanes idle. Texture operands (cheaper loads):
    16 x 8 blocks (8 x 8 where that leaves few workgroups), 8 invocations along n (fewer on
    narrow outputs, the rest along m); with A's rows shared over a subgroup of CPU_TEX_WG lanes
    (``sg``: A read as vec4) 32 x 8 blocks (32 x 4 on outputs under 64 wide: every lane busy;
    16 or 8 rows where that leaves few workgroups; 32 x 8 ran 1.02-1.4x 32 x 4 on 512^2, 256^2
    and a training step's products, 32 x 16 below 32 x 8: BENCHMARKS.md).
    Batches of matrices of a few rows run FLAT (lanes over all batches' rows).
    BENCHMARKS.md (findings) has the sweep that chose them."""
    if nbatch > 1 and 8 * M <= CPU_FLAT[3]:
        return CPU_FLAT + (tex, False)
    groups = lambda tm, tn, wgx, wgy: nbatch * -(-N // (tn * wgx)) * -(-M // (tm * wgy))
    if sg and N > 4 * (CPU_TEX_WG - 1):  # every lane of the subgroup on a column quad
        tn = 8 if N >= 8 * CPU_TEX_WG else 4  # two quads a lane where all 8 lanes get them
        tm = next((t for t in (32, 16) if groups(t, tn, CPU_TEX_WG, 1) >= CPU_TEX_GROUPS), 8)
        return (tm, tn, CPU_TEX_WG, 1, 0, True, True)
    if tex:
        tn = 8 if N >= 32 else 4
        wgx = min(CPU_TEX_WG, 1 << (-(-N // tn) - 1).bit_length())
        wgy = CPU_TEX_WG // wgx
        tm = 16 if M >= 64 and groups(16, tn, wgx, wgy) >= CPU_TEX_GROUPS else \
            8 if M >= 32 else 4
        return (tm, tn, wgx, wgy, 0, True, False)
    side = lambda d: 16 if d >= CPU_SIDE16 else 8 if d >= 32 else 4
    return (side(M), side(N)) + CPU_WG + (0, False, False)


_Q = "xyzw"


def _cpu_code(tm: int, tn: int, am: int, bm: int, vec: bool, k4: bool, t: str,
              sg: int = 0, v4: bool = False, bias: bool = False) -> dict:
    """Register code of matmul_cpu.wgsl, unrolled with literal indices (every accumulator and
    loaded value stays a named register); ``sg``: the subgroup size that shares A's rows;
    ``v4``: C stored a quad at a time (fin4), with ``bias`` each column quad's bias loaded once
    (a storage read costs llvmpipe a loop over the lanes: not once per row)."""
    setup = [f"let ra{i} = abase + min(m0 + {i}u, lm) * ar;" for i in range(tm)]
    if sg and am == 0:  # lane l fetches rows m0 + l, m0 + sg + l, ...
        setup += [f"let sa{j} = abase + min(m0 + {sg * j}u + lane, lm) * ar;"
                  for j in range(tm // sg)]
    if sg and am == 1:  # lane l fetches the quad of rows m0 + 4l ..
        setup.append("let sq = abase + min(m0 + 4u * lane, lqm);")
    setup += [f"let cb{j} = bbase + min(n0 + {j}u, ln) * bc;" for j in range(tn)]
    if vec and am == 1:
        setup += [f"let mq{q} = abase + min(m0 + {4 * q}u, lqm);" for q in range(tm // 4)]
    if vec and bm == 0:
        setup += [f"let nq{q} = bbase + min(n0 + {4 * q}u, lqn);" for q in range(tn // 4)]
    setup += [f"var c{i}_{q} = vec4<f32>(0.0);" for i in range(tm) for q in range(tn // 4)]

    def fmas(a_of, bq_of, rs, rows=range(tm)):  # each accumulator's k steps in a row
        return [f"c{i}_{q} = fma(vec4<f32>({a_of(i, r)}), {bq_of(r, q)}, c{i}_{q});"
                for i in rows for q in range(tn // 4) for r in rs]

    def bcols(name, q, suffix=""):
        return "vec4<f32>(" + ", ".join(f"{name}{4 * q + e}{suffix}" for e in range(4)) + ")"

    body4 = []
    if k4:  # B's loads, A's shared texels, then per row group its A values and its FMAs
        if am == 0 and sg:
            body4 += [f"let s{j} = ld(qa((sa{j} + k) >> 2u));" for j in range(tm // sg)]
            a_defs = lambda g: [f"let a{g} = subgroupBroadcast(s{g // sg}, {g % sg}u);"]
        elif am == 0:
            a_defs = lambda g: [f"let a{g} = ld(qa((ra{g} + k) >> 2u));"]
        elif sg:
            body4 += [f"let s{r} = ld(qa((sq + (k + {r}u) * ac) >> 2u));"
                      for r in range(4)]
            a_defs = lambda g: [f"let a{g}_{r} = subgroupBroadcast(s{r}, {g}u);"
                                for r in range(4)]
        else:
            a_defs = lambda g: [f"let a{g}_{r} = ld(qa((mq{g} + (k + {r}u) * ac) >> 2u));"
                                for r in range(4)]
        a_of = (lambda i, r: f"a{i}.{_Q[r]}") if am == 0 else (
            lambda i, r: f"a{i // 4}_{r}.{_Q[i % 4]}")
        if bm == 0:
            body4 += [f"let b{r}_{q} = ld(qb((nq{q} + (k + {r}u) * br) >> 2u));"
                      for r in range(4) for q in range(tn // 4)]
            bq_of = lambda r, q: f"b{r}_{q}"
        else:
            body4 += [f"let b{j} = ld(qb((cb{j} + k) >> 2u));" for j in range(tn)]
            bq_of = lambda r, q: bcols("b", q, "." + _Q[r])
        # A row group's values are defined right before its FMAs, and each accumulator takes
        # its 4 k steps in a row: short live ranges (llvmpipe keeps every lane value of a
        # vec4 in its own vector register; TM x TN accumulators already spill)
        per = 1 if am == 0 else 4
        for g in range(tm // per):
            body4 += a_defs(g) + fmas(a_of, bq_of, range(4), range(g * per, (g + 1) * per))
    body1 = [f"let a{i} = ea(ra{i} + k * ac);" for i in range(tm)]
    if vec and bm == 0:  # B's quads along n, one k at a time
        body1 += [f"let b{q} = ld(qb((nq{q} + k * br) >> 2u));" for q in range(tn // 4)]
        body1 += fmas(lambda i, r: f"a{i}", lambda r, q: f"b{q}", [0])
    else:
        body1 += [f"let b{j} = eb(cb{j} + k * br);" for j in range(tn)]
        body1 += fmas(lambda i, r: f"a{i}", lambda r, q: bcols("b", q), [0])
    store = []
    if v4 and bias:  # (a quad past N loads the last one; its sums are never stored)
        store += [f"let bq{q} = BIAS[(pu(13u) + min(n0 + {4 * q}u, N - 4u)) >> 2u];"
                  for q in range(tn // 4)]
    for i in range(tm):
        store.append(f"if (m0 + {i}u < M) {{\n    let r{i} = c0 + (m0 + {i}u) * cr;")
        for j in range(0, tn, 4) if v4 else range(tn):  # v4: N % 4 == 0, whole quads
            n = f"n0 + {j}u"
            store.append(f"    if ({n} < N) {{ C[(r{i} + {n}) >> 2u] = fin4(r{i} + {n}, {n}, "
                         f"c{i}_{j // 4}{f', bq{j // 4}' if bias else ''}); }}" if v4 else
                         f"    if ({n} < N) {{ C[r{i} + {n}] = fin(r{i} + {n}, {n}, "
                         f"c{i}_{j // 4}.{_Q[j % 4]}); }}")
        store.append("}")
    ind = lambda lines, n: "\n".join(" " * n + x.replace("\n", "\n" + " " * n) for x in lines)
    return {"SETUP": ind(setup, 4), "BODY4": ind(body4, 8), "BODY1": ind(body1, 8),
            "STORE": ind(store, 4)}


def _operand_decls(t: str, tex: bool) -> str:
    """A and B (bindings 1, 2) with their quad loads qa / qb: storage arrays, or (``tex``)
    rgba32float textures of TEX_W texels a row."""
    if not tex:
        return "\n".join(f"@group(0) @binding({i}) var<storage, read> {x}: array<vec4<{t}>>;\n"
                         f"fn q{x.lower()}(q: u32) -> vec4<{t}> {{ return {x}[q]; }}"
                         for i, x in ((1, "A"), (2, "B")))
    return "\n".join(texture_loader(x, i, f"q{x.lower()}") for i, x in ((1, "A"), (2, "B")))


@functools.lru_cache(maxsize=128)
def cpu_kernel_for(tm: int, tn: int, wgx: int, wgy: int, am: int, bm: int, flat: bool = False,
                   f16: bool = False, epilogue: tuple = (None, False, False),
                   acc: bool = False, tex: bool = False, sg: bool = False,
                   r16: bool = False, v4: bool = False, rtex: bool = False) -> Kernel:
    """The barrier-free CPU-adapter matmul (shaders/matmul_cpu.wgsl): TM x TN outputs per
    invocation, WGX x WGY invocations per workgroup, load modes AM/BM (2: element-wise),
    operands in storage buffers or (``tex``, f32 only) textures; ``sg``: A's rows shared over
    the subgroup (texture operands, vec4 loads, the workgroup one subgroup of WGX lanes on the
    same rows; the caller checks the subgroup size), else ignored; ``r16``: f32 operands
    rounded to f16 as they are read; ``v4``: C (f32) stored a quad at a time, which needs C's
    rows, offset and strides and the epilogue operands' offsets to be multiples of 4 (the
    caller checks them); ``rtex``: with v4, the residual read from a texture."""
    if tn % 4 or (tm % 4 and not flat) or (flat and (tm != 1 or wgx != 1)):
        raise ValueError(f"CPU matmul block {tm}x{tn} (flat={flat}) is not a supported shape")
    if tex and f16:
        raise ValueError("texture operands of the CPU matmul are f32 only")
    vec = am != 2 and bm != 2 and not (am == 1 and tm % 4)
    am, bm = (am, bm) if vec else (0, 0)
    # Texture loads compile to straight-line code, so every block size takes the 4-k body.
    k4 = vec and (tex or tm * tn < CPU_K1_BLOCK)
    sg = wgx if sg and tex and k4 and not flat and wgy == 1 and (
        tm % wgx == 0 if am == 0 else tm <= 4 * wgx) else 0
    t = "f16" if f16 else "f32"
    return Kernel.of("matmul_cpu", TM=tm, TN=tn, WGX=wgx, WGY=wgy, WG=wgx * wgy, VEC=int(k4),
                     FLAT=int(flat), T=t, F16=int(f16 or r16), ACC=int(acc),
                     LD=_load(r16, "f32"), OPERANDS=_operand_decls(t, tex),
                     SG_ARGS=",\n        @builtin(subgroup_invocation_id) lane: u32" if sg else "",
                     FIN=_fin_code(t, acc, epilogue, v4, rtex),
                     **_cpu_code(tm, tn, am, bm, vec, k4, t, sg, v4, epilogue[1]))


def _tex_operand(t: Tensor, slot: int, rows: int, cols: int, sb: int, nbatch: int,
                 inner: tuple = (1, 0)):
    """(texture view, offset) of operand ``t`` ([nbatch] x rows x cols, batch stride sb; with
    ``inner`` (n, stride) batch z at (z // n) * sb + (z % n) * stride) copied
    into the device's operand texture ``slot``: the elements the kernel reads, from the
    16-byte boundary at or below the first; offset: the first one's index there. None where
    that region does not fit (the texture's rows: TEX_W texels, at most
    max-texture-dimension-2d of them)."""
    st = (sb, inner[1], *t.strides[-2:])
    if min(st) < 0:
        return None
    first = t.offset
    last = first + sum((n - 1) * s for n, s in zip((nbatch // inner[0], *inner[:1], rows, cols),
                                                     st))
    start = first & ~3
    texels = (last - start) // 4 + 1
    rows_max = t.device.limits["max-texture-dimension-2d"]
    if start * 4 + texels * 16 > t._storage.buffer.size or -(-texels // TEX_W) > rows_max:
        return None
    return t.device.operand_texture(slot, t._storage.buffer, start * 4, texels), first - start


def _padded(t: Tensor, mode: int) -> tuple:
    """(operand, load mode): a 2-D f32 operand of load mode 2 that is a contiguous matrix or
    its transpose with rows of a length not a multiple of 4 ([128, 65] logits' gradient),
    as the same view of a copy whose rows are padded to quads, in mode 0 (its columns
    contiguous) or 1; else unchanged. The CPU kernel then loads it as quads: a K % 4 tail is
    read element-wise, and quads past M or N read the padding (never stored)."""
    if mode != 2 or t.dtype != float32:
        return t, mode
    (r, c), (sr, sc) = t.shape, t.strides
    flip = sc != 1  # the transpose of a contiguous matrix
    if (sc, sr) != ((1, c) if not flip else (r, 1)):
        return t, mode
    rows, cols = (c, r) if flip else (r, c)
    dev = t.device
    if 16 * rows * -(-cols // 4) > dev.max_binding:  # (t itself may just fit one)
        return t, mode
    key = (t._storage.version, t.offset, rows, cols, dev.recorder, dev.replays)
    got = _PADS.pop(t._storage, None)
    # A linear's backward pads its gradient once for d(x) and d(W): a pad serves the next
    # product that reads the same unchanged operand within PAD_REUSE dispatches, with no
    # replay in between (replays write buffers without a version bump) and in one capture.
    if got is None or got[0] != key or dev.dispatches - got[1] > PAD_REUSE:
        pad = Tensor.empty((rows, -(-cols // 4) * 4), dev, float32)
        view = Tensor(pad._storage, (rows, cols), (pad.shape[1], 1), 0, float32)
        run_map("a", view, [transpose(t, 0, 1) if flip else t])
        _PADS[t._storage] = (key, dev.dispatches, view)
        got = (key, 0, view)
    return (transpose(got[2], 0, 1), 1) if flip else (got[2], 0)


_PADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage -> its pad, unused
PAD_REUSE = 2


def _launch_cpu(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile, r16,
                inner=(1, 0, 0), cst=None, res=None):
    # Under the device lock: another thread's matmul must not refill the operand textures
    # between this one's copies and its dispatches.
    with a.device.lock:
        _launch_cpu_locked(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile,
                           r16, inner, cst, res)


def _launch_cpu_locked(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile,
                       r16, inner=(1, 0, 0), cst=None, res=None):
    tm, tn, wgx, wgy, flat = tile[:5]
    f16 = a.dtype == float16
    words = [M, N, K, a.offset, sa, a.strides[-2], a.strides[-1], b.offset, sb,
             b.strides[-2], b.strides[-1], out.offset]
    tex = use_cpu_textures(a.device, f16, nbatch * M * N * K) if len(tile) < 6 else (
        tile[5] and not f16)
    if tex:
        ta = _tex_operand(a, 0, M, K, sa, nbatch, inner[:2])
        tb = ta and _tex_operand(b, 1, K, N, sb, nbatch, inner[::2])
        tex = tb is not None
        if tex:
            bufs = [ta[0], tb[0]] + bufs[2:]
            words[3], words[7] = ta[1], tb[1]
    sg = tex and (tile[6] if len(tile) > 6 else True) and cpu_subgroup(a.device) == wgx
    cst = cst or (inner[0] * M * N, M * N, N)  # C's outer / inner batch and row strides
    v4 = CPU_V4 is not False and not f16 and N % 4 == 0 and all(
        w % 4 == 0 for w in (out.offset, *cst, *extra))
    # the residual ([M, N], contiguous) through a texture too (slot 2), with quad stores
    view = (res is not None and v4 and tex and texread.enabled(a.device)
            and texread.operand(res, 2, M * N))
    if view:
        bufs, extra = bufs[:3 + epi[1]] + [view] + bufs[4 + epi[1]:], [extra[0], 0]
    k = cpu_kernel_for(tm, tn, wgx, wgy, am, bm, flat, f16=f16, epilogue=epi, tex=tex, sg=sg,
                       r16=r16, v4=v4, rtex=bool(view))
    gx, gy = -(-N // (tn * wgx)), -(-M // (tm * wgy))
    if gx > MAX_WG_PER_DIM or (gy > MAX_WG_PER_DIM and not flat):
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    rows, bound = nbatch * M, bufs
    span = CPU_KPASS[dict(k.defines)["VEC"] == "1"]
    for kb in range(0, K, span):  # bound over K: under llvmpipe's loop cap, adding up in C
        if K > span:  # the first pass stores, later ones add; the epilogue runs in the last
            last = kb + span >= K
            k = cpu_kernel_for(tm, tn, wgx, wgy, am, bm, flat, f16=f16, acc=kb > 0,
                               epilogue=epi if last else (None, False, False), tex=tex, sg=sg,
                               r16=r16, v4=v4, rtex=bool(view) and last)
            bound = bufs if last else bufs[:3]
        ks = [kb, min(K, kb + span)]
        if flat:
            fx, fy, _ = groups_1d(rows, wgy)
            a.device.dispatch(k, bound, words + [0, *extra, rows, *ks, *inner, *cst],
                              (fx, fy, gx))
            continue
        for z0 in range(0, nbatch, MAX_WG_PER_DIM):
            gz = min(MAX_WG_PER_DIM, nbatch - z0)
            a.device.dispatch(k, bound, words + [z0, *extra, 0, *ks, *inner, *cst],
                              (gx, gy, gz))


def _launch(a, b, out, M, N, K, sa, sb, nbatch, tile=None, bias=None, residual=None,
            activation=None, r16=False, pre=None, inner=(1, 0, 0), cst=None, causal=0):
    """``inner``: (n, A stride, B stride) of a two-level batch (_two_level); ``cst``: C's
    (outer, inner batch, row) strides, C contiguous if None; ``causal``: CAUSAL_PARTS."""
    ar, ac = a.strides[-2], a.strides[-1]
    br, bc = b.strides[-2], b.strides[-1]
    am = _mode(a.offset, math.gcd(sa, inner[1]), ar, ac, M, K)
    # B is (K x N): its output dimension is N (columns), K is rows.
    bm = {0: 1, 1: 0, 2: 2}[_mode(b.offset, math.gcd(sb, inner[2]), bc, br, N, K)]
    epi = (activation, bias is not None, residual is not None) + (() if pre is None else (True,))
    bufs = [a._storage.buffer, b._storage.buffer, out._storage.buffer]
    extra = [0, 0]
    if bias is not None:
        bufs.append(bias._storage.buffer)
        extra[0] = bias.offset
    for t in (residual, pre):  # (at most one of them: _epilogue_defines)
        if t is not None:
            bufs.append(t._storage.buffer)
            extra[1] = t.offset
    if tile is None and use_cpu_kernel(a.device):
        tex = use_cpu_textures(a.device, a.dtype == float16, nbatch * M * N * K)
        if tex and nbatch == 1 and (am == 2 or bm == 2):  # (a vocabulary of 65: the lm head)
            (a, am), (b, bm) = _padded(a, am), _padded(b, bm)
            bufs[:2] = [a._storage.buffer, b._storage.buffer]
        tile = _cpu_tile(M, N, nbatch, tex,
                         tex and am != 2 and cpu_subgroup(a.device) == CPU_TEX_WG)
    if tile is not None and len(tile) in (5, 6, 7):
        return _launch_cpu(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile,
                           r16, inner, cst, residual)
    two = inner[0] != 1 or cst is not None
    if two and epi != (None, False, False):
        raise ValueError("matmul: a two-level batch or strided output takes no epilogue")
    f16 = a.dtype == float16
    v = tile if isinstance(tile, dict) else None
    if tile is None:  # r16 products take the f16 table's (packed f16) variants
        v = _pick_variant(a.device, M, N, nbatch, f16 or r16, K)
    if v is None:
        tm, bk, *rest = tile or _pick_tile(a.device, M, N, nbatch)
        v = dict(tm=tm, bk=bk, swz=rest[0] if rest else 0, pad=rest[1] if len(rest) > 1 else 1)
    v = dict(v)
    tm, tn, bk = v["tm"], v.get("tn") or v["tm"], v["bk"]
    split = v.pop("split", 1)
    if split > 1 and epi == (None, False, False) and not causal and not two:  # >= 2 k steps
        split = max(1, min(split, K // (2 * bk)))
    else:
        split = 1
    kw = -(-K // split // bk) * bk if split > 1 else K  # K per slice, a multiple of BK
    split = -(-K // kw)  # no empty slice (the last one may be shorter)
    v["exmn"] = v.get("exact", False) and M % (16 * tm) == 0 and N % (16 * tn) == 0
    v["exact"] = v["exmn"] and kw % bk == 0 and K % bk == 0 \
        and not (causal and (16 * tm) % bk)  # causal parts cut K at row tiles
    v["half"] = v.get("half", False) and (f16 or r16)
    v["ak"] = v.get("ak", False) and am == 0
    k = kernel_for(am=am, bm=bm, f16=f16, epilogue=epi, split=split, r16=r16, causal=causal,
                   two=two, **v)
    tail = [inner[0], inner[1], inner[2], *(cst or (inner[0] * M * N, M * N, N))] if two else []
    dst = out if split == 1 else Tensor.empty((split,) + (nbatch * M * N,), a.device, float32)
    if split > 1:
        bufs[2] = dst._storage.buffer
    gx, gy = -(-N // (16 * tn)), -(-M // (16 * tm))
    if gx > MAX_WG_PER_DIM or gy > MAX_WG_PER_DIM:
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    per = MAX_WG_PER_DIM // split
    for z0 in range(0, nbatch, per):
        gz = min(per, nbatch - z0)
        a.device.dispatch(k, bufs, [M, N, K, a.offset, sa, ar, ac, b.offset, sb, br, bc,
                                    dst.offset, z0, *extra, kw, nbatch, *tail],
                          (gx, gy, gz * split))
    if split > 1:  # add the slices' partial products (one elementwise pass)
        n = nbatch * M * N
        parts = [Tensor(dst._storage, (n,), offset=s * n) for s in range(split)]
        while len(parts) > 3:  # a map kernel reads at most 3 inputs
            run_map("a + b", parts[-2], [parts[-2], parts.pop()])
        flat = Tensor(out._storage, (n,), None, out.offset, out.dtype)
        run_map(" + ".join("abc"[:len(parts)]), flat, parts)
