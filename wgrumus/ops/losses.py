"""Losses, reduced as in PyTorch: cross_entropy (integer targets with label smoothing and
ignore_index in fused row kernels, kernels/rows.py; class probabilities or class weights composed
of log_softmax), nll_loss with class weights, binary cross-entropy (on probabilities and on
logits), mse / l1 / smooth_l1 / huber, kl_div. A weighted mean divides by the targets' total
weight; log clamps follow PyTorch's."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import needs_grad, record
from ..kernels import rows as row_kernels
from ..runtime.errors import DeviceMismatchError, ShapeError, WgrumusError
from ..tensor import Tensor, float32, int32, tensor
from .activations import softplus, unary_map
from .elementwise import _f32, abs_, add, contiguous, div, map_op, mul, neg, sub, unbroadcast, where
from .indexing import as_index, gather, index_select
from .reduce import mean as _mean
from .reduce import sum as _sum
from .shape import permute, reshape
from .softmax import _softmax_long, log_softmax

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
                               f"{targets.dtype}; convert with .int()")
        if targets.device is not like.device:
            raise DeviceMismatchError(f"cross_entropy: logits on {like.device}, targets on "
                                      f"{targets.device}; move them with .to(device) first")
        return contiguous(targets), None
    a = np.asarray(targets)
    if a.dtype.kind not in "iu":
        raise WgrumusError(f"cross_entropy targets must be integer class indices, got numpy "
                           f"dtype {a.dtype}")
    return Tensor.from_numpy(a.astype(np.int64), device=like.device, dtype=int32), a


def _class_cross_entropy(logits: Tensor, targets, ignore_index: int = -100,
                         label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """cross_entropy with integer targets and no class weights (logits [N, C], [C] or
    [N, C, d...]) in the fused row kernels. A target outside [0, C) raises: host targets at
    once, device targets at the next host read."""
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
    got = row_kernels.cross_entropy_rows(lg, tt, int(ignore_index), eps, host is not None,
                                         Tensor.empty((N,), lg.device, float32))
    if got is None:
        out = _cross_entropy_long(lg, tt, int(ignore_index), eps, reduction)
        return reshape(out, tshape) if reduction == "none" else out
    per_row, lse = got
    out, count = per_row, None
    if reduction != "none":
        red = row_kernels.cross_entropy_reduce(per_row, tt, int(ignore_index),
                                               reduction == "mean",
                                               Tensor.empty((2,), lg.device, float32))
        out, count = Tensor(red.storage, ()), Tensor(red.storage, (), offset=1)
    mode = {"mean": 0, "sum": 1, "none": 2}[reduction]

    def bw(g):
        g = contiguous(g)
        return (row_kernels.cross_entropy_backward(lg, tt, lse, g,
                                                   count if count is not None else g,
                                                   int(ignore_index), eps, mode,
                                                   Tensor.empty((N, C), g.device, float32)),)
    record("cross_entropy", out, [lg], bw, saved=[lg, tt])
    return reshape(out, tshape) if reduction == "none" else out


def _cross_entropy_long(lg: Tensor, tt: Tensor, ignore: int, eps: float, reduction: str):
    """cross_entropy past the fused kernels' bounds, composed of autograd ops."""
    N = lg.shape[0]
    lsm = _softmax_long(lg, True, 1.0, False)
    safe = map_op("select(a, 0, a == ignore)", [tt], dtype=int32, scalars={"ignore": ignore})
    loss = neg(reshape(gather(lsm, 1, reshape(safe, (N, 1))), (N,)))
    if eps:
        loss = add(mul(loss, 1.0 - eps), mul(reshape(_mean(lsm, 1), (N,)), -eps))
    keep = map_op("select(1.0, 0.0, a == ignore)", [tt], scalars={"ignore": ignore})
    rows = mul(loss, keep)
    if reduction == "none":
        return rows
    return _sum(rows) if reduction == "sum" else div(_sum(rows), _sum(keep))


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
    return _mean(sq) if reduction == "mean" else _sum(sq)


def _reduce(loss: Tensor, reduction: str) -> Tensor:
    _check_reduction(reduction)
    return loss if reduction == "none" else _sum(loss) if reduction == "sum" else _mean(loss)


def _same_shape(x: Tensor, t: Tensor, op: str) -> Tensor:
    if not isinstance(t, Tensor):
        t = tensor(t, device=x.device)
    if tuple(t.shape) != tuple(x.shape):
        raise ShapeError(f"{op}: target shape {tuple(t.shape)} differs from input shape "
                         f"{tuple(x.shape)}; they must match")
    return _f32(t)


