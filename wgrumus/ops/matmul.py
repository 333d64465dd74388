"""matmul: 2-D, batched, broadcast batch dims (numpy rules), any operand strides."""
from __future__ import annotations

import functools
import math

from ..autograd.tape import record
from ..runtime.device import MAX_WG_PER_DIM
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, check_same_device, float16, float32
from .elementwise import cast, contiguous, unbroadcast
from .launch import broadcast_shapes
from .shape import expand, reshape, transpose

def _batch_stride(t: Tensor, nb: int):
    """One stride that walks the first ``nb`` dims of ``t`` in order, or None."""
    dims = [(s, st) for s, st in zip(t.shape[:nb], t.strides[:nb]) if s != 1]
    if not dims:
        return 0
    for (s0, st0), (s1, st1) in zip(dims, dims[1:]):
        if st0 != st1 * s1:
            return None
    return dims[-1][1]


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
    M, K = a2.shape[-2:]
    K2, N = b2.shape[-2:]
    if K != K2:
        raise ShapeError(f"matmul: inner dimensions differ: {a.shape} @ {b.shape} ({K} != {K2})")
    batch = broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    nb = len(batch)
    ae = expand(a2, batch + (M, K)) if a2.shape[:-2] != batch else a2
    be = expand(b2, batch + (K, N)) if b2.shape[:-2] != batch else b2
    sa, sb = _batch_stride(ae, nb), _batch_stride(be, nb)
    if sa is None:
        ae, sa = contiguous(ae), M * K
    if sb is None:
        be, sb = contiguous(be), K * N
    nbatch = math.prod(batch)
    out = Tensor.empty(batch + (M, N), a.device, dt)
    if out.numel():
        if K == 0:
            from .elementwise import fill_
            fill_(out, 0.0)
        else:
            _launch(ae, be, out, M, N, K, sa, sb, nbatch)
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
    record("matmul", out, [a, b], bw, saved=[a, b])
    if a.ndim == 1 and b.ndim == 1:
        return reshape(out, ())
    if a.ndim == 1:
        return reshape(out, out.shape[:-2] + (N,))
    if b.ndim == 1:
        return reshape(out, out.shape[:-1])
    return out


def _unrolled(tm: int, bk: int) -> dict:
    """Register-level code of the kernel, unrolled with literal indices: shader compilers keep
    such arrays in registers, while a loop index can push them to (slow) local memory."""
    q, loads = tm // 4, 16 * tm * bk // 1024
    ind = " " * 12
    fma = []
    for i in range(q):
        fma.append(f"let a{i} = As[ab + ty + {16 * i}u];")
        fma.append(f"let b{i} = Bs[ab + tx + {16 * i}u];")
    for i in range(q):
        for r, c in enumerate("xyzw"):
            for j in range(q):
                k = (i * 4 + r) * q + j
                fma.append(f"acc[{k}] = fma(vec4<f32>(a{i}.{c}), b{j}, acc[{k}]);")
    stage0, pre, stage = [], [], []
    for l in range(loads):
        qv = f"{256 * l}u + t"
        stage0.append(f"stage_a({qv}, 0u, fetch_a({qv}, row0, 0u, M, K, a0, ars, acs));")
        stage0.append(f"stage_b({qv}, 0u, fetch_b({qv}, col0, 0u, N, K, b0, brs, bcs));")
        pre.append(f"ra[{l}] = fetch_a({qv}, row0, k1, M, K, a0, ars, acs);")
        pre.append(f"rb[{l}] = fetch_b({qv}, col0, k1, N, K, b0, brs, bcs);")
        stage.append(f"stage_a({qv}, nb, ra[{l}]);")
        stage.append(f"stage_b({qv}, nb, rb[{l}]);")
    store = []
    for i in range(q):
        for r, c in enumerate("xyzw"):
            store.append(f"let m{i}{r} = row0 + (ty + {16 * i}u) * 4u + {r}u;")
            store.append(f"if (m{i}{r} < M) {{")
            for j in range(q):
                k = (i * 4 + r) * q + j
                store.append(f"    store_quad(c0 + m{i}{r} * N, col0 + (tx + {16 * j}u) * 4u, N, "
                             f"full, acc[{k}]);")
            store.append("}")
    return {"FMA": "\n".join(ind + x for x in fma),
            "STAGE0": "\n".join("    " + x for x in stage0),
            "PREFETCH": "\n".join(ind + x for x in pre),
            "STAGE": "\n".join(ind + x for x in stage),
            "STORE": "\n".join("    " + x for x in store)}


