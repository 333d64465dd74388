"""Reduction kernels (shaders/reduce.wgsl, colsum.wgsl) over the rows of a contiguous [R, L]
block: an invocation per short row, else a workgroup per CHUNK of a row in passes of bounded
loops; the index of each row's extreme likewise; a float sum over a few leading rows in place."""
from __future__ import annotations

from ..runtime.buffer_view import DTYPES, BufferView, View, float16, int32
from ..runtime.device import groups_1d
from ..runtime.kernels import Kernel
from .rows import row_mode

# Rows up to this length take one invocation each (no barriers); longer ones a workgroup per
# CHUNK. CPU adapters, where barriers are expensive, take longer rows per invocation.
SHORT_ROW = 64
SHORT_ROW_CPU = 4096
# Elements per workgroup: 512 iterations per invocation, far below llvmpipe's 65,535 cut-off.
CHUNK = 256 * 512


def _isnan(dtype) -> str:
    return "false" if dtype == int32 else "isnan_(x)"


def _ops(name: str, dtype) -> tuple:
    """(init, COMBINE) in ``dtype``'s arithmetic (NaN kept through max/min: WGSL may drop it)."""
    if dtype == int32:
        return {"sum": (0, "x + y"), "max": (-2 ** 31, "max(x, y)"),
                "min": (2 ** 31 - 1, "min(x, y)"), "prod": (1, "x * y")}[name]
    nan = "select({0}, x + y, isnan_a(x) || isnan_a(y))"
    return {"sum": (0.0, "x + y"), "max": (float("-inf"), nan.format("max(x, y)")),
            "min": (float("inf"), nan.format("min(x, y)")), "prod": (1.0, "x * y")}[name]


def _kernel(entry: str, dtype, out_dtype, comb: str, gt: str = ">",
            fin: str = "{TO}(v)") -> Kernel:
    acc = "i32" if dtype == int32 else "f32"
    defines = {"F16": "1"} if dtype == float16 else {}
    return Kernel.of("reduce", entry, T=DTYPES[dtype], A=acc, TO=DTYPES[out_dtype],
                     INIT="pi(5u)" if acc == "i32" else "pf(5u)", COMBINE=comb, GT=gt,
                     FIN=fin.format(TO=DTYPES[out_dtype]), ISNAN=_isnan(dtype), **defines)


def _short_row(dev) -> int:
    return SHORT_ROW_CPU if row_mode(dev) == "thread" else SHORT_ROW


def rows(name: str, xt: BufferView, R: int, L: int, out: BufferView, scale: float) -> None:
    """out[r] = reduction of row r of contiguous [R, L] ``xt``, in passes of bounded loops."""
    dev = xt.device
    init, comb = _ops(name, xt.dtype)
    scaled = xt.dtype != int32 and scale != 1.0
    fin = "{TO}(v * pf(3u))" if scaled else "{TO}(v)"
    short = _short_row(dev)
    while True:
        if L <= short:
            k = _kernel("rows", xt.dtype, out.dtype, comb, fin=fin)
            dev.dispatch(k, [xt.buffer, out.buffer],
                         [R, L, xt.offset, float(scale), out.offset, init], groups_1d(R, 64))
            return
        nc = -(-L // CHUNK)
        dst = out if nc == 1 else View.empty((R, nc), dev, out.dtype)
        k = _kernel("main", xt.dtype, dst.dtype, comb, fin=fin if nc == 1 else "{TO}(v)")
        dev.dispatch(k, [xt.buffer, dst.buffer],
                     [R * nc, L, xt.offset, float(scale), dst.offset, init, CHUNK, nc],
                     groups_1d(R * nc, 1))
        if nc == 1:
            return
        xt, L = dst, nc


def arg_rows(xt: BufferView, R: int, L: int, out: BufferView, gt: str) -> None:
    """out[r] = index of row r's extreme (first NaN, else first of ties), in passes."""
    dev = xt.device
    init = _ops("max" if gt == ">" else "min", xt.dtype)[0]
    if L <= _short_row(dev):
        dev.dispatch(_kernel("arg_rows", xt.dtype, int32, "x", gt),
                     [xt.buffer, out.buffer],
                     [R, L, xt.offset, 1.0, out.offset, init], groups_1d(R, 64))
        return
    ix = None
    while True:
        nc = -(-L // CHUNK)
        dst = out if nc == 1 else View.empty((R, nc), dev, int32)
        vals = View.empty((R, nc), dev, xt.dtype)
        ixb, ixo = (ix.buffer, ix.offset) if ix is not None else (xt.buffer, 0)
        dev.dispatch(_kernel("arg", xt.dtype, int32, "x", gt),
                     [xt.buffer, dst.buffer, ixb, vals.buffer],
                     [R * nc, L, xt.offset, 1.0, dst.offset, init, CHUNK, nc,
                      int(ix is not None), ixo, vals.offset], groups_1d(R * nc, 1))
        if nc == 1:
            return
        xt, ix, L = vals, dst, nc


def leading_sum(xt: BufferView, R: int, L: int, out: BufferView) -> None:
    """out[r] = sum over the L leading rows of contiguous f32 ``xt`` read as [L, R] in place."""
    xt.device.dispatch(Kernel.of("colsum"), [xt.buffer, out.buffer],
                       [R, L, xt.offset, out.offset], groups_1d(R, 64))
