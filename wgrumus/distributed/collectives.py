"""Collective strategies (Ring: bandwidth-optimal, Tree(arity): latency-optimal, Centralized,
Native: the backend's own, Auto: by size; CollectiveConfig follows pmetal, a Rust framework) and
their algorithms over the transport's ``isend``/``recv``, for threads and MPI alike. Each element
is combined once, in a fixed order, by one rank, so all ranks agree bit for bit; sent arrays are
never modified (thread transports pass them by reference)."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar

import numpy as np

from .errors import CollectiveError
from .host_reduce import UFUNCS
from .transport import owned_copy, split_bounds


@dataclass(frozen=True)
class _Strategy:
    kind: str
    arity: int = 0

    def __repr__(self):
        name = type(self).__name__
        return f"{name}.Tree({self.arity})" if self.kind == "tree" else \
            f"{name}.{self.kind.capitalize()}"

    @classmethod
    def Tree(cls, arity: int = 2):
        if not isinstance(arity, (int, np.integer)) or arity < 2:
            raise ValueError(f"tree arity must be an int >= 2, got {arity!r}")
        return cls("tree", int(arity))

    @classmethod
    def parse(cls, s):
        """A strategy, or a name: 'ring', 'tree:4', 'centralized', 'direct', 'native', 'auto'."""
        if isinstance(s, cls):
            return s
        if isinstance(s, str):
            name, _, arity = s.lower().partition(":")
            if name == "tree":
                return cls.Tree(int(arity) if arity else 2)
            if name in cls._kinds:
                return getattr(cls, name.capitalize())
        raise ValueError(f"unknown {cls.__name__} {s!r}; use one of "
                         f"{', '.join(cls._kinds + ('tree[:arity]',))}")


class AllReduceStrategy(_Strategy):
    """How an all-reduce moves data: Ring, Tree(arity), Centralized, Native or Auto."""
    _kinds: ClassVar = ("ring", "centralized", "native", "auto")
    Ring: ClassVar[AllReduceStrategy]
    Centralized: ClassVar[AllReduceStrategy]
    Native: ClassVar[AllReduceStrategy]
    Auto: ClassVar[AllReduceStrategy]


class ReduceStrategy(_Strategy):
    """How a reduce to one root moves data: Tree(arity), Direct, Native or Auto."""
    _kinds: ClassVar = ("direct", "native", "auto")
    Direct: ClassVar[ReduceStrategy]
    Native: ClassVar[ReduceStrategy]
    Auto: ClassVar[ReduceStrategy]


class BroadcastStrategy(_Strategy):
    """How a broadcast from one root moves data: Tree(arity), Direct, Native or Auto."""
    _kinds: ClassVar = ("direct", "native", "auto")
    Direct: ClassVar[BroadcastStrategy]
    Native: ClassVar[BroadcastStrategy]
    Auto: ClassVar[BroadcastStrategy]


for _cls in (AllReduceStrategy, ReduceStrategy, BroadcastStrategy):
    for _k in _cls._kinds:
        setattr(_cls, _k.capitalize(), _cls(_k))


@dataclass
class CollectiveConfig:
    """Which algorithm each collective uses; ``num_nodes`` set means a hierarchical all-reduce
    (inside each node of ``num_devices`` ranks, then among node leaders with the global ones)."""
    num_devices: int = 1
    local_all_reduce: AllReduceStrategy = AllReduceStrategy.Auto
    local_reduce: ReduceStrategy = ReduceStrategy.Auto
    local_broadcast: BroadcastStrategy = BroadcastStrategy.Auto
    num_nodes: int | None = None
    global_all_reduce: AllReduceStrategy | None = None
    global_reduce: ReduceStrategy | None = None
    global_broadcast: BroadcastStrategy | None = None
    tree_threshold_bytes: int = 1 << 20
    tree_arity: int = 2
    timeout: float = 60.0

    def __post_init__(self):
        for name, cls in (("all_reduce", AllReduceStrategy), ("reduce", ReduceStrategy),
                          ("broadcast", BroadcastStrategy)):
            setattr(self, "local_" + name, cls.parse(getattr(self, "local_" + name)))
            if (g := getattr(self, "global_" + name)) is not None:
                setattr(self, "global_" + name, cls.parse(g))

    @classmethod
    def single_node(cls, num_devices: int, **kw) -> CollectiveConfig:
        return cls(num_devices=num_devices, local_all_reduce=AllReduceStrategy.Ring, **kw)

    @classmethod
    def multi_node(cls, num_devices: int, num_nodes: int, **kw) -> CollectiveConfig:
        return cls(num_devices=num_devices, num_nodes=num_nodes,
                   local_all_reduce=AllReduceStrategy.Tree(2),
                   global_all_reduce=AllReduceStrategy.Ring,
                   global_reduce=ReduceStrategy.Tree(2),
                   global_broadcast=BroadcastStrategy.Tree(2), **kw)

    def with_(self, **changes) -> CollectiveConfig:
        return replace(self, **changes)

    def validate(self) -> CollectiveConfig:
        """Raise ValueError naming the first inconsistent setting; return self when valid."""
        if not isinstance(self.num_devices, int) or self.num_devices <= 0:
            raise ValueError(f"num_devices must be > 0, got {self.num_devices!r}")
        if self.num_nodes is not None:
            if not isinstance(self.num_nodes, int) or self.num_nodes <= 0:
                raise ValueError(f"num_nodes must be > 0, got {self.num_nodes!r}")
            if None in (self.global_all_reduce, self.global_reduce, self.global_broadcast):
                raise ValueError("multi-node needs all global strategies set "
                                 "(global_all_reduce, global_reduce, global_broadcast); "
                                 "CollectiveConfig.multi_node(...) sets them")
        if not isinstance(self.tree_arity, int) or self.tree_arity < 2:
            raise ValueError(f"tree_arity must be >= 2, got {self.tree_arity!r}")
        if self.tree_threshold_bytes < 0:
            raise ValueError(f"tree_threshold_bytes must be >= 0, got {self.tree_threshold_bytes}")
        if not self.timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {self.timeout}")
        return self

    def select_all_reduce(self, nbytes: int, world_size: int,
                          strategy=None) -> AllReduceStrategy:
        """Auto: Tree below ``tree_threshold_bytes`` or under 4 ranks, else Ring."""
        s = self.local_all_reduce if strategy is None else AllReduceStrategy.parse(strategy)
        if s.kind != "auto":
            return s
        if nbytes < self.tree_threshold_bytes or world_size < 4:
            return AllReduceStrategy.Tree(self.tree_arity)
        return AllReduceStrategy.Ring

    def select_reduce(self, nbytes: int, world_size: int, strategy=None) -> ReduceStrategy:
        return self._rooted(ReduceStrategy, self.local_reduce, world_size, strategy)

    def select_broadcast(self, nbytes: int, world_size: int,
                         strategy=None) -> BroadcastStrategy:
        return self._rooted(BroadcastStrategy, self.local_broadcast, world_size, strategy)

    def _rooted(self, cls, default, world_size: int, strategy):
        """Auto: Direct for up to 2 ranks, else Tree(tree_arity); never by size, which ranks
        other than the root may not know."""
        s = default if strategy is None else cls.parse(strategy)
        if s.kind != "auto":
            return s
        return cls.Direct if world_size <= 2 else cls.Tree(self.tree_arity)


@dataclass(frozen=True)
class TreeRole:
    """Role of a rank in a k-ary tree rooted at 0: 'root', 'internal' or 'leaf'."""
    kind: str
    num_children: int = 0


def compute_role(rank: int, world_size: int, arity: int) -> TreeRole:
    n = len(child_ranks(rank, world_size, arity))
    if rank == 0:
        return TreeRole("root", n)
    return TreeRole("internal", n) if n else TreeRole("leaf", 0)


def parent_rank(rank: int, arity: int) -> int | None:
    return None if rank == 0 else (rank - 1) // arity


def child_ranks(rank: int, world_size: int, arity: int) -> list[int]:
    first = rank * arity + 1
    return [c for c in range(first, first + arity) if c < world_size]


def tree_depth(world_size: int, arity: int) -> int:
    """Number of edges from the root to the deepest leaf."""
    d, r = 0, world_size - 1
    while r > 0:
        r, d = (r - 1) // arity, d + 1
    return d


def _combine(a, b, op, into=None):
    """op(a, b) into ``into`` (private) or a fresh array, never into a received (shared) one."""
    return UFUNCS[op](a, b, out=into)


def _finish_mean(acc, op, n):
    if op == "mean" and n != 1:
        np.divide(acc, n, out=acc)
    return acc


def _fresh(x: np.ndarray) -> np.ndarray:
    return np.array(x, copy=True, order="C")


def _exchange(t, dst, arr, src, tag, deadline, dtype, shape, owned):
    req = t.isend(dst, tag, arr, deadline, owned)
    got = t.recv(src, tag, deadline, dtype, shape)
    t.wait_all([req], deadline)
    return got


def _ring_reduce_scatter_parts(t, parts, op, tag, deadline):
    """Ring reduce-scatter: rank r ends with part r reduced, summed along ranks r+1, r+2, ..., r
    (step s sends part r-s-1 and adds its own piece to the received part r-s-2)."""
    n, r = t.size, t.rank
    if n == 1:
        return _finish_mean(_fresh(parts[0]), op, 1)
    right, left = (r + 1) % n, (r - 1) % n
    send, owned = parts[(r - 1) % n], False
    for s in range(n - 1):
        i = (r - s - 2) % n
        mine = parts[i]
        got = _exchange(t, right, send, left, tag, deadline, mine.dtype, mine.shape, owned)
        send, owned = _combine(got, mine, op), True
    return _finish_mean(send, op, n)


def _ring_all_gather_parts(t, own, tag, deadline, shape_of, owned=False):
    """Ring all-gather: all ranks' parts; ``shape_of(i)``: rank i's part's shape (-1: any rows);
    ``owned``: ``own`` is private to this call (sent without a copy)."""
    n, r = t.size, t.rank
    parts = [None] * n
    parts[r] = send = own
    for s in range(n - 1):
        i = (r - s - 1) % n
        parts[i] = send = _exchange(t, (r + 1) % n, send, (r - 1) % n, tag, deadline,
                                    own.dtype, shape_of(i), owned)
        owned = True
    return parts


def ring_all_reduce(t, x: np.ndarray, op: str, tag: int, deadline: float) -> np.ndarray:
    """Reduce-scatter then all-gather over n near-equal chunks of the flattened array."""
    flat = np.ascontiguousarray(x).reshape(-1)
    n = t.size
    b = split_bounds(flat.size, n)
    chunks = [flat[b[i]:b[i + 1]] for i in range(n)]
    mine = _ring_reduce_scatter_parts(t, chunks, op, tag, deadline)
    # Chunk sizes are known on every rank: receive with exact shapes.
    parts = _ring_all_gather_parts(t, mine, tag, deadline, lambda i: (b[i + 1] - b[i],), True)
    return np.concatenate(parts).reshape(x.shape)


def ring_reduce_scatter(t, x: np.ndarray, op: str, tag: int, deadline: float) -> np.ndarray:
    """Split dim 0 into world_size parts (array_split rule) and return this rank's reduced part."""
    x = np.ascontiguousarray(x)
    b = split_bounds(x.shape[0], t.size)
    return _ring_reduce_scatter_parts(t, [x[b[i]:b[i + 1]] for i in range(t.size)], op, tag,
                                      deadline)


