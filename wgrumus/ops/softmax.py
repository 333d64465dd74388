"""softmax and log_softmax along any dim (a permuted view puts it last), with PyTorch's
``dim=`` / ``dtype=`` and the attention options scale and causal mask; one row kernel each way
(kernels/rows.py), rows too long for one workgroup composed of reductions."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import no_grad, record
from ..kernels import rows
from ..runtime.errors import ShapeError
from ..tensor import Tensor, float32
from .dims import pick
from .elementwise import _f32, cast, contiguous, div, exp, mul, saved_output, sub
from .elementwise import log as log_
from .reduce import max as max_
from .reduce import sum as sum_
from .shape import _norm_axis, permute, reshape


def _along_last(x: Tensor, axis: int, fn):
    """Apply the last-axis row op ``fn`` along ``axis`` (a permute view on each side)."""
    nd = x.ndim
    if nd == 0:
        return reshape(fn(reshape(x, (1,))), ())
    if not -nd <= axis < nd:
        raise ShapeError(f"axis {axis} is out of range for a tensor with {nd} dimensions")
    axis %= nd
    if axis == nd - 1:
        return fn(x)
    perm = [a for a in range(nd) if a != axis] + [axis]
    inv = tuple(int(i) for i in np.argsort(perm))
    return permute(fn(permute(x, perm)), inv)


def _softmax_last(x: Tensor, log: bool, scale: float = 1.0, causal: bool = False) -> Tensor:
    xc = contiguous(_f32(x))
    if causal and xc.ndim < 2:
        raise ShapeError(f"causal softmax needs [..., queries, keys], got shape {xc.shape}")
    tq = xc.shape[-2] if causal else 0
    scale = float(scale)
    out = rows.softmax(xc, log, scale, tq, Tensor.empty(xc.shape, xc.device, float32))
    if out is None:
        return _softmax_long(xc, log, scale, causal)
    o = saved_output(out)  # no cycle out -> node -> closure -> out
    record("log_softmax" if log else "softmax", out, [xc],
           lambda g: (softmax_backward(o, g, log, scale, tq),), saved=[o])
    return out


def softmax_backward(out: Tensor, g: Tensor, log: bool = False, scale: float = 1.0,
                     tq: int = 0) -> Tensor:
    """d(input) of a last-axis (log_)softmax from its output, with the forward's ``scale`` and
    causal query count ``tq`` (0: no mask). One kernel."""
    return rows.softmax_backward(out, contiguous(g), Tensor.empty(out.shape, out.device, float32),
                                 log, scale, tq)


def _softmax_long(x: Tensor, log: bool, scale: float, causal: bool) -> Tensor:
    """(log_)softmax of rows too long for a workgroup, composed of autograd ops."""
    if causal:
        raise ShapeError(f"causal softmax over {x.shape[-1]} keys: rows this long are not "
                         f"supported with a causal mask; apply the mask to the scores instead")
    xs = mul(x, scale) if scale != 1.0 else x
    with no_grad():  # the shift cancels in the result
        m = max_(xs, axis=-1, keepdims=True)  # (positional dim: values and indices)
    z = sub(xs, m)
    e = exp(z)
    s = sum_(e, -1, keepdims=True)
    return sub(z, log_(s)) if log else div(e, s)


def _check_causal(axis, x, causal):
    if causal and axis not in (-1, x.ndim - 1):
        raise ShapeError(f"causal softmax works along the last axis (keys), not axis {axis}")


def _dim(x: Tensor, dim, dtype, axis) -> tuple:
    """(x cast to ``dtype``, the dim): PyTorch's ``dim=`` (numpy's ``axis=`` its alias, default
    the last), checked (an IndexError outside x's dims, as in PyTorch)."""
    if dtype is not None:
        x = cast(x, dtype)
    d = pick(dim, axis, -1)
    _norm_axis(d, x.ndim, "dim")
    return x, d


def softmax(x: Tensor, dim=None, dtype=None, *, axis=None, scale: float = 1.0,
            causal: bool = False) -> Tensor:
    """Softmax along ``dim`` (all -inf rows give NaN); ``dtype`` casts the input first
    (PyTorch's). For attention: ``scale`` multiplies x first; ``causal`` masks key j of query i
    where j > i + keys - queries ([..., q, k])."""
    x, d = _dim(x, dim, dtype, axis)
    _check_causal(d, x, causal)
    return _along_last(x, d, lambda t: _softmax_last(t, False, scale, causal))


def log_softmax(x: Tensor, dim=None, dtype=None, *, axis=None, scale: float = 1.0,
                causal: bool = False) -> Tensor:
    """x - logsumexp(x) along ``dim`` (stable); ``dtype``, ``scale``, ``causal`` as in softmax."""
    x, d = _dim(x, dim, dtype, axis)
    _check_causal(d, x, causal)
    return _along_last(x, d, lambda t: _softmax_last(t, True, scale, causal))
