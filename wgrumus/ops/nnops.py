"""Neural-network ops: softmax, log_softmax, layer_norm, dropout, cross_entropy, mse_loss.

Each op is a fused kernel with a fused backward. Row ops work on a contiguous [R, L] block: a
workgroup per row on GPUs, an invocation per row on CPU adapters (``row_mode``) within the loop
budget; rows too long for a workgroup are composed of chunked reductions; kernels/rows_gpu.py's
GPU variants take the passes its table names. Nothing here reads device data back to the host.
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import no_grad, record
from ..kernels import rows
from ..runtime.errors import DeviceMismatchError, ShapeError, WgrumusError
from ..tensor import Tensor, check_same_device, int32, tensor
from .elementwise import (
    _f32,
    add,
    contiguous,
    div,
    exp,
    map_op,
    mul,
    neg,
    rsqrt,
    saved_output,
    square,
    sub,
    unbroadcast,
)
from .elementwise import log as log_
from .indexing import gather
from .random import next_seed
from .reduce import max as max_
from .reduce import mean as mean_
from .reduce import sum as sum_
from .shape import permute, reshape

DROPOUT_STREAM = 0x0D0D  # RNG stream of dropout masks (rand/randn use streams 0 and 1)


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
    out = rows.softmax(xc, log, scale, tq)
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
    return rows.softmax_backward(out, contiguous(g), log, scale, tq)


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


def softmax(x: Tensor, axis: int = -1, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """Softmax along ``axis`` (all -inf rows give NaN). For attention: ``scale`` multiplies x
    first; ``causal`` masks key j of query i where j > i + keys - queries ([..., q, k])."""
    _check_causal(axis, x, causal)
    return _along_last(x, axis, lambda t: _softmax_last(t, False, scale, causal))


def log_softmax(x: Tensor, axis: int = -1, *, scale: float = 1.0,
                causal: bool = False) -> Tensor:
    """x - logsumexp(x) along ``axis`` (stable); ``scale``, ``causal`` as in softmax."""
    _check_causal(axis, x, causal)
    return _along_last(x, axis, lambda t: _softmax_last(t, True, scale, causal))


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
    got = rows.layer_norm(xc, wc, bc, L, eps)
    if got is None:
        return _layer_norm_long(xc, wc, bc, R, L, eps)
    out, mean, rstd = got

    def bw(g):
        g = contiguous(g)
        gw = gbias = None
        want = (wc is not None and wc.requires_grad) or (bc is not None and bc.requires_grad)
        got = (rows.layer_norm_backward_with_wb(xc, g, wc, mean, rstd)
               if want and xc.requires_grad else None)
        if got is not None:
            dx, both = got
        else:
            dx = rows.layer_norm_backward(xc, g, wc, mean, rstd) if xc.requires_grad else None
            both = rows.layer_norm_weight_bias_grads(xc, g, mean, rstd, R, L) if want else None
        if want:
            gw = reshape(both[0], ns) if wc is not None else None
            gbias = reshape(both[1], ns) if bc is not None else None
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


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed=None) -> Tensor:
    """Inverted dropout; the mask is a pure function of (seed, index), so backward regenerates
    it instead of storing it (``seed=None``: the global generator)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    x = _f32(x)
    if p == 1.0:
        out = map_op("0.0", [x])
        record("dropout", out, [x], lambda g: (map_op("0.0", [g], shape=x.shape),))
        return out
    s = next_seed(seed)
    expr = f"select(0.0, a * scale, uniform_(seed, i, {DROPOUT_STREAM}u) >= p)"
    scalars = {"seed": np.uint32(s), "scale": 1.0 / (1.0 - p), "p": float(p)}
    out = map_op(expr, [x], scalars=scalars)
    record("dropout", out, [x], lambda g: (map_op(expr, [g], shape=x.shape, scalars=scalars),))
    return out


_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _targets(targets, like: Tensor):
    """(int32 targets on ``like``'s device, the host array or None: host data is range-checked
    before upload, device data by the kernel)."""
    if isinstance(targets, Tensor):
        if targets.dtype != int32:
            raise WgrumusError(f"cross_entropy targets must be int32 class indices, got "
                               f"{targets.dtype}; convert with .int() (probabilities as targets "
                               f"are not supported)")
        if targets.device is not like.device:
            raise DeviceMismatchError(f"cross_entropy: logits on {like.device}, targets on "
                                      f"{targets.device}; move them with .to(device) first")
        return contiguous(targets), None
    a = np.asarray(targets)
    if a.dtype.kind not in "iu":
        raise WgrumusError(f"cross_entropy targets must be integer class indices, got numpy "
                           f"dtype {a.dtype}")
    return Tensor.from_numpy(a.astype(np.int64), device=like.device, dtype=int32), a