@functools.lru_cache(maxsize=256)
def kernel_for(tm: int, bk: int, am: int, bm: int, swz: int = 0, pad: int = 1,
               f16: bool = False, epilogue: tuple = (None, False, False)) -> Kernel:
    """The matmul specialisation: TM x TM outputs per invocation (tile 16*TM), k step BK, load
    modes of A and B, launch-order swizzle and workgroup-tile row padding (see
    shaders/matmul.wgsl; one quad of padding keeps transposing stores free of bank conflicts).
    ``epilogue``: (activation template of {z} or None, bias?, residual?)."""
    tile = 16 * tm
    loads = tile * bk // 1024
    if loads < 1 or bk % 4 or tm % 4:
        raise ValueError(f"matmul tile {tile} with k step {bk} leaves invocations without loads")
    return Kernel.of("matmul", TM=tm, TILE=tile, TQ=tile // 4, TQP=tile // 4 + pad, BK=bk,
                     LOADS=loads, SMEM=2 * bk * (tile // 4 + pad), T="f16" if f16 else "f32",
                     F16=int(f16), ACC=tm * tm // 4, AM=am, BM=bm, SWZ=swz,
                     **_epilogue_defines(*epilogue), **_unrolled(tm, bk))


def _epilogue_defines(act, bias: bool, residual: bool) -> dict:
    z, decls = "x", []
    if bias:
        decls.append("@group(0) @binding(4) var<storage, read> BIAS: array<f32>;")
        z += " + BIAS[pu(13u) + n]"
    if residual:
        decls.append(f"@group(0) @binding({4 + bias}) var<storage, read> RES: array<f32>;")
        z += " + RES[i - pu(11u) + pu(14u)]"
    return {"EPI_DECLS": "\n".join(decls), "EPI": act.format(z=z) if act else z}


def linear_2d(x: Tensor, wt: Tensor, bias: Tensor | None = None, residual: Tensor | None = None,
              activation: str | None = None) -> Tensor:
    """act(x @ wt + bias + residual) for float32 2-D x [M, K] and wt [K, N] (any strides), a
    contiguous bias [N] and residual [M, N], in one kernel. ``activation`` is a WGSL template
    of {z} (e.g. "max({z}, 0.0)"). No autograd: fused.linear records the node."""
    M, K = x.shape
    N = wt.shape[1]
    out = Tensor.empty((M, N), x.device, float32)
    if not out.numel():
        return out
    if K == 0:  # a zero product: only the epilogue is left, in a map kernel
        from .elementwise import run_map
        ins = [t for t in (bias, residual) if t is not None]
        z = " + ".join("ab"[:len(ins)]) or "0.0"
        return run_map(activation.format(z=z) if activation else z, out, ins)
    _launch(x, wt, out, M, N, K, 0, 0, 1, bias=bias, residual=residual, activation=activation)
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
    cores. CPU adapters (lavapipe) run 64x64 tiles: fewer live registers per SIMD lane."""
    if _is_cpu(dev):
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


def _is_cpu(dev) -> bool:
    return str(dev.adapter_info.get("adapter_type", "")).lower() == "cpu"


def _launch(a, b, out, M, N, K, sa, sb, nbatch, tile=None, bias=None, residual=None,
            activation=None):
    ar, ac = a.strides[-2], a.strides[-1]
    br, bc = b.strides[-2], b.strides[-1]
    am = _mode(a.offset, sa, ar, ac, M, K)
    # B is (K x N): its output dimension is N (columns), K is rows.
    bm = {0: 1, 1: 0, 2: 2}[_mode(b.offset, sb, bc, br, N, K)]
    tm, bk, *rest = tile or _pick_tile(a.device, M, N, nbatch)
    epi = (activation, bias is not None, residual is not None)
    k = kernel_for(tm, bk, am, bm, *rest, f16=a.dtype == float16, epilogue=epi)
    bufs = [a._storage.buffer, b._storage.buffer, out._storage.buffer]
    extra = [0, 0]
    if bias is not None:
        bufs.append(bias._storage.buffer)
        extra[0] = bias.offset
    if residual is not None:
        bufs.append(residual._storage.buffer)
        extra[1] = residual.offset
    t = 16 * tm
    gx, gy = -(-N // t), -(-M // t)
    if gx > MAX_WG_PER_DIM or gy > MAX_WG_PER_DIM:
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    for z0 in range(0, nbatch, MAX_WG_PER_DIM):
        gz = min(MAX_WG_PER_DIM, nbatch - z0)
        a.device.dispatch(k, bufs, [M, N, K, a.offset, sa, ar, ac, b.offset, sb, br, bc,
                                    out.offset, z0, *extra], (gx, gy, gz))
