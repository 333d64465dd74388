"""GradientStore: gradients keyed by GradId."""
from __future__ import annotations

import weakref

from ..runtime.errors import ShapeError


def grads_of(params, grads=None) -> list:
    """(param, gradient) of ``params`` having one (``p.grad``, or from GradientStore ``grads``)."""
    pairs = [(p, p.grad if grads is None else grads.get(p)) for p in params]
    return [(p, g) for p, g in pairs if g is not None]


def set_grad(p, g, grads=None) -> None:
    """Replace ``p``'s gradient (``p.grad``, or its entry in GradientStore ``grads``) by ``g``."""
    if grads is None:
        p.grad = g
    else:
        grads.remove(p)
        grads.accumulate(p, g)


def _key(x) -> int:
    if isinstance(x, int):
        return x
    gid = getattr(x, "grad_id", None)
    if gid is None:
        raise TypeError(f"GradientStore keys are GradIds or tensors, got {type(x).__name__}")
    return gid


class GradientStore:
    def __init__(self):
        self._grads: dict = {}
        self._leaves: dict = {}  # grad_id -> weakref of the leaf tensor, for .backward() sugar

    def get(self, x, default=None):
        return self._grads.get(_key(x), default)

    def __getitem__(self, x):
        k = _key(x)
        if k not in self._grads:
            raise KeyError(f"no gradient for GradId {k}")
        return self._grads[k]

    def remove(self, x):
        k = _key(x)
        self._leaves.pop(k, None)
        return self._grads.pop(k, None)

    def accumulate(self, x, g, leaf=None) -> None:
        k = _key(x)
        if leaf is None and not isinstance(x, int):
            leaf = x
        if leaf is not None:
            if tuple(leaf.shape) != tuple(g.shape):
                raise ShapeError(f"gradient of shape {tuple(g.shape)} for a tensor of shape "
                                 f"{tuple(leaf.shape)} (GradId {k})")
            self._leaves.setdefault(k, weakref.ref(leaf))
        cur = self._grads.get(k)
        if cur is None:
            self._grads[k] = g
        else:
            if tuple(cur.shape) != tuple(g.shape):
                raise ShapeError(f"cannot accumulate a gradient of shape {tuple(g.shape)} into "
                                 f"one of shape {tuple(cur.shape)} (GradId {k})")
            from ..autograd.tape import no_grad
            with no_grad():
                self._grads[k] = cur + g

    def merge_from(self, other: GradientStore) -> None:
        """Add every gradient of ``other``; a shape mismatch raises (the original dropped it)."""
        for k, g in other._grads.items():
            leaf = other._leaves.get(k)
            self.accumulate(k, g, leaf() if leaf is not None else None)

    def leaf(self, x):
        r = self._leaves.get(_key(x))
        return r() if r is not None else None

    def items(self):
        return self._grads.items()

    def keys(self):
        return self._grads.keys()

    def __len__(self):
        return len(self._grads)

    def __contains__(self, x):
        try:
            return _key(x) in self._grads
        except TypeError:
            return False

    def __iter__(self):
        return iter(self._grads)

    def __repr__(self):
        return f"GradientStore({len(self)} gradients)"


def store_of(pairs, into: GradientStore | None = None) -> GradientStore:
    """``into`` (default: a new store) plus the (parameter, gradient) pairs that have a gradient
    (``grads_of``'s, or any others)."""
    out = GradientStore() if into is None else into
    for p, g in pairs:
        if g is not None:
            out.accumulate(p, g)
    return out