def ring_all_gather(t, x: np.ndarray, tag: int, deadline: float) -> np.ndarray:
    """Concatenate every rank's array along dim 0 (dim 0 may differ between ranks)."""
    x = np.ascontiguousarray(x)
    parts = _ring_all_gather_parts(t, x, tag, deadline, lambda i: (-1,) + x.shape[1:])
    return np.concatenate(parts, axis=0)


def _virtual(t, root):
    n = t.size
    v = (t.rank - root) % n
    return n, v, (lambda u: (u + root) % n)


def tree_reduce(t, x, op, root, arity, tag, deadline):
    """k-ary tree reduce to ``root`` (own value, then children's in order); None off the root."""
    n, v, real = _virtual(t, root)
    flat = np.ascontiguousarray(x).reshape(-1)
    acc = flat
    for c in child_ranks(v, n, arity):
        got = t.recv(real(c), tag, deadline, flat.dtype, flat.shape)
        acc = _combine(acc, got, op, None if acc is flat else acc)
    if v != 0:
        t.wait_all([t.isend(real(parent_rank(v, arity)), tag, acc, deadline, acc is not flat)],
                   deadline)
        return None
    acc = _fresh(acc) if acc is flat else acc
    return _finish_mean(acc, op, n).reshape(x.shape)


