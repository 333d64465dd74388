"""Gradient buckets as PyTorch DDP makes them: parameters in reverse order (as backward produces
their gradients), a small first bucket so communication starts early, then ``bucket_cap_mb``
each; plain data, identical on every replica, printable with ``describe()``."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

MB = 1 << 20


@dataclass(frozen=True)
class Bucket:
    """One flat all-reduce: ``params`` are parameter indices (into ``module.parameters()``), in
    the order their gradients sit in the flat buffer; ``offsets`` are element offsets there."""
    index: int
    params: tuple
    names: tuple
    shapes: tuple
    offsets: tuple
    numel: int
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        return self.numel * np.dtype(self.dtype).itemsize


@dataclass(frozen=True)
class BucketPlan:
    buckets: tuple
    first_bucket_bytes: int
    bucket_cap_bytes: int
    bucket_of: dict = field(default_factory=dict)  # parameter index -> bucket index

    def __len__(self):
        return len(self.buckets)

    def __iter__(self):
        return iter(self.buckets)

    def describe(self) -> str:
        rows = [f"{len(self.buckets)} bucket(s): first <= {self.first_bucket_bytes / MB:g} MB, "
                f"then <= {self.bucket_cap_bytes / MB:g} MB (reverse parameter order)"]
        for b in self.buckets:
            rows.append(f"  bucket {b.index}: {b.nbytes / MB:8.3f} MB  {len(b.params)} param(s): "
                        + ", ".join(b.names))
        return "\n".join(rows)


def plan_buckets(params, bucket_cap_mb: float = 25.0, first_bucket_mb: float = 1.0,
                 names=None) -> BucketPlan:
    """Bucket plan for ``params`` in ``module.parameters()`` order (frozen ones left out)."""
    if not bucket_cap_mb > 0 or not first_bucket_mb > 0:
        raise ValueError(f"bucket sizes must be > 0 MB, got bucket_cap_mb={bucket_cap_mb}, "
                         f"first_bucket_mb={first_bucket_mb}")
    params = list(params)
    names = list(names) if names is not None else [f"param{i}" for i in range(len(params))]
    if len(names) != len(params):
        raise ValueError(f"{len(names)} names for {len(params)} parameters; pass one name per "
                         f"parameter (or none)")
    first_cap = int(first_bucket_mb * MB)
    cap = int(bucket_cap_mb * MB)
    buckets, cur, cur_bytes, cur_dtype = [], [], 0, None

    def close():
        nonlocal cur, cur_bytes, cur_dtype
        if cur:
            offs = np.cumsum([0] + [math.prod(params[i].shape) for i in cur])
            buckets.append(Bucket(len(buckets), tuple(cur), tuple(names[i] for i in cur),
                                  tuple(tuple(params[i].shape) for i in cur),
                                  tuple(int(o) for o in offs[:-1]), int(offs[-1]),
                                  np.dtype(cur_dtype)))
        cur, cur_bytes, cur_dtype = [], 0, None

    for i in reversed(range(len(params))):
        p = params[i]
        if not getattr(p, "requires_grad", True):
            continue
        dt = np.dtype(p.dtype)
        nbytes = math.prod(p.shape) * dt.itemsize
        limit = first_cap if not buckets else cap
        if cur and (cur_dtype != dt or cur_bytes + nbytes > limit):
            close()
        cur.append(i)
        cur_bytes += nbytes
        cur_dtype = dt
    close()
    bucket_of = {i: b.index for b in buckets for i in b.params}
    return BucketPlan(tuple(buckets), first_cap, cap, bucket_of)
