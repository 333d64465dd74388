"""FSDP: each rank keeps a dim-0 shard of every parameter (zero-padded to equal shards), which its
optimizer updates. Parameters are gathered and freed by *units* (each outermost ``auto_wrap``
submodule, plus the root's rest) around the unit's forward and again in its backward, where each
gradient is reduce-scattered (mean) to its shard once final: a rank holds at most one unit's full
parameters while the next unit's gather runs ahead on the group's background thread. Only the
device buffers come and go, so views saved for backward see the re-gathered data."""
from __future__ import annotations

import functools

import numpy as np

from ..autograd.tape import is_grad_enabled, record
from ..tensor import Tensor, tensor


class _ShardedParam:
    """One managed parameter: its shard (leaf) and the full parameter it is gathered into."""
    __slots__ = ("name", "param", "shard", "rows", "shape")

    def __init__(self, name, param, shard, rows, shape):
        self.name, self.param, self.shard, self.rows, self.shape = name, param, shard, rows, shape


class _Unit:
    """Parameters gathered and freed together: one wrapped submodule, or the root's rest."""

    def __init__(self, fsdp, name: str, flats: list):
        self.fsdp, self.name, self.flats = fsdp, name, flats
        self._pending = None  # a prefetched gather: future of the full arrays

    def gathered(self) -> bool:
        return all(f.param.buffer is not None for f in self.flats)

    def prefetch(self) -> None:
        """Start this unit's all-gather on the communication thread (if not already there)."""
        if self._pending is None and self.flats and not self.gathered():
            self._pending = self.fsdp._submit_gather(self.flats)

    def gather(self) -> None:
        """The full parameters in place: from the prefetch, else gathered now."""
        if self._pending is None:
            if self.gathered():
                return
            self.prefetch()
        else:
            self.fsdp.prefetch_hits += 1
        arrays = self.fsdp._wait(self._pending)
        self._pending = None
        for f, full in zip(self.flats, arrays):
            st = f.param.storage
            if st.buffer is None:
                st.buffer = st.device.alloc(st.nbytes)
            st.device.write(st.buffer, full)

    def drop_prefetch(self) -> None:
        """Wait out a prefetch nobody used (its collective must still complete everywhere)."""
        if self._pending is not None:
            self.fsdp._wait(self._pending)
            self._pending = None

    def free(self) -> None:
        for f in self.flats:
            _free(f.param)

    def run(self, fn, *args, **kw):
        """``fn(*args, **kw)`` with this unit's parameters gathered for the call only."""
        fs = self.fsdp
        fs._entered(self)
        grad = is_grad_enabled()
        self.gather()
        if grad:
            for f in self.flats:
                record("fsdp_all_gather", f.param, [f.shard], fs._param_backward(f))
        nxt = fs._neighbour(self, +1)
        if nxt is not None:
            nxt.prefetch()
        try:
            out = fn(*args, **kw)
        finally:
            self.free()
        if not grad:
            return out
        if isinstance(out, Tensor):
            return self._regather_on_backward(out)
        if isinstance(out, (tuple, list)):
            return type(out)(self._regather_on_backward(o) if isinstance(o, Tensor) else o
                             for o in out)
        return out

    def _regather_on_backward(self, out: Tensor) -> Tensor:
        """Alias of ``out`` whose backward re-gathers the unit and prefetches the next one."""
        if not out.requires_grad or not self.flats:
            return out
        alias = Tensor(out.storage, out.shape, out.strides, out.offset, out.dtype)

        def bw(g):
            self.gather()
            prev = self.fsdp._neighbour(self, -1)
            if prev is not None:
                prev.prefetch()
            return (g,)
        record("fsdp_regather", alias, [out], bw)
        return alias


def _wrap_targets(module, auto_wrap) -> list:
    """(name, submodule) of the outermost submodules ``auto_wrap`` selects (not the root)."""
    if auto_wrap is None:
        return []
    pick = auto_wrap if callable(auto_wrap) and not isinstance(auto_wrap, (type, tuple)) \
        else (lambda m: isinstance(m, auto_wrap))
    out = []

    def walk(prefix, m):
        for name, child in m.named_children():
            full = f"{prefix}.{name}" if prefix else name
            if pick(child):
                out.append((full, child))
            else:
                walk(full, child)
    walk("", module)
    return out