def binary_cross_entropy(x: Tensor, target, weight=None, reduction: str = "mean") -> Tensor:
    """-(t log x + (1 - t) log(1 - x)), each log clamped at -100 as in PyTorch (x in [0, 1])."""
    x = _f32(x)
    t = _same_shape(x, target, "binary_cross_entropy")
    out = map_op("-(b * max(log(a), -100.0) + (1.0 - b) * max(log(1.0 - a), -100.0))", [x, t])
    if needs_grad(x, t):
        def bw(g):
            return (map_op("a * (b - c) / max((1.0 - b) * b, 1e-12)", [g, x, t])
                    if x.requires_grad else None,
                    map_op("a * (max(log(1.0 - b), -100.0) - max(log(b), -100.0))", [g, x])
                    if t.requires_grad else None)
        record("binary_cross_entropy", out, [x, t], bw, saved=[x, t])
    if weight is not None:
        out = out * weight
    return _reduce(out, reduction)


def binary_cross_entropy_with_logits(x: Tensor, target, weight=None, reduction: str = "mean",
                                     pos_weight=None) -> Tensor:
    """(1 - t) x + (1 + (pos_weight - 1) t) log(1 + exp(-x)), stable for any x."""
    x = _f32(x)
    t = _same_shape(x, target, "binary_cross_entropy_with_logits")
    if pos_weight is None:
        out = map_op("(1.0 - b) * a + softplus_(-a)", [x, t])
        if needs_grad(x, t):
            def bw(g):
                return (map_op("a * (sigmoid_(b) - c)", [g, x, t]) if x.requires_grad else None,
                        map_op("-a * b", [g, x]) if t.requires_grad else None)
            record("binary_cross_entropy_with_logits", out, [x, t], bw, saved=[x, t])
    else:
        lw = 1.0 + (pos_weight - 1.0) * t
        out = (1.0 - t) * x + lw * softplus(-x, threshold=1e30)
    if weight is not None:
        out = out * weight
    return _reduce(out, reduction)


def _class_last(x: Tensor):
    """[N, C, d...] -> ([N * d..., C], the per-sample shape (N, d...)); [C] -> ([1, C], ())."""
    if x.ndim == 1:
        return x.reshape((1, -1)), ()
    if x.ndim < 1:
        raise ShapeError("the input needs a class dimension")
    rest = (x.shape[0],) + x.shape[2:]
    if x.ndim > 2:
        x = x.permute([0] + list(range(2, x.ndim)) + [1])
    return x.reshape((-1, x.shape[-1])), rest


def _class_targets(target, like: Tensor, shape: tuple):
    t = as_index(target, like, 2 ** 31 - 1, "nll_loss", allow_negative=True) \
        if not isinstance(target, Tensor) else target
    if t.dtype != int32:
        raise TypeError(f"class targets must be int32 class indices, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ShapeError(f"targets of shape {tuple(t.shape)} for an input with per-sample shape "
                         f"{shape}")
    return t.reshape((-1,))


def nll_loss(x: Tensor, target, weight=None, ignore_index: int = -100,
             reduction: str = "mean") -> Tensor:
    """-weight[t] x[n, t] per sample (x: log-probabilities [N, C] or [N, C, d...]); 'mean'
    divides by the total weight of the targets that are not ignored."""
    _check_reduction(reduction)
    rows, shape = _class_last(_f32(x))
    C = rows.shape[1]
    t = _class_targets(target, rows, shape)
    keep = map_op("select(0.0, 1.0, a != ig)", [t], scalars={"ig": int(ignore_index)})
    safe = where(keep, t, 0)
    picked = gather(rows, 1, safe.reshape((-1, 1))).reshape((-1,))
    if weight is not None:
        if weight.shape != (C,):
            raise ShapeError(f"nll_loss: weight must have one value per class ({C}), got "
                             f"{weight.shape}")
        w = index_select(_f32(weight), 0, safe) * keep
    else:
        w = keep
    loss = -(picked * w)
    if reduction == "none":
        return loss.reshape(shape)
    if reduction == "sum":
        return _sum(loss)
    return _sum(loss) / _sum(w)


