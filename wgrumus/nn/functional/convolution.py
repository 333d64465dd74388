"""PyTorch's convolution and pooling arguments built on the conv ops: conv2d with groups,
dilation and padding='same' / 'valid', conv1d, conv_transpose1d / 2d (zero insertion, padding
and a flipped kernel), 1-D pooling, adaptive pooling and F.interpolate (nearest,
nearest-exact, (bi)linear). Interpolation and adaptive pooling are matrix products with weights
from the geometry (built on the host, as an index is); the data never leaves the device."""
from __future__ import annotations

import math

import numpy as np

from ...composite.repeat import flip
from ...ops import conv as _conv
from ...ops.convolution import _zero_insert, avg_pool2d, max_pool2d
from ...ops.elementwise import _f32, contiguous
from ...ops.indexing import index_select
from ...ops.matmul import matmul
from ...ops.shape import cat, chunk
from ...runtime.errors import ShapeError
from ...tensor import Tensor, tensor
from .padding import pad


def _same_padding(x: Tensor, k, dilation, dims: int):
    """(x padded for padding='same', 0): torch pads the extra unit on the right / bottom."""
    k = (k,) * dims if isinstance(k, int) else tuple(k)
    d = (dilation,) * dims if isinstance(dilation, int) else tuple(dilation)
    widths = []
    for kk, dd in reversed(list(zip(k, d))):
        total = dd * (kk - 1)
        widths += [total // 2, total - total // 2]
    return pad(x, tuple(widths)) if any(widths) else x


def conv2d(x: Tensor, w: Tensor, b=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """torch.nn.functional.conv2d: groups split the channels; padding may be 'same' / 'valid'."""
    if x.ndim == 3:  # unbatched [C, H, W]
        return conv2d(x.unsqueeze(0), w, b, stride, padding, dilation, groups).squeeze(0)
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise ValueError(f"conv2d: padding must be 'same', 'valid' or numbers, got {padding!r}")
        if padding == "same":
            if _conv.pair(stride, "stride") != (1, 1):
                raise ValueError("conv2d: padding='same' needs stride 1 (as in PyTorch)")
            x = _same_padding(x, w.shape[2:], dilation, 2)
        padding = 0
    if groups == 1:
        return _conv.conv2d(x, w, b, stride, padding, dilation)
    if x.ndim != 4 or x.shape[1] % groups or w.shape[0] % groups or \
            w.shape[1] * groups != x.shape[1]:
        raise ShapeError(f"conv2d: {groups} groups need in_channels ({x.shape[1]}) "
                         f"and out_channels ({w.shape[0]}) divisible by groups and weight "
                         f"[out, in / groups, KH, KW], got weight {w.shape}")
    xs, ws = chunk(x, groups, 1), chunk(w, groups, 0)
    bs = chunk(b, groups, 0) if b is not None else [None] * groups
    return cat([_conv.conv2d(xi, wi, bi, stride, padding, dilation)
                for xi, wi, bi in zip(xs, ws, bs)], 1)


def conv1d(x: Tensor, w: Tensor, b=None, stride=1, padding=0, dilation=1, groups: int = 1):
    """[N, C, L] (or [C, L]) by weight [OC, C / groups, K]: conv2d over a height of one."""
    if x.ndim == 2:
        return conv1d(x.unsqueeze(0), w, b, stride, padding, dilation, groups).squeeze(0)
    one = lambda v: v[0] if isinstance(v, (tuple, list)) else v  # noqa: E731
    pad2 = padding if isinstance(padding, str) else (0, one(padding))
    y = conv2d(x.unsqueeze(2), w.unsqueeze(2), b, (1, one(stride)), pad2, (1, one(dilation)),
               groups)
    return y.squeeze(2)


def conv_transpose2d(x: Tensor, w: Tensor, b=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    """The gradient of conv2d as a layer: weight [in, out / groups, KH, KW]. Zeros inserted by
    the stride, padded by dilation (k - 1) - padding, then a stride-1 conv2d with the kernel
    flipped."""
    if x.ndim == 3:
        return conv_transpose2d(x.unsqueeze(0), w, b, stride, padding, output_padding, groups,
                                dilation).squeeze(0)
    (sh, sw), (ph, pw) = _conv.pair(stride, "stride"), _conv.pair(padding, "padding")
    (oph, opw), (dh, dw) = _conv.pair(output_padding, "output_padding"), \
        _conv.pair(dilation, "dilation")
    if w.ndim != 4 or x.ndim != 4 or w.shape[0] != x.shape[1] or x.shape[1] % groups:
        raise ShapeError(f"conv_transpose2d: input {x.shape} and weight {w.shape} (weight must "
                         f"be [in_channels, out_channels / groups, KH, KW])")
    if oph >= max(sh, dh) or opw >= max(sw, dw):
        raise ValueError("conv_transpose2d: output_padding must be smaller than stride or "
                         "dilation")
    KH, KW = w.shape[2:]
    xz = _zero_insert(_f32(x), sh, sw)
    eh, ew = dh * (KH - 1) - ph, dw * (KW - 1) - pw
    xz = pad(xz, (ew, ew + opw, eh, eh + oph))
    # [in, out/g, kh, kw] -> per group [out/g, in/g, kh, kw], flipped
    wf = flip(w, (2, 3))
    gs = []
    for xi, wi in zip(chunk(xz, groups, 1), chunk(wf, groups, 0)):
        gs.append(_conv.conv2d(xi, contiguous(wi.transpose(0, 1)), None, 1, 0, (dh, dw)))
    y = gs[0] if groups == 1 else cat(gs, 1)
    if b is not None:
        y = y + b.reshape((1, -1, 1, 1))
    return y


def conv_transpose1d(x: Tensor, w: Tensor, b=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> Tensor:
    if x.ndim == 2:
        return conv_transpose1d(x.unsqueeze(0), w, b, stride, padding, output_padding, groups,
                                dilation).squeeze(0)
    one = lambda v: v[0] if isinstance(v, (tuple, list)) else v  # noqa: E731
    y = conv_transpose2d(x.unsqueeze(2), w.unsqueeze(2), b, (1, one(stride)),
                         (0, one(padding)), (0, one(output_padding)), groups,
                         (1, one(dilation)))
    return y.squeeze(2)


def max_pool1d(x, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,
               return_indices=False):
    one = lambda v: v[0] if isinstance(v, (tuple, list)) else v  # noqa: E731
    stride = kernel_size if stride is None else stride
    r = max_pool2d(x.unsqueeze(-2), (1, one(kernel_size)), (1, one(stride)), (0, one(padding)),
                   (1, one(dilation)), ceil_mode, return_indices)
    return tuple(t.squeeze(-2) for t in r) if return_indices else r.squeeze(-2)


def avg_pool1d(x, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True):
    one = lambda v: v[0] if isinstance(v, (tuple, list)) else v  # noqa: E731
    stride = kernel_size if stride is None else stride
    return avg_pool2d(x.unsqueeze(-2), (1, one(kernel_size)), (1, one(stride)),
                      (0, one(padding)), ceil_mode, count_include_pad).squeeze(-2)


def _adaptive_matrix(n_in: int, n_out: int) -> np.ndarray:
    """[n_out, n_in] averaging weights of PyTorch's adaptive windows."""
    m = np.zeros((n_out, n_in), np.float32)
    for o in range(n_out):
        a, b = (o * n_in) // n_out, -(-((o + 1) * n_in) // n_out)
        m[o, a:b] = 1.0 / (b - a)
    return m


def _apply_2d(x: Tensor, mh: np.ndarray, mw: np.ndarray) -> Tensor:
    """mh @ x @ mw^T over the last two dims (weights uploaded once per call)."""
    th = tensor(mh, device=x.device)
    tw = tensor(np.ascontiguousarray(mw.T), device=x.device)
    return matmul(matmul(th, _f32(x)), tw)


def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    H, W = x.shape[-2:]
    oh, ow = _conv.pair(output_size if not isinstance(output_size, (tuple, list)) else
                        tuple(H if o is None else o for o in output_size), "output_size")
    if H % oh == 0 and W % ow == 0 and x.ndim in (3, 4):
        return avg_pool2d(x, (H // oh, W // ow))
    return _apply_2d(x, _adaptive_matrix(H, oh), _adaptive_matrix(W, ow))


def adaptive_avg_pool1d(x: Tensor, output_size: int) -> Tensor:
    o = output_size[0] if isinstance(output_size, (tuple, list)) else output_size
    return matmul(_f32(x), tensor(np.ascontiguousarray(_adaptive_matrix(x.shape[-1], o).T),
                                  device=x.device))


def adaptive_max_pool2d(x: Tensor, output_size, return_indices: bool = False):
    """Windows that tile the input evenly (H and W multiples of the output size)."""
    H, W = x.shape[-2:]
    oh, ow = _conv.pair(output_size, "output_size")
    if H % oh or W % ow:
        raise NotImplementedError(f"adaptive_max_pool2d: {H}x{W} -> {oh}x{ow} has uneven "
                                  f"windows, which wgrumus does not support; pick an output "
                                  f"size that divides the input")
    return max_pool2d(x, (H // oh, W // ow), return_indices=return_indices)


def _source_index(n_in: int, n_out: int, scale, mode: str) -> np.ndarray:
    s = (1.0 / scale) if scale else n_in / n_out
    o = np.arange(n_out, dtype=np.float64)
    if mode == "nearest":
        src = np.floor(o * np.float32(s))
    else:  # nearest-exact
        src = np.floor((o + 0.5) * s)
    return np.minimum(src, n_in - 1).astype(np.int32)


def _linear_matrix(n_in: int, n_out: int, scale, align_corners: bool) -> np.ndarray:
    m = np.zeros((n_out, n_in), np.float64)
    for o in range(n_out):
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else 0.0
        else:
            s = (1.0 / scale) if scale else n_in / n_out
            src = max((o + 0.5) * s - 0.5, 0.0)
        i0 = min(int(math.floor(src)), n_in - 1)
        i1 = min(i0 + 1, n_in - 1)
        lam = src - i0
        m[o, i0] += 1.0 - lam
        m[o, i1] += lam
    return m.astype(np.float32)


def interpolate(x: Tensor, size=None, scale_factor=None, mode: str = "nearest",
                align_corners=None, recompute_scale_factor=None, antialias: bool = False):
    """F.interpolate for [N, C, L] and [N, C, H, W]: 'nearest', 'nearest-exact', 'linear',
    'bilinear' (antialias and bicubic are not supported)."""
    sp = x.ndim - 2
    if sp not in (1, 2):
        raise ShapeError(f"interpolate: input must be [N, C, L] or [N, C, H, W], got {x.shape}")
    if antialias or mode in ("bicubic", "trilinear", "area"):
        if mode == "area":
            return adaptive_avg_pool2d(x, size) if sp == 2 else adaptive_avg_pool1d(x, size)
        raise NotImplementedError(f"interpolate: mode {mode!r} / antialias is not supported")
    if (size is None) == (scale_factor is None):
        raise ValueError("interpolate: give size or scale_factor, one of them")
    ins = x.shape[2:]
    if size is not None:
        outs = tuple(size) if isinstance(size, (tuple, list)) else (size,) * sp
        scales = (None,) * sp
    else:
        sf = tuple(scale_factor) if isinstance(scale_factor, (tuple, list)) else \
            (scale_factor,) * sp
        outs = tuple(int(math.floor(n * f)) for n, f in zip(ins, sf))
        scales = (None,) * sp if recompute_scale_factor else sf
    if mode in ("nearest", "nearest-exact"):
        y = x
        for k in range(sp):
            y = index_select(y, 2 + k, _source_index(ins[k], outs[k], scales[k], mode))
        return y
    if mode not in ("linear", "bilinear"):
        raise ValueError(f"interpolate: unknown mode {mode!r}")
    ac = bool(align_corners)
    if sp == 1:
        m = _linear_matrix(ins[0], outs[0], scales[0], ac)
        return matmul(_f32(x), tensor(np.ascontiguousarray(m.T), device=x.device))
    return _apply_2d(x, _linear_matrix(ins[0], outs[0], scales[0], ac),
                     _linear_matrix(ins[1], outs[1], scales[1], ac))


__all__ = ["adaptive_avg_pool1d", "adaptive_avg_pool2d", "adaptive_max_pool2d", "avg_pool1d",
           "conv1d", "conv2d", "conv_transpose1d", "conv_transpose2d", "interpolate",
           "max_pool1d"]