def cross_entropy(logits: Tensor, targets, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """PyTorch's cross_entropy with integer targets (logits [N, C], [C] or [N, C, d...]). A
    target outside [0, C) raises: host targets at once, device targets at the next host read."""
    _check_reduction(reduction)
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {eps}")
    if logits.ndim == 0:
        raise ShapeError("cross_entropy: logits must have a class dimension, got a 0-d tensor")
    lg = _f32(logits)
    if lg.ndim == 1:
        lg = reshape(lg, (1,) + lg.shape)
        tshape = ()
    else:
        tshape = (lg.shape[0],) + lg.shape[2:]
    if lg.ndim > 2:  # [N, C, d...] -> [N * d..., C]
        lg = permute(lg, [0] + list(range(2, lg.ndim)) + [1])
    C = lg.shape[-1]
    lg = contiguous(reshape(lg, (-1, C)) if lg.ndim != 2 else lg)
    N = lg.shape[0]
    tt, host = _targets(targets, lg)
    if host is not None:
        bad = host[(host != ignore_index) & ((host < 0) | (host >= C))]
        if bad.size:
            raise WgrumusError(f"cross_entropy: target {int(bad.flat[0])} is out of range for "
                               f"{C} classes (valid: 0..{C - 1} or ignore_index={ignore_index})")
    if tuple(tt.shape) != tshape:
        raise ShapeError(f"cross_entropy: targets shape {tuple(tt.shape)} does not match logits "
                         f"shape {tuple(logits.shape)} (expected {tshape})")
    tt = reshape(tt, (N,)) if tt.ndim != 1 else tt
    got = rows.cross_entropy_rows(lg, tt, int(ignore_index), eps, host is not None)
    if got is None:
        out = _cross_entropy_long(lg, tt, int(ignore_index), eps, reduction)
        return reshape(out, tshape) if reduction == "none" else out
    per_row, lse = got
    out, count = per_row, None
    if reduction != "none":
        out, count = rows.cross_entropy_reduce(per_row, tt, int(ignore_index), reduction == "mean")
    mode = {"mean": 0, "sum": 1, "none": 2}[reduction]

    def bw(g):
        g = contiguous(g)
        return (rows.cross_entropy_backward(lg, tt, lse, g, count if count is not None else g,
                                            int(ignore_index), eps, mode),)
    record("cross_entropy", out, [lg], bw, saved=[lg, tt])
    return reshape(out, tshape) if reduction == "none" else out


def _cross_entropy_long(lg: Tensor, tt: Tensor, ignore: int, eps: float, reduction: str):
    """cross_entropy past the fused kernels' bounds, composed of autograd ops."""
    N = lg.shape[0]
    lsm = _softmax_long(lg, True, 1.0, False)
    safe = map_op("select(a, 0, a == ignore)", [tt], dtype=int32, scalars={"ignore": ignore})
    loss = neg(reshape(gather(lsm, 1, reshape(safe, (N, 1))), (N,)))
    if eps:
        loss = add(mul(loss, 1.0 - eps), mul(reshape(mean_(lsm, 1), (N,)), -eps))
    keep = map_op("select(1.0, 0.0, a == ignore)", [tt], scalars={"ignore": ignore})
    rows = mul(loss, keep)
    if reduction == "none":
        return rows
    return sum_(rows) if reduction == "sum" else div(sum_(rows), sum_(keep))


def mse_loss(a: Tensor, b: Tensor, reduction: str = "mean") -> Tensor:
    """(a - b)^2, reduced (a and b broadcast together, as in PyTorch)."""
    _check_reduction(reduction)
    if not isinstance(b, Tensor):
        b = tensor(np.asarray(b, np.float32), device=a.device)
    a, b = _f32(a), _f32(b)
    sq = map_op("(a - b) * (a - b)", [a, b])

    def bw(g):
        d = map_op("2.0 * a * (b - c)", [g, a, b])
        return (unbroadcast(d, a.shape) if a.requires_grad else None,
                unbroadcast(map_op("-a", [d]), b.shape) if b.requires_grad else None)
    record("mse", sq, [a, b], bw, saved=[a, b])
    if reduction == "none":
        return sq
    return mean_(sq) if reduction == "mean" else sum_(sq)
