"""The tiled GPU matmul (shaders/matmul.wgsl): its register code, the variants and the table
that picks one per adapter class and shape, and the launch (split-K slices added by a map pass).
Operands are buffer views (kernels/__init__.py); load modes and strides come from
kernels/matmul.py."""
from __future__ import annotations

import functools

from ..runtime.buffer_view import BufferView, View, float16, float32
from ..runtime.device import MAX_WG_PER_DIM
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from .map import run_map

CAUSAL_PARTS = {"out": 1, "a_lower": 2, "a_upper": 3}


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
    ind = " " * 12
    acc = ("acch", "vec4<f16>") if half else ("acc", "vec4<f32>")
    head, fma = (_fma_ak(tm // 4, tn // 4, bk, pipe, acc) if ak
                 else _fma_k1(tm // 4, tn // 4, acc))
    n = tm * tn // 4
    flush = [f"if (((k0 - kbeg) / BK) % {fe}u == {fe - 1}u || !more) {{"]
    flush += [f"    acc[{k}] += vec4<f32>(acch[{k}]); acch[{k}] = vec4<f16>(0.0);"
              for k in range(n)] + ["}"]
    stage0, pre, stage = _staging(16 * tm * bk // 1024, 16 * tn * bk // 1024)
    return {"FMA": "\n".join([" " * 8 + head] + [ind + x for x in fma] + [" " * 8 + "}"]),
            "FLUSH": "\n".join(" " * 8 + x for x in flush) if half else "",
            "ACCH": f"    var acch: array<vec4<f16>, {n}>;" if half else "",
            "STAGE0": "\n".join("    " + x for x in stage0),
            "PREFETCH": "\n".join(ind + x for x in pre),
            "STAGE": "\n".join(ind + x for x in stage),
            "STORE": "\n".join("    " + x for x in _stores(tm // 4, tn // 4))}


def _fma_ak(qa: int, qb: int, bk: int, pipe: bool, acc: tuple) -> tuple:
    """(loop head, body) of the k steps with A's tile k-contiguous: 4 k per pass, a{row} = 4 k
    of one row, b{c}_{j} = quad j of k + c; ``pipe``: the passes unrolled, pass p + 1's
    operands read during pass p's FMAs."""
    acc, vt = acc
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
            fma += [f"{acc}[{(i * 4 + r) * qb + j}] = fma({vt}(a{n}{i}{r}.{cc}), b{n}{c}_{j}, "
                    f"{acc}[{(i * 4 + r) * qb + j}]);"
                    for i in range(qa) for r in range(4) for j in range(qb)]
    return ("{" if pipe else "for (var kk = 0u; kk < BK; kk += 4u) {"), fma


def _fma_k1(qa: int, qb: int, acc: tuple) -> tuple:
    """(loop head, body) of the k steps one k at a time (A's tile [k][m])."""
    acc, vt = acc
    fma = ["let ka = ba + kk * TQPA;", "let kb = bb + kk * TQPB;"]
    fma += [f"let a{i} = As[ka + ty + {16 * i}u];" for i in range(qa)]
    fma += [f"let b{j} = Bs[kb + tx + {16 * j}u];" for j in range(qb)]
    fma += [f"{acc}[{(i * 4 + r) * qb + j}] = fma({vt}(a{i}.{c}), b{j}, "
            f"{acc}[{(i * 4 + r) * qb + j}]);"
            for i in range(qa) for r, c in enumerate("xyzw") for j in range(qb)]
    return "for (var kk = 0u; kk < BK; kk++) {", fma


def _staging(la: int, lb: int) -> tuple:
    """(first tiles' stores, next tiles' register prefetch, their stores into the other
    buffer) for la / lb quads per invocation of A / B."""
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
    return stage0, pre, stage


def _stores(qa: int, qb: int) -> list:
    """Each accumulator row's guarded quad stores."""
    store = []
    for i in range(qa):
        for r in range(4):
            store.append(f"let m{i}{r} = row0 + (ty + {16 * i}u) * 4u + {r}u;")
            store.append(f"if (m{i}{r} < M) {{")
            store += [f"    store_quad(c0 + m{i}{r} * cr, col0 + (tx + {16 * j}u) * 4u, N, "
                      f"full, acc[{(i * 4 + r) * qb + j}]);" for j in range(qb)]
            store.append("}")
    return store


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



def _pick_tile(dev, M, N, nbatch) -> tuple:
    """(TM, BK, SWZ): on GPUs 8x8 per invocation (128x128 tiles) once there are enough tiles
    to fill the GPU, 4x4 (64x64 tiles) for small products so that they still spread over all
    cores. On CPU adapters this kernel runs only where forced (TUNING.cpu_matmul False): 64x64
    tiles, fewer live registers per SIMD lane; matmul_cpu picks the CPU kernel's blocks."""
    if profile(dev).cpu:
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



def _pick_variant(dev, M, N, nbatch, f16: bool, K: int = 0) -> dict | None:
    rows = MATMUL_TABLE.get((profile(dev).adapter_class, "f16" if f16 else "f32"), ())
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


def launch(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile, r16,
           inner=(1, 0, 0), cst=None, causal=0):
    """C = A @ B (+ epilogue ``epi``) in the table's variant (or ``tile``), split-K slices
    added up by a map pass; bufs / extra: the bindings and offsets of kernels/matmul.py's
    launch."""
    two = inner[0] != 1 or cst is not None
    if two and epi != (None, False, False):
        raise ValueError("matmul: a two-level batch or strided output takes no epilogue")
    f16 = a.dtype == float16
    v, split, kw = _variant(a.device, tile, M, N, K, nbatch, f16, r16, am,
                            plain=epi == (None, False, False) and not causal and not two,
                            causal=causal)
    tm, tn = v["tm"], v.get("tn") or v["tm"]
    k = kernel_for(am=am, bm=bm, f16=f16, epilogue=epi, split=split, r16=r16, causal=causal,
                   two=two, **v)
    tail = [inner[0], inner[1], inner[2], *(cst or (inner[0] * M * N, M * N, N))] if two else []
    dst = out if split == 1 else View.empty((split, nbatch * M * N), a.device, float32)
    if split > 1:
        bufs[2] = dst.buffer
    gx, gy = -(-N // (16 * tn)), -(-M // (16 * tm))
    if gx > MAX_WG_PER_DIM or gy > MAX_WG_PER_DIM:
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    per = MAX_WG_PER_DIM // split
    for z0 in range(0, nbatch, per):
        gz = min(per, nbatch - z0)
        a.device.dispatch(k, bufs, [M, N, K, a.offset, sa, *a.strides[-2:], b.offset, sb,
                                    *b.strides[-2:], dst.offset, z0, *extra, kw, nbatch, *tail],
                          (gx, gy, gz * split))
    if split > 1:
        _add_slices(dst, out, split, nbatch * M * N)


def _variant(dev, tile, M, N, K, nbatch, f16: bool, r16: bool, am: int, plain: bool,
             causal: int) -> tuple:
    """(kernel_for's keywords, split-K slices, K per slice) of this product: ``tile`` (a
    VARIANTS dict or a (TM, BK[, SWZ, PAD]) tuple) or the table's pick; split-K only for
    ``plain`` products (no epilogue, causal part or two-level batch) of >= 2 k steps a slice."""
    v = tile if isinstance(tile, dict) else None
    if tile is None:  # r16 products take the f16 table's (packed f16) variants
        v = _pick_variant(dev, M, N, nbatch, f16 or r16, K)
    if v is None:
        tm, bk, *rest = tile or _pick_tile(dev, M, N, nbatch)
        v = dict(tm=tm, bk=bk, swz=rest[0] if rest else 0, pad=rest[1] if len(rest) > 1 else 1)
    v = dict(v)
    tm, tn, bk = v["tm"], v.get("tn") or v["tm"], v["bk"]
    split = v.pop("split", 1)
    split = max(1, min(split, K // (2 * bk))) if split > 1 and plain else 1
    kw = -(-K // split // bk) * bk if split > 1 else K  # K per slice, a multiple of BK
    split = -(-K // kw)  # no empty slice (the last one may be shorter)
    v["exmn"] = v.get("exact", False) and M % (16 * tm) == 0 and N % (16 * tn) == 0
    v["exact"] = v["exmn"] and kw % bk == 0 and K % bk == 0 \
        and not (causal and (16 * tm) % bk)  # causal parts cut K at row tiles
    v["half"] = v.get("half", False) and (f16 or r16)
    v["ak"] = v.get("ak", False) and am == 0
    return v, split, kw


def _add_slices(dst: View, out: BufferView, split: int, n: int) -> None:
    """out = the sum of the ``split`` partial products in ``dst`` (map passes of <= 3 inputs)."""
    parts = [View(dst.storage, (n,), None, s * n) for s in range(split)]
    while len(parts) > 3:  # a map kernel reads at most 3 inputs
        run_map("a + b", parts[-2], [parts[-2], parts.pop()])
    flat = View(out.storage, (n,), None, out.offset, out.dtype)
    run_map(" + ".join("abc"[:len(parts)]), flat, parts)
