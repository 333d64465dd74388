"""Losses with kernels or gradients of their own, reduced as in PyTorch: cross_entropy (integer
targets with label smoothing and ignore_index in fused row kernels, kernels/rows.py), binary
cross-entropy (on probabilities and on logits), mse / smooth_l1 / huber, kl_div; log clamps
follow PyTorch's. nll_loss, l1 and cross_entropy with class weights or probabilities build on
these (wgrumus/nn/functional/losses.py)."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import needs_grad, record
from ..kernels import rows as row_kernels
from ..runtime.errors import DeviceMismatchError, ShapeError, WgrumusError
from ..tensor import Tensor, float32, int32, tensor
from .activations import softplus, unary_map
from .elementwise import _f32, add, contiguous, div, map_op, mul, neg, sub, unbroadcast
from .indexing import gather
from .reduce import mean as _mean
from .reduce import sum as _sum
from .shape import permute, reshape
from .softmax import _softmax_long

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


def cross_entropy(x: Tensor, target, weight=None, ignore_index: int = -100,
                  reduction: str = "mean", label_smoothing: float = 0.0) -> Tensor:
    """cross_entropy with integer targets and no class weights (logits [N, C], [C] or
    [N, C, d...]) in the fused row kernels. A target outside [0, C) raises: host targets at
    once, device targets at the next host read. Class weights and class probabilities compose
    ops: wgrumus.nn.functional.cross_entropy."""
    logits, targets = x, target
    if weight is not None or isinstance(targets, Tensor) and targets.dtype != int32 and \
            tuple(targets.shape) == tuple(logits.shape):
        raise WgrumusError("ops.cross_entropy takes int32 class targets without class weights "
                           "(the fused kernels); for class weights or class probabilities use "
                           "wgrumus.nn.functional.cross_entropy")
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
           "huber_loss", "kl_div", "mse_loss", "smooth_l1_loss"]
