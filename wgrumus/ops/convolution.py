"""PyTorch's pooling arguments over ops/conv.py's kernels (ceil_mode, dilation, return_indices,
divisor_override), the zero insertion of a transposed convolution's stride, and F.fold with its
adjoint F.unfold (im2col). The convolutions and poolings built on these (groups, padding='same',
conv1d, conv_transpose, 1-D and adaptive pooling, interpolate) are
wgrumus/nn/functional/convolution.py."""
from __future__ import annotations

from ..autograd.tape import record
from ..kernels import conv as conv_kernels
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float32
from . import conv as _conv
from .elementwise import _f32, contiguous, copy_into, fill_
from .shape import getitem, reshape


def _zero_insert(x: Tensor, sh: int, sw: int) -> Tensor:
    """[N, C, H, W] -> [N, C, (H-1) sh + 1, (W-1) sw + 1] with x at every stride-th place."""
    if sh == sw == 1:
        return x
    N, C, H, W = x.shape
    out = fill_(Tensor.empty((N, C, (H - 1) * sh + 1, (W - 1) * sw + 1), x.device, x.dtype), 0)
    view = out._view((N, C, H, W), (out.strides[0], out.strides[1], out.strides[2] * sh,
                                    out.strides[3] * sw), out.offset)
    copy_into(view, x)
    record("zero_insert", out, [x], lambda g: (getitem(g, (slice(None), slice(None),
                                                            slice(None, None, sh),
                                                            slice(None, None, sw))),))
    return out


def _ceil_geometry(g: dict, ceil_mode: bool) -> dict:
    if not ceil_mode:
        return g
    g = dict(g)
    for o, n, k, s, p, d in (("OH", "H", "KH", "SH", "PH", "DH"), ("OW", "W", "KW", "SW", "PW",
                                                                    "DW")):
        span = g[n] + 2 * g[p] - g[d] * (g[k] - 1) - 1
        out = -(-span // g[s]) + 1
        if (out - 1) * g[s] >= g[n] + g[p]:  # the last window must start inside
            out -= 1
        g[o] = out
    return g


def _pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, op):
    x = _f32(x)
    g = _conv._pool_geometry(x, kernel_size, stride, padding, dilation, op)
    return x, _ceil_geometry(g, ceil_mode)


def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, dilation=1,
               ceil_mode: bool = False, return_indices: bool = False):
    """torch's max_pool2d; indices are flat positions in each input plane (h * W + w)."""
    if x.ndim == 3:
        r = max_pool2d(x.unsqueeze(0), kernel_size, stride, padding, dilation, ceil_mode,
                       return_indices)
        return tuple(t.squeeze(0) for t in r) if return_indices else r.squeeze(0)
    stride = kernel_size if stride is None or stride == [] else stride
    x, g = _pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, "max_pool2d")
    out, arg = _pool_with_arg(x, g)
    return (out, arg) if return_indices else out


def _pool_with_arg(x: Tensor, g: dict):
    """conv.py's max pool, keeping its argmax tensor."""
    shape = (g["N"], g["C"], g["OH"], g["OW"])
    out = Tensor.empty(shape, x.device, float32)
    arg = Tensor.empty(shape, x.device, "int32")
    conv_kernels.run(x.device, "maxpool", g, out.numel(),
               [x.buffer, out.buffer, arg.buffer], x.strides,
               x.offset)

    def bw(gr):
        gr = contiguous(gr)
        dx = Tensor.empty(x.shape, gr.device, float32)
        conv_kernels.run(gr.device, "maxpool_bwd", g, dx.numel(),
                   [gr.buffer, dx.buffer, arg.buffer], off=gr.offset)
        return (dx,)
    record("max_pool2d", out, [x], bw, saved=[arg])
    return out, arg


def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override=None) -> Tensor:
    if x.ndim == 3:
        return avg_pool2d(x.unsqueeze(0), kernel_size, stride, padding, ceil_mode,
                          count_include_pad, divisor_override).squeeze(0)
    stride = kernel_size if stride is None or stride == [] else stride
    x, g = _pool2d(x, kernel_size, stride, padding, 1, ceil_mode, "avg_pool2d")
    flag = (2 if ceil_mode else 1) if count_include_pad else 0
    if divisor_override is not None:  # a window sum over the override
        out = _conv._pool(x, g, "avgpool", "avg_pool2d", 1)
        return out * (g["KH"] * g["KW"] / float(divisor_override))
    return _conv._pool(x, g, "avgpool", "avg_pool2d", flag)


def unfold(x: Tensor, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """F.unfold: [N, C, H, W] -> [N, C * KH * KW, L] sliding blocks (im2col)."""
    if x.ndim == 3:
        return unfold(x.unsqueeze(0), kernel_size, dilation, padding, stride).squeeze(0)
    cols = _conv.im2col(x, kernel_size, stride, padding, dilation)  # [CKK, N * L]
    N = x.shape[0]
    return contiguous(reshape(cols, (cols.shape[0], N, -1)).permute(1, 0, 2))


def fold(x: Tensor, output_size, kernel_size, dilation=1, padding=0, stride=1) -> Tensor:
    """F.fold: the sum of the blocks back into [N, C, H, W] (the adjoint of unfold)."""
    if x.ndim == 2:
        return fold(x.unsqueeze(0), output_size, kernel_size, dilation, padding, stride).squeeze(0)
    H, W = _conv.pair(output_size, "output_size")
    KH, KW = _conv.pair(kernel_size, "kernel_size")
    N, CKK, L = x.shape
    if CKK % (KH * KW):
        raise ShapeError(f"fold: {CKK} rows is not a multiple of the kernel's {KH * KW} taps")
    C = CKK // (KH * KW)
    probe = Tensor.empty((N, C, H, W), x.device, float32)
    g = _conv._geometry(probe, (KH, KW), stride, padding, dilation, "fold")
    if g["OH"] * g["OW"] != L:
        raise ShapeError(f"fold: {L} blocks, but the geometry gives {g['OH']} x {g['OW']}")
    cols = contiguous(_f32(x).permute(1, 0, 2)).reshape((CKK, N * L))
    out = _conv._col2im(cols, g)
    record("fold", out, [x], lambda gr: (unfold(gr, (KH, KW), dilation, padding, stride),))
    return out


__all__ = ["avg_pool2d", "fold", "max_pool2d", "unfold"]
