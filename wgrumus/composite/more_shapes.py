"""More of PyTorch's shape helpers and small compositions: narrow / select / movedim /
swapaxes / take_along_dim, hstack / vstack / dstack / column_stack, atleast_nd, outer / dot /
diff, diag / trace, clamp with tensor bounds, var_mean / std_mean, cosine_similarity /
pairwise_distance / cdist. Views and other ops only."""
from __future__ import annotations

from ..ops.elementwise import binary, clamp, clone, gt, lt, where
from ..ops.indexing import gather
from ..ops.mathfn import distance_sqrt
from ..ops.matmul import matmul
from ..ops.reduce import mean, std, sum, var  # noqa: A004
from ..ops.shape import _norm_axis, cat, getitem, permute, reshape, unsqueeze
from ..ops.triangular import diag_embed, diagonal
from ..runtime.errors import ShapeError
from ..tensor import Tensor
from .reductions import vector_norm


def narrow(x: Tensor, dim: int, start: int, length: int) -> Tensor:
    d = _norm_axis(dim, x.ndim, "dim")
    n = x.shape[d]
    start = start + n if start < 0 else start
    if not (0 <= start and length >= 0 and start + length <= n):
        raise IndexError(f"narrow: [{start}, {start + length}) is outside dim {d} of size {n}")
    return getitem(x, (slice(None),) * d + (slice(start, start + length),))


def select(x: Tensor, dim: int, index: int) -> Tensor:
    d = _norm_axis(dim, x.ndim, "dim")
    return getitem(x, (slice(None),) * d + (int(index),))


def movedim(x: Tensor, source, destination) -> Tensor:
    src = [source] if isinstance(source, int) else list(source)
    dst = [destination] if isinstance(destination, int) else list(destination)
    if len(src) != len(dst):
        raise ShapeError(f"movedim: {len(src)} source dims for {len(dst)} destinations")
    src = [_norm_axis(s, x.ndim, "dim") for s in src]
    dst = [_norm_axis(s, x.ndim, "dim") for s in dst]
    rest = [k for k in range(x.ndim) if k not in src]
    order = [None] * x.ndim
    for s, t in zip(src, dst):
        order[t] = s
    it = iter(rest)
    order = [next(it) if o is None else o for o in order]
    return permute(x, order)


moveaxis = movedim


def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    return x.transpose(a, b)


swapdims = swapaxes


def take_along_dim(x: Tensor, indices, dim=None) -> Tensor:
    if dim is None:
        return gather(reshape(x, (-1,)), 0, indices.reshape((-1,)) if isinstance(
            indices, Tensor) else indices)
    d = _norm_axis(dim, x.ndim, "dim")
    shape = tuple(indices.shape)
    full = tuple(max(a, b) if k != d else b for k, (a, b) in enumerate(zip(x.shape, shape)))
    xs = x.expand(tuple(s if k != d else x.shape[d] for k, s in enumerate(full)))
    it = indices.expand(full) if isinstance(indices, Tensor) else indices
    return gather(xs, d, it)


def atleast_1d(x: Tensor) -> Tensor:
    return reshape(x, (1,)) if x.ndim == 0 else x


def atleast_2d(x: Tensor) -> Tensor:
    return reshape(x, (1,) * (2 - x.ndim) + x.shape) if x.ndim < 2 else x


def atleast_3d(x: Tensor) -> Tensor:
    if x.ndim == 0:
        return reshape(x, (1, 1, 1))
    if x.ndim == 1:
        return reshape(x, (1, x.shape[0], 1))
    if x.ndim == 2:
        return unsqueeze(x, 2)
    return x


def hstack(ts) -> Tensor:
    ts = [atleast_1d(t) for t in ts]
    return cat(ts, 0 if ts[0].ndim == 1 else 1)


def vstack(ts) -> Tensor:
    return cat([atleast_2d(t) for t in ts], 0)


row_stack = vstack


def dstack(ts) -> Tensor:
    return cat([atleast_3d(t) for t in ts], 2)


def column_stack(ts) -> Tensor:
    return cat([reshape(t, (-1, 1)) if t.ndim <= 1 else t for t in ts], 1)


def outer(a: Tensor, b: Tensor) -> Tensor:
    return binary("mul", reshape(a, (-1, 1)), reshape(b, (1, -1)))


ger = outer


def dot(a: Tensor, b: Tensor) -> Tensor:
    if a.ndim != 1 or b.ndim != 1 or a.shape != b.shape:
        raise ShapeError(f"dot takes two 1-D tensors of one size, got {a.shape} and {b.shape}")
    return sum(binary("mul", a, b))


