"""layer_norm over the trailing dims (PyTorch's, biased variance): one row kernel forward, the
input's and the weight and bias gradients in one or two more (kernels/rows.py); rows too long
for one workgroup composed of reductions."""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import record
from ..kernels import rows
from ..runtime.errors import ShapeError
from ..tensor import Tensor, check_same_device, float32
from .elementwise import _f32, add, contiguous, mul, rsqrt, square, sub
from .reduce import mean as mean_
from .shape import reshape


def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """PyTorch's layer_norm over the trailing ``normalized_shape`` dims (biased variance)."""
    ns = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(int(s) for s in normalized_shape)
    if len(ns) > x.ndim or x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"layer_norm: normalized_shape {ns} does not match the trailing "
                         f"dimensions of the input shape {x.shape}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != ns:
            raise ShapeError(f"layer_norm: {name} shape {tuple(p.shape)} != normalized_shape {ns}")
    check_same_device(x, *(p for p in (weight, bias) if p is not None), op="layer_norm")
    xc = contiguous(_f32(x))
    wc = contiguous(_f32(weight)) if weight is not None else None
    bc = contiguous(_f32(bias)) if bias is not None else None
    L = math.prod(ns)
    R = xc.numel() // L if L else 0
    got = rows.layer_norm(xc, wc, bc, L, eps, Tensor.empty(xc.shape, xc.device, float32))
    if got is None:
        return _layer_norm_long(xc, wc, bc, R, L, eps)
    out, mean, rstd = got

    def bw(g):
        g = contiguous(g)
        gw = gbias = None
        want = (wc is not None and wc.requires_grad) or (bc is not None and bc.requires_grad)
        dev = g.device
        dx = Tensor.empty(xc.shape, dev, float32) if xc.requires_grad else None
        both = Tensor.empty((2, L), dev, float32) if want else None  # d(weight), d(bias)
        if not (want and dx is not None
                and rows.layer_norm_backward_with_wb(xc, g, wc, mean, rstd, dx, both)):
            if dx is not None:
                rows.layer_norm_backward(xc, g, wc, mean, rstd, dx)
            if want:
                rows.layer_norm_weight_bias_grads(xc, g, mean, rstd, R, L, both)
        if want:
            gw, gbias = (Tensor(both.storage, ns, None, both.offset + i * L) if p is not None
                         else None for i, p in enumerate((wc, bc)))
        return dx, gw, gbias
    record("layer_norm", out, [xc, wc, bc], bw, saved=[xc] + ([wc] if wc is not None else []))
    return out


def _layer_norm_long(xc, wc, bc, R, L, eps):
    """layer_norm of rows too long for a workgroup, composed of autograd ops."""
    x2 = reshape(xc, (R, L))
    d = sub(x2, mean_(x2, 1, keepdims=True))
    y = reshape(mul(d, rsqrt(add(mean_(square(d), 1, keepdims=True), float(eps)))), xc.shape)
    y = mul(y, wc) if wc is not None else y
    return add(y, bc) if bc is not None else y
