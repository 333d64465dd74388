"""conv2d (im2col + the tiled matmul, as recorded ops), max_pool2d and avg_pool2d over NCHW.
Pool gradients are gathers over the windows covering each input position (no atomics).
"""
from __future__ import annotations

from ..autograd.tape import record
from ..kernels import conv as conv_kernels
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float32
from .elementwise import _f32, add, contiguous
from .matmul import matmul
from .shape import permute, reshape


def pair(v, name: str) -> tuple:
    if isinstance(v, (tuple, list)):
        if len(v) != 2:
            raise ValueError(f"{name} must be an int or a pair, got {v!r}")
        return int(v[0]), int(v[1])
    return int(v), int(v)


def _geometry(x: Tensor, k, stride, padding, dilation, op: str) -> dict:
    if x.ndim != 4:
        raise ShapeError(f"{op}: input must be NCHW (4-D), got shape {x.shape}")
    N, C, H, W = x.shape
    (KH, KW), (SH, SW) = pair(k, "kernel_size"), pair(stride, "stride")
    (PH, PW), (DH, DW) = pair(padding, "padding"), pair(dilation, "dilation")
    if min(KH, KW, SH, SW, DH, DW) < 1 or min(PH, PW) < 0:
        raise ValueError(f"{op}: kernel {KH}x{KW}, stride {SH}x{SW} and dilation {DH}x{DW} must "
                         f"be positive and padding {PH}x{PW} non-negative")
    OH = (H + 2 * PH - DH * (KH - 1) - 1) // SH + 1
    OW = (W + 2 * PW - DW * (KW - 1) - 1) // SW + 1
    if OH < 1 or OW < 1:
        raise ShapeError(f"{op}: input {H}x{W} (padding {PH}x{PW}) is smaller than the "
                         f"kernel {KH}x{KW} (dilation {DH}x{DW}); output would be {OH}x{OW}")
    return dict(N=N, C=C, H=H, W=W, KH=KH, KW=KW, SH=SH, SW=SW, PH=PH, PW=PW, DH=DH, DW=DW,
                OH=OH, OW=OW)


def _col2im(dcols: Tensor, g: dict) -> Tensor:
    dcols = contiguous(dcols)
    dx = Tensor.empty((g["N"], g["C"], g["H"], g["W"]), dcols.device, float32)
    conv_kernels.run(dcols.device, "col2im", g, dx.numel(), [dcols.buffer, dx.buffer],
         off=dcols.offset)
    return dx


def im2col(x: Tensor, kernel_size, stride=1, padding=0, dilation=1) -> Tensor:
    """[C*KH*KW, N*OH*OW] patches of NCHW ``x`` (zeros where a tap falls in the padding);
    reads any strides of ``x``. Backward: col2im (each input position gathers its taps)."""
    x = _f32(x)
    g = _geometry(x, kernel_size, stride, padding, dilation, "im2col")
    cols = Tensor.empty((g["C"] * g["KH"] * g["KW"], g["N"] * g["OH"] * g["OW"]), x.device,
                        float32)
    conv_kernels.run(x.device, "im2col", g, cols.numel(), [x.buffer, cols.buffer],
         x.strides, x.offset)
    record("im2col", cols, [x], lambda gr: (_col2im(gr, g),))
    return cols


def conv2d(x: Tensor, w: Tensor, b=None, stride=1, padding=0, dilation=1) -> Tensor:
    """PyTorch's conv2d (groups=1): x [N, C, H, W], w [OC, C, KH, KW], b [OC] -> [N, OC, OH, OW].
    stride / padding / dilation are ints or (h, w) pairs."""
    if w.ndim != 4:
        raise ShapeError(f"conv2d: weight must be [out_channels, in_channels, KH, KW], got "
                         f"{w.shape}")
    if x.ndim != 4 or x.shape[1] != w.shape[1]:
        raise ShapeError(f"conv2d: input {x.shape} does not match weight {w.shape} (input must "
                         f"be NCHW with C = weight.shape[1] = {w.shape[1]})")
    if b is not None and tuple(b.shape) != (w.shape[0],):
        raise ShapeError(f"conv2d: bias shape {tuple(b.shape)} != ({w.shape[0]},)")
    OC, N = w.shape[0], x.shape[0]
    g = _geometry(x, w.shape[2:], stride, padding, dilation, "conv2d")
    OH, OW = g["OH"], g["OW"]
    cols = im2col(x, w.shape[2:], stride, padding, dilation)
    out = matmul(reshape(w, (OC, -1)), cols)  # [OC, N*OH*OW]
    out = permute(reshape(out, (OC, N, OH, OW)), (1, 0, 2, 3))
    if b is None:
        return contiguous(out)
    return add(out, reshape(b, (1, OC, 1, 1)))  # the bias add writes the NCHW copy


def _pool_geometry(x, kernel_size, stride, padding, dilation, op):
    stride = kernel_size if stride is None else stride
    g = _geometry(x, kernel_size, stride, padding, dilation, op)
    if 2 * g["PH"] > g["KH"] or 2 * g["PW"] > g["KW"]:
        raise ValueError(f"{op}: padding {g['PH']}x{g['PW']} must be at most half the kernel "
                         f"{g['KH']}x{g['KW']}")
    return g


def _unbatched(fn):
    """Accept [C, H, W] like PyTorch by adding and removing a batch dim."""
    def wrapped(x, *a, **k):
        if x.ndim == 3:
            out = fn(reshape(x, (1,) + x.shape), *a, **k)
            return reshape(out, out.shape[1:])
        return fn(x, *a, **k)
    wrapped.__name__, wrapped.__doc__ = fn.__name__, fn.__doc__
    return wrapped


@_unbatched
def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1) -> Tensor:
    """Window max (stride defaults to kernel_size; padding counts as -inf). Backward routes
    each gradient to the window's first maximum, found by the forward kernel."""
    x = _f32(x)
    return _pool(x, _pool_geometry(x, kernel_size, stride, padding, dilation, "max_pool2d"),
                 "maxpool", "max_pool2d")


@_unbatched
def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0,
               count_include_pad: bool = True) -> Tensor:
    """Window mean (stride defaults to kernel_size). With count_include_pad (PyTorch's
    default) the divisor is always KH*KW; otherwise only the taps inside the input count."""
    x = _f32(x)
    return _pool(x, _pool_geometry(x, kernel_size, stride, padding, 1, "avg_pool2d"),
                 "avgpool", "avg_pool2d", int(bool(count_include_pad)))


def _pool(x: Tensor, g: dict, entry: str, name: str, flag: int = 0) -> Tensor:
    """Pooling kernel ``entry`` and its backward ``entry``_bwd (max: with the argmax tensor)."""
    shape = (g["N"], g["C"], g["OH"], g["OW"])
    out = Tensor.empty(shape, x.device, float32)
    arg = [Tensor.empty(shape, x.device, "int32")] if entry == "maxpool" else []  # (kept alive)
    conv_kernels.run(x.device, entry, g, out.numel(),
         [x.buffer, out.buffer] + [a.buffer for a in arg],
         x.strides, x.offset, flag)

    def bw(gr):
        gr = contiguous(gr)
        dx = Tensor.empty(x.shape, gr.device, float32)
        conv_kernels.run(gr.device, entry + "_bwd", g, dx.numel(),
             [gr.buffer, dx.buffer] + [a.buffer for a in arg],
             off=gr.offset, flag=flag)
        return (dx,)
    record(name, out, [x], bw)
    return out
