"""Losses built on other ops, reduced as in PyTorch: nll_loss with class weights,
cross_entropy with class weights or class probabilities (log_softmax and nll_loss; class
indices alone run ops' fused kernels), l1. A weighted mean divides by the targets' total
weight."""
from __future__ import annotations

from ...ops import losses as _ce
from ...ops.elementwise import _f32, abs_, map_op, sub, where
from ...ops.indexing import as_index, gather, index_select
from ...ops.losses import _check_reduction, _reduce, _same_shape
from ...ops.reduce import mean as _mean
from ...ops.reduce import sum as _sum
from ...ops.softmax import log_softmax
from ...runtime.errors import ShapeError
from ...tensor import Tensor, int32


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
    input's shape), optional class weights and label smoothing. Class indices without weights
    run ops' fused kernels; the rest composes log_softmax and nll_loss."""
    probs = isinstance(target, Tensor) and target.dtype != int32
    if not probs and weight is None:
        return _ce.cross_entropy(x, target, ignore_index=ignore_index, reduction=reduction,
                                 label_smoothing=label_smoothing)
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



__all__ = ["cross_entropy", "l1_loss", "nll_loss"]
