"""einsum by pairwise contraction: each pair of operands becomes one batched matmul (dims moved
by views, summed-only dims reduced first, repeated letters read as diagonals), so every
product runs on the tiled matmul kernel with its autograd."""
from __future__ import annotations

import math
import string

from ..ops.matmul import matmul
from ..ops.reduce import sum as _sum
from ..ops.shape import permute, reshape
from ..ops.triangular import diagonal
from ..runtime.errors import ShapeError
from ..tensor import Tensor


def _parse(eq: str, ops) -> tuple:
    eq = eq.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ops):
        raise ShapeError(f"einsum: {len(terms)} operand subscripts for {len(ops)} tensors")
    used = set(c for c in eq if c.isalpha())
    spare = [c for c in string.ascii_letters if c not in used]
    ell = None
    out_terms = []
    for t, x in zip(terms, ops):
        if "..." in t:
            n = x.ndim - (len(t) - 3)
            if n < 0:
                raise ShapeError(f"einsum: subscripts {t!r} for a tensor with {x.ndim} dims")
            if ell is None or len(ell) < n:
                ell = (ell or "") + "".join(spare[len(ell or ""):n])
            t = t.replace("...", ell[len(ell) - n:] if n else "")
        if len(t) != x.ndim or not all(c.isalpha() for c in t):
            raise ShapeError(f"einsum: subscripts {t!r} do not fit a tensor with {x.ndim} dims")
        out_terms.append(t)
    if arrow:
        rhs = rhs.replace("...", ell or "")
    else:  # implicit output: the ellipsis dims, then the letters used once, in order
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        rhs = (ell or "") + "".join(sorted(c for c, k in counts.items()
                                           if k == 1 and c not in (ell or "")))
    return out_terms, rhs


def _diagonals(x: Tensor, t: str) -> tuple:
    """Repeated letters in one operand -> their diagonal (a strided view)."""
    while len(set(t)) < len(t):
        c = next(c for c in t if t.count(c) > 1)
        i, j = t.index(c), t.index(c, t.index(c) + 1)
        if x.shape[i] != x.shape[j]:
            raise ShapeError(f"einsum: letter {c!r} has sizes {x.shape[i]} and {x.shape[j]}")
        x = diagonal(x, 0, i, j)  # the diagonal goes last
        t = "".join(ch for k, ch in enumerate(t) if k not in (i, j)) + c
    return x, t


def _sum_out(x: Tensor, t: str, keep: set) -> tuple:
    drop = [k for k, c in enumerate(t) if c not in keep]
    if drop:
        x = _sum(x, tuple(drop))
        t = "".join(c for k, c in enumerate(t) if k not in drop)
    return x, t


def _contract(a: Tensor, ta: str, b: Tensor, tb: str, keep: set) -> tuple:
    """a (letters ta) times b (tb), summing the shared letters not in ``keep``."""
    sizes = {}
    for x, t in ((a, ta), (b, tb)):
        for c, s in zip(t, x.shape):
            if sizes.setdefault(c, s) != s and 1 not in (s, sizes[c]):
                raise ShapeError(f"einsum: letter {c!r} has sizes {sizes[c]} and {s}")
            sizes[c] = max(sizes[c], s)
    batch = [c for c in ta if c in tb and c in keep]
    summed = [c for c in ta if c in tb and c not in keep]
    left = [c for c in ta if c not in tb]
    right = [c for c in tb if c not in ta]
    a = permute(a, [ta.index(c) for c in batch + left + summed])
    b = permute(b, [tb.index(c) for c in batch + summed + right])
    a = a.expand(tuple(sizes[c] for c in batch) + a.shape[len(batch):])
    b = b.expand(tuple(sizes[c] for c in batch) + b.shape[len(batch):])
    nb = tuple(sizes[c] for c in batch)
    L, K, R = (math.prod(sizes[c] for c in g) for g in (left, summed, right))
    out = matmul(reshape(a, nb + (L, K)), reshape(b, nb + (K, R)))
    out = reshape(out, nb + tuple(sizes[c] for c in left) + tuple(sizes[c] for c in right))
    return out, "".join(batch + left + right)


def einsum(equation: str, *operands) -> Tensor:
    """torch.einsum(equation, *tensors) (or a list of tensors)."""
    ops = list(operands[0]) if len(operands) == 1 and isinstance(operands[0], (list, tuple)) \
        else list(operands)
    if not ops:
        raise ShapeError("einsum needs at least one tensor")
    terms, out = _parse(equation, ops)
    if len(set(out)) != len(out):
        raise ShapeError(f"einsum: output subscripts {out!r} repeat a letter")
    xs = []
    for x, t in zip(ops, terms):
        x, t = _diagonals(x, t)
        xs.append((x, t))
    for k, (x, t) in enumerate(xs):  # letters no other operand or the output uses
        others = set(out).union(*(set(u) for j, (_, u) in enumerate(xs) if j != k))
        xs[k] = _sum_out(x, t, others)
    x, t = xs[0]
    for k in range(1, len(xs)):
        y, u = xs[k]
        keep = set(out).union(*(set(v) for _, v in xs[k + 1:]))
        x, t = _contract(x, t, y, u, keep)
    x, t = _sum_out(x, t, set(out))
    missing = set(out) - set(t)
    if missing:
        raise ShapeError(f"einsum: output letters {sorted(missing)} appear in no operand")
    return permute(x, [t.index(c) for c in out]) if t != out else x


__all__ = ["einsum"]