vdot = inner = dot


def diff(x: Tensor, n: int = 1, dim: int = -1, prepend=None, append=None) -> Tensor:
    d = _norm_axis(dim, x.ndim, "dim")
    if prepend is not None or append is not None:
        x = cat([t for t in (prepend, x, append) if t is not None], d)
    for _ in range(n):
        L = x.shape[d]
        lead = (slice(None),) * d
        x = binary("sub", getitem(x, lead + (slice(1, L),)), getitem(x, lead + (slice(0, L - 1),)))
    return x


def clamp_tensor(x: Tensor, min=None, max=None) -> Tensor:  # noqa: A002
    """clamp with tensor bounds (broadcast); the gradient goes to x where it is inside, to a
    bound where it is taken (NaN stays)."""
    if not isinstance(min, Tensor) and not isinstance(max, Tensor):
        return clamp(x, min, max)
    out = x
    if min is not None:
        out = where(lt(out, min), min, out)
    if max is not None:
        out = where(gt(out, max), max, out)
    return out


def clamp_min(x: Tensor, min) -> Tensor:  # noqa: A002
    return clamp_tensor(x, min, None)


def clamp_max(x: Tensor, max) -> Tensor:  # noqa: A002
    return clamp_tensor(x, None, max)


def var_mean(x: Tensor, dim=None, keepdim: bool = False, *, correction=1, unbiased=None):
    return (var(x, dim, keepdim, correction=correction if unbiased is None else None,
                unbiased=unbiased), mean(x, dim, keepdim))


def std_mean(x: Tensor, dim=None, keepdim: bool = False, *, correction=1, unbiased=None):
    return (std(x, dim, keepdim, correction=correction if unbiased is None else None,
                unbiased=unbiased), mean(x, dim, keepdim))


def cosine_similarity(a: Tensor, b: Tensor, dim: int = 1, eps: float = 1e-8) -> Tensor:
    """a . b / max(|a| |b|, eps) along ``dim`` (PyTorch's clamp of the product of the norms)."""
    num = sum(binary("mul", a, b), dim)
    den = clamp(binary("mul", vector_norm(a, 2, dim), vector_norm(b, 2, dim)), min=eps)
    return binary("div", num, den)


def pairwise_distance(a: Tensor, b: Tensor, p: float = 2.0, eps: float = 1e-6,
                      keepdim: bool = False) -> Tensor:
    """||a - b + eps||_p over the last dim."""
    return vector_norm(binary("add", binary("sub", a, b), eps), p, -1, keepdim)


def cdist(a: Tensor, b: Tensor, p: float = 2.0) -> Tensor:
    """[..., P, M] x [..., R, M] -> [..., P, R] p-norm distances; p = 2 through a matmul."""
    if p == 2.0:
        aa = sum(binary("mul", a, a), -1, True)
        bb = sum(binary("mul", b, b), -1, True)
        d2 = binary("sub", binary("add", aa, bb.transpose(-1, -2)),
                    binary("mul", matmul(a, b.transpose(-1, -2)), 2.0))
        return distance_sqrt(d2)
    return vector_norm(binary("sub", unsqueeze(a, -2), unsqueeze(b, -3)), p, -1)


def diag(x: Tensor, diagonal_: int = 0) -> Tensor:
    """torch.diag: a 1-D tensor -> the square matrix with it on a diagonal; a 2-D matrix ->
    its diagonal (a copy)."""
    if x.ndim == 1:
        return diag_embed(x, diagonal_)
    if x.ndim == 2:
        return clone(diagonal(x, diagonal_))
    raise ShapeError(f"diag takes a 1-D or 2-D tensor, got shape {x.shape}")


def trace(x: Tensor) -> Tensor:
    if x.ndim != 2:
        raise ShapeError(f"trace takes a 2-D tensor, got shape {x.shape}")
    return sum(diagonal(x))


__all__ = ["atleast_1d", "atleast_2d", "atleast_3d", "cdist", "clamp_max", "clamp_min",
           "column_stack", "cosine_similarity", "diag", "diff", "dot", "dstack", "ger", "hstack",
           "inner", "movedim", "moveaxis", "narrow", "outer", "pairwise_distance", "row_stack",
           "select", "std_mean", "swapaxes", "swapdims", "take_along_dim", "trace", "var_mean",
           "vdot", "vstack"]