class FSDP:
    """``module`` (built identically on every rank) with 1/world of every parameter per rank;
    ``auto_wrap`` (a class, tuple of them or predicate) picks the submodules gathered on their
    own, e.g. ``TransformerBlock``."""

    def __init__(self, module, group, device=None, auto_wrap=None):
        self.module = module
        self.group = group
        self.device = device if device is not None else group.device
        if self.device is None:
            raise ValueError("FSDP needs a device: pass device= or give the group one "
                             "(dist.spawn(..., devices=...))")
        self.world, self.rank = group.world_size, group.rank
        self._flats: list[_ShardedParam] = []
        by_param = {}
        for name, p in module.named_parameters():
            full = np.asarray(p.numpy(), np.float32)
            shape = full.shape
            rows = full.reshape(shape[0] if full.ndim else 1, -1)
            n = rows.shape[0]
            per = -(-n // self.world)
            padded = self._pad_rows(rows, per)
            mine = padded[self.rank * per:(self.rank + 1) * per].reshape(
                (per,) + (shape[1:] if full.ndim else ()))
            shard = tensor(mine, device=self.device, requires_grad=True)
            if p.device is not self.device:
                raise ValueError(f"FSDP: parameter {name} is on {p.device}, the rank's device is "
                                 f"{self.device}; build the module on the rank's device")
            f = _ShardedParam(name, p, shard, n, shape)
            self._flats.append(f)
            by_param[id(p)] = f
            _free(p)
        self.units: list[_Unit] = []
        taken = set()
        for name, sub in _wrap_targets(module, auto_wrap):
            flats = [by_param[id(p)] for p in sub.parameters() if id(p) not in taken]
            taken.update(id(f.param) for f in flats)
            unit = _Unit(self, name, flats)
            self.units.append(unit)
            sub.forward = functools.partial(unit.run, sub.forward)
        self._root = _Unit(self, "", [f for f in self._flats if id(f.param) not in taken])
        self.units.insert(0, self._root)
        self.prefetch_hits = 0  # gathers that a prefetch had already started
        self._order: list = []  # units in the order the last forward entered them
        self._seen: list = []

    def parameters(self):  # the shards: what the optimizer updates
        return [f.shard for f in self._flats]

    def named_parameters(self):
        return [(f.name, f.shard) for f in self._flats]

    def zero_grad(self):
        for f in self._flats:
            f.shard.grad = None

    def train(self, mode: bool = True):
        if hasattr(self.module, "train"):
            self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def _pad_rows(self, rows: np.ndarray, per: int) -> np.ndarray:
        """``rows`` zero-padded along dim 0 to ``per * world`` rows (equal shards)."""
        padded = np.zeros((per * self.world,) + rows.shape[1:], np.float32)
        padded[:len(rows)] = rows
        return padded

    def _wait(self, work):
        return work.wait(self.group.timeout * 2)

    def _submit_gather(self, flats) -> object:
        """All-gather ``flats``' shards into dense arrays on the group's background thread."""
        local = [f.shard.numpy() for f in flats]

        def go():  # each gather: [per * world, ...] in rank order; the padding is dropped
            return [np.ascontiguousarray(self.group.all_gather(arr)[:f.rows]).reshape(f.shape)
                    for f, arr in zip(flats, local)]
        return self.group.run_async(go)

    def _reduce_scatter(self, f: _ShardedParam, g: Tensor) -> Tensor:
        """Mean of the full gradient over the ranks, this rank's rows only."""
        rows = np.asarray(g.numpy(), np.float32).reshape((f.rows,) + f.shard.shape[1:])
        padded = self._pad_rows(rows, f.shard.shape[0])
        out = self._wait(self.group.run_async(lambda: self.group.reduce_scatter(padded, "mean")))
        return tensor(out, device=self.device)

    def _entered(self, unit: _Unit) -> None:
        if unit not in self._seen:
            self._seen.append(unit)

    def _neighbour(self, unit: _Unit, step: int):
        """The unit after (+1) or before (-1) ``unit`` in the last forward's order."""
        order = self._order
        if unit not in order:
            return None
        i = order.index(unit) + step
        return order[i] if 0 <= i < len(order) else None

    def __call__(self, *args, **kw):
        return self.forward(*args, **kw)

    def forward(self, *args, **kw):
        for u in self.units:  # a prefetch of the last step that no backward consumed
            u.drop_prefetch()
        self._seen = []
        try:
            return self._root.run(self.module, *args, **kw)
        finally:
            self._order = list(self._seen)

    def _param_backward(self, f: _ShardedParam):
        def bw(g):
            gs = self._reduce_scatter(f, g)
            _free(f.param)  # its last user in this backward has run
            return (gs,)
        return bw

    def full_state_dict(self) -> dict:
        """Dense parameters and buffers as numpy arrays (every rank calls it)."""
        out = {f.name: self._wait(self._submit_gather([f]))[0] for f in self._flats}
        if hasattr(self.module, "state_dict"):
            for k, v in self.module.state_dict().items():
                if k not in out:
                    out[k] = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        return out

    def close(self) -> None:  # nothing to stop: the collectives run on the group's thread
        pass


def _free(p: Tensor) -> None:
    """Give the parameter's device buffer back (its Storage stays for a later gather)."""
    st = p.storage
    if st.buffer is not None:
        st.device.pool.release(st.buffer)
        st.buffer = None
