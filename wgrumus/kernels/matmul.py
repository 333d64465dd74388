"""The matmul launch: operands' load modes and the epilogue's bindings, then the CPU adapters'
kernel (matmul_cpu.py) or the tiled GPU kernel (matmul_gpu.py), as the adapter profile and
TUNING decide. Operands are buffer views (kernels/__init__.py)."""
from __future__ import annotations

import math

from . import matmul_cpu, matmul_gpu


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


def launch(a, b, out, M, N, K, sa, sb, nbatch, tile=None, bias=None, residual=None,
           activation=None, r16=False, pre=None, inner=(1, 0, 0), cst=None, causal=0):
    """out = activation(a @ b + bias + residual) over ``nbatch`` products (batch strides sa,
    sb). ``inner``: (n, A stride, B stride) of a two-level batch (ops/matmul.py _two_level);
    ``cst``: C's (outer, inner batch, row) strides, C contiguous if None; ``causal``:
    matmul_gpu.CAUSAL_PARTS; ``pre``: also store the activation's argument there; ``tile``:
    a forced block (sweeps, tests: a CPU tile of 5-7 entries, a GPU tile or variant dict)."""
    am = _mode(a.offset, math.gcd(sa, inner[1]), *a.strides[-2:], M, K)
    # B is (K x N): its output dimension is N (columns), K is rows.
    bm = {0: 1, 1: 0, 2: 2}[_mode(b.offset, math.gcd(sb, inner[2]), b.strides[-1],
                                  b.strides[-2], N, K)]
    epi = (activation, bias is not None, residual is not None) + (() if pre is None else (True,))
    bufs = [a.buffer, b.buffer, out.buffer]
    extra = [0, 0]
    if bias is not None:
        bufs.append(bias.buffer)
        extra[0] = bias.offset
    for t in (residual, pre):  # (at most one of them: matmul_gpu._epilogue_defines)
        if t is not None:
            bufs.append(t.buffer)
            extra[1] = t.offset
    if tile is None and matmul_cpu.use_cpu_kernel(a.device):
        a, am, b, bm, tile = matmul_cpu.plan(a, am, b, bm, M, N, K, nbatch)
        bufs[:2] = [a.buffer, b.buffer]
    if tile is not None and len(tile) in (5, 6, 7):
        return matmul_cpu.launch(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi,
                                 tile, r16, inner, cst, residual)
    return matmul_gpu.launch(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi,
                             tile, r16, inner, cst, causal)