def cross_entropy(x: Tensor, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """PyTorch's cross_entropy: class-index targets (int32) or class probabilities (float, the
    input's shape), optional class weights and label smoothing."""
    probs = isinstance(target, Tensor) and target.dtype != int32
    if not probs and weight is None:
        return _class_cross_entropy(x, target, ignore_index, label_smoothing, reduction)
    if probs and tuple(target.shape) != tuple(x.shape):
        raise ShapeError(f"cross_entropy: target shape {tuple(target.shape)} differs from input "
                         f"shape {tuple(x.shape)}: {target.dtype} targets are class "
                         f"probabilities of the input's shape; class indices must be int32 "
                         f"(.int())")
    _check_reduction(reduction)
    rows, shape = _class_last(_f32(x))
    C = rows.shape[1]
    logp = log_softmax(rows, -1)
    wrow = None if weight is None else _f32(weight).reshape((1, C))
    ls = float(label_smoothing)
    if probs:
        t, _ = _class_last(_same_shape(x, target, "cross_entropy"))
        if ls:
            t = t * (1.0 - ls) + ls / C
        lw = logp * t if wrow is None else logp * t * wrow
        loss = -_sum(lw, 1)
        if reduction == "none":
            return loss.reshape(shape)
        return _sum(loss) if reduction == "sum" else _mean(loss)
    lp = logp if x.ndim != 1 else logp.reshape((C,))
    nll = nll_loss(lp if x.ndim < 3 else _rows_back(logp, x), target, weight, ignore_index,
                   "none").reshape((-1,))
    t = _class_targets(target, rows, shape)
    keep = map_op("select(0.0, 1.0, a != ig)", [t], scalars={"ig": int(ignore_index)})
    if ls:
        smooth = -_sum(logp * wrow, 1) * keep / C
        nll = nll * (1.0 - ls) + smooth * ls
    if reduction == "none":
        return nll.reshape(shape)
    if reduction == "sum":
        return _sum(nll)
    return _sum(nll) / _sum(index_select(_f32(weight), 0, where(keep, t, 0)) * keep)


def _rows_back(rows: Tensor, like: Tensor) -> Tensor:
    """[N * d..., C] rows back in ``like``'s [N, C, d...] layout."""
    nd = like.ndim
    r = rows.reshape((like.shape[0],) + like.shape[2:] + (like.shape[1],))
    return r.permute([0, nd - 1] + list(range(1, nd - 1)))


def l1_loss(x: Tensor, target, reduction: str = "mean") -> Tensor:
    return _reduce(abs_(sub(x, target)), reduction)


def smooth_l1_loss(x: Tensor, target, reduction: str = "mean", beta: float = 1.0) -> Tensor:
    """0.5 d^2 / beta where |d| < beta, else |d| - 0.5 beta (beta 0: l1)."""
    return _reduce(_piecewise(x, target, "smooth_l1", beta, 1.0 / beta if beta else 0.0),
                   reduction)


def huber_loss(x: Tensor, target, reduction: str = "mean", delta: float = 1.0) -> Tensor:
    """0.5 d^2 where |d| <= delta, else delta (|d| - 0.5 delta)."""
    return _reduce(_piecewise(x, target, "huber", delta, 1.0), reduction)


def _piecewise(x, target, name, beta, scale) -> Tensor:
    """smooth_l1 (scale 1/beta) and huber (scale 1, times delta outside) in one kernel."""
    d = _f32(sub(x, target))
    s = {"be": float(beta), "sc": float(scale)}
    if name == "huber":
        fwd = "select(be * (abs(a) - 0.5 * be), 0.5 * a * a, abs(a) <= be)"
        bwd = "select(a * be * sign(b), a * b, abs(b) <= be)"
    else:
        fwd = "select(abs(a) - 0.5 * be, 0.5 * a * a * sc, abs(a) < be)"
        bwd = "select(a * sign(b), a * b * sc, abs(b) < be)"
    return unary_map(name, d, fwd, bwd, s)


def kl_div(x: Tensor, target, reduction: str = "mean", log_target: bool = False) -> Tensor:
    """target * (log target - x) pointwise (x holds log-probabilities); 'batchmean' divides
    the sum by the batch size, as PyTorch recommends."""
    x = _f32(x)
    t = _same_shape(x, target, "kl_div")
    if log_target:
        out = map_op("exp(b) * (b - a)", [x, t])
        grads = ("-a * exp(c)", "a * exp(c) * (c - b + 1.0)")
    else:
        out = map_op("select(b * (log(b) - a), 0.0, b == 0.0)", [x, t])
        grads = ("-a * c", "select(a * (log(c) - b + 1.0), 0.0, c == 0.0)")
    if needs_grad(x, t):
        def bw(g):
            return (map_op(grads[0], [g, x, t]) if x.requires_grad else None,
                    map_op(grads[1], [g, x, t]) if t.requires_grad else None)
        record("kl_div", out, [x, t], bw, saved=[x, t])
    if reduction == "batchmean":
        return _sum(out) / float(x.shape[0] if x.ndim else 1)
    return _reduce(out, reduction)


__all__ = ["binary_cross_entropy", "binary_cross_entropy_with_logits", "cross_entropy",
           "huber_loss", "kl_div", "l1_loss", "mse_loss", "nll_loss", "smooth_l1_loss"]
