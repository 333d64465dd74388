"""FSDP: fully sharded data parallel over a data-parallel ProcessGroup.

Every parameter of the wrapped module is split along dim 0 into ``world`` equal shards (rows
padded with zeros up to a multiple of ``world``); this rank keeps only its shard, a leaf that the
optimizer updates (``FSDP.parameters()`` are the shards). Around each forward:

    all-gather shards -> the module's parameter storage  (gather node: shard -> full param)
    run the module                                        (ops save views of the full params)
    free the full parameters' device buffers
    backward: the output's node re-gathers them first (before any op that uses them),
              each param's gather node reduce-scatters its gradient (mean over ranks, like
              data parallel) into the shard's gradient and frees the full buffer again.

The module's Parameter objects stay in place; only their Storage's device buffer comes and
goes, so the views saved for backward see the re-gathered data. Buffers (e.g. BatchNorm
running statistics) are not parameters and stay whole on every rank.
"""
from __future__ import annotations

import numpy as np

from ..autograd.tape import is_grad_enabled, record
from ..tensor import Tensor, tensor

__all__ = ["FSDP"]


class _Flat:
    """One managed parameter: its shard (leaf) and the full parameter it is gathered into."""
    __slots__ = ("name", "param", "shard", "rows", "shape")

    def __init__(self, name, param, shard, rows, shape):
        self.name, self.param, self.shard, self.rows, self.shape = name, param, shard, rows, shape


class FSDP:
    """Wrap ``module`` (built identically on every rank of ``group``, e.g. from one seed) so
    that each rank stores 1/world of every parameter. Call it like the module."""

    def __init__(self, module, group, device=None):
        self.module = module
        self.group = group
        self.device = device if device is not None else group.device
        if self.device is None:
            raise ValueError("FSDP needs a device: pass device= or give the group one "
                             "(dist.spawn(..., devices=...))")
        self.world, self.rank = group.world_size, group.rank
        self._flats: list[_Flat] = []
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
            self._flats.append(_Flat(name, p, shard, n, shape))
            _free(p)

    # ------------------------------------------------------------------ parameters
    def parameters(self):
        """The shards: what the optimizer updates."""
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

    # ------------------------------------------------------------------ gather / free
    def _pad_rows(self, rows: np.ndarray, per: int) -> np.ndarray:
        """``rows`` zero-padded along dim 0 to ``per * world`` rows (equal shards)."""
        padded = np.zeros((per * self.world,) + rows.shape[1:], np.float32)
        padded[:len(rows)] = rows
        return padded

    def _full_array(self, f: _Flat) -> np.ndarray:
        """All-gather ``f``'s shards (a collective) into the dense parameter, padding dropped."""
        full = self.group.all_gather(f.shard.numpy())  # [per * world, ...] in rank order
        return np.ascontiguousarray(full[:f.rows]).reshape(f.shape)

    def _gather(self, f: _Flat) -> None:
        """All-gather ``f``'s shards into its full parameter's storage (a collective)."""
        full = self._full_array(f)
        st = f.param._storage
        if st.buffer is None:
            st.buffer = st.device.alloc(st.nbytes)
        st.device.write(st.buffer, full)

    def _reduce_scatter(self, f: _Flat, g: Tensor) -> Tensor:
        """Mean of the full gradient over the ranks, this rank's rows only."""
        rows = np.asarray(g.numpy(), np.float32).reshape((f.rows,) + f.shard.shape[1:])
        padded = self._pad_rows(rows, f.shard.shape[0])
        return tensor(self.group.reduce_scatter(padded, "mean"), device=self.device)

    def gather_all(self) -> None:
        for f in self._flats:
            self._gather(f)

    def free_all(self) -> None:
        for f in self._flats:
            _free(f.param)

    # ------------------------------------------------------------------ forward
    def __call__(self, *args, **kw):
        return self.forward(*args, **kw)

    def forward(self, *args, **kw):
        """The wrapped module's forward with every parameter gathered for this call only, so
        between calls a rank holds just its shards; backward re-gathers what the module's ops
        saved and reduce-scatters each gradient back to its shard."""
        grad = is_grad_enabled()
        for f in self._flats:
            self._gather(f)
            if grad:
                record("fsdp_all_gather", f.param, [f.shard], self._param_backward(f))
        try:
            out = self.module(*args, **kw)
        finally:
            self.free_all()
        if not grad:
            return out
        if isinstance(out, Tensor):
            return self._regather_on_backward(out)
        if isinstance(out, (tuple, list)):
            return type(out)(self._regather_on_backward(o) if isinstance(o, Tensor) else o
                             for o in out)
        return out

    def _param_backward(self, f: _Flat):
        def bw(g):
            gs = self._reduce_scatter(f, g)
            _free(f.param)  # its last user in this backward has run
            return (gs,)
        return bw

    def _regather_on_backward(self, out: Tensor) -> Tensor:
        """Alias of ``out`` whose backward (the first of this module's to run) re-gathers
        every parameter the module's ops saved."""
        if not out.requires_grad:
            return out
        alias = Tensor(out._storage, out.shape, out.strides, out.offset, out.dtype)

        def bw(g):
            for f in self._flats:
                if f.param._storage.buffer is None:
                    self._gather(f)
            return (g,)
        record("fsdp_regather", alias, [out], bw)
        return alias

    # ------------------------------------------------------------------ checkpoints
    def full_state_dict(self) -> dict:
        """Dense parameters (gathered; every rank must call it) plus the module's buffers,
        as numpy arrays: loadable into the unwrapped module on one device."""
        out = {}
        for f in self._flats:
            out[f.name] = self._full_array(f)
        if hasattr(self.module, "state_dict"):
            for k, v in self.module.state_dict().items():
                if k not in out:
                    out[k] = v.numpy() if hasattr(v, "numpy") else np.asarray(v)
        return out

    def shard_bytes(self) -> int:
        return sum(f.shard.numel() * 4 for f in self._flats)


def _free(p: Tensor) -> None:
    """Give the parameter's device buffer back to the pool (the Storage object stays, so views
    of it see the buffer a later gather puts back)."""
    st = p._storage
    if st.buffer is not None:
        st.device.pool.release(st.buffer)
        st.buffer = None