def direct_reduce(t, x, op, root, tag, deadline):
    """Everyone sends to ``root``, which combines in rank order. Root returns the result."""
    flat = np.ascontiguousarray(x).reshape(-1)
    if t.rank != root:
        t.wait_all([t.isend(root, tag, flat, deadline)], deadline)
        return None
    acc = None
    for r in range(t.size):
        piece = flat if r == root else t.recv(r, tag, deadline, flat.dtype, flat.shape)
        acc = _fresh(piece) if acc is None else _combine(acc, piece, op, acc)
    return _finish_mean(acc, op, t.size).reshape(x.shape)


def tree_broadcast(t, x, root, arity, tag, deadline, like=None, fresh=False):
    """k-ary tree broadcast from ``root`` (a private array on every rank); ``like``: (dtype,
    shape) when every rank knows them; ``fresh``: root's ``x`` is private to this call."""
    n, v, real = _virtual(t, root)
    if v == 0:
        data = x if fresh else _fresh(x)
    elif like is not None:
        data = t.recv(real(parent_rank(v, arity)), tag, deadline, like[0], like[1])
    else:
        data = t.recv_array(real(parent_rank(v, arity)), tag, deadline)
    reqs = []
    for c in child_ranks(v, n, arity):
        if like is not None:
            reqs.append(t.isend(real(c), tag, data, deadline, True))
        else:
            reqs.extend(t.send_array(real(c), tag, data, deadline, True))
    t.wait_all(reqs, deadline)
    return owned_copy(data)


