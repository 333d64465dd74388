"""Losses: cross_entropy (integer targets, label smoothing, ignore_index; fused row kernels,
kernels/rows.py) and mse_loss, reduced as in PyTorch."""
from __future__ import annotations

import numpy as np

from ..autograd.tape import record
from ..kernels import rows
from ..runtime.errors import DeviceMismatchError, ShapeError, WgrumusError
from ..tensor import Tensor, int32, tensor
from .elementwise import _f32, add, contiguous, div, map_op, mul, neg, unbroadcast
from .indexing import gather
from .reduce import mean as mean_
from .reduce import sum as sum_
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