def direct_broadcast(t, x, root, tag, deadline, like=None, fresh=False):
    """Root sends to every rank directly."""
    return tree_broadcast(t, x, root, max(t.size - 1, 2), tag, deadline, like, fresh)


def tree_all_reduce(t, x, op, arity, tag, deadline):
    """k-ary tree reduce to rank 0, then tree broadcast of rank 0's result."""
    res = tree_reduce(t, x, op, 0, arity, tag, deadline)
    return tree_broadcast(t, res, 0, arity, tag, deadline, (x.dtype, x.shape), fresh=True)


def centralized_all_reduce(t, x, op, tag, deadline):
    """Rank 0 receives from everyone, combines in rank order, sends the result to everyone."""
    res = direct_reduce(t, x, op, 0, tag, deadline)
    return direct_broadcast(t, res, 0, tag, deadline, (x.dtype, x.shape), fresh=True)


def all_reduce(t, x, op, strategy: AllReduceStrategy, tag, deadline):
    """Dispatch an all-reduce to the algorithm of ``strategy`` (Auto must be resolved first)."""
    k = strategy.kind
    if k == "ring":
        return ring_all_reduce(t, x, op, tag, deadline)
    if k == "tree":
        return tree_all_reduce(t, x, op, strategy.arity, tag, deadline)
    if k == "centralized":
        return centralized_all_reduce(t, x, op, tag, deadline)
    if k == "native":
        return t.native_all_reduce(np.ascontiguousarray(x), op, deadline)
    raise CollectiveError(f"strategy {strategy!r} must be resolved before running")


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in GB/s: payload bytes over wall time (the NCCL-tests definition)."""
    return nbytes / seconds / 1e9 if seconds > 0 else math.inf
