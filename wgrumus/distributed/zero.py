"""ZeRO stage 1 for DataParallel: each replica's optimizer keeps state for the parameters it owns
only, and the owners' updated parameters then reach the other replicas."""
from __future__ import annotations

from ..autograd import GradientStore, no_grad
from ..ops.elementwise import copy_into
from ..tensor import Tensor
from .averaging import flat_view


class OptimizerSharding:
    """ZeRO stage 1 (DeepSpeed; PyTorch's ZeroRedundancyOptimizer): every parameter has one
    owner replica, the owners' parameter counts balanced greedily (largest first). After the
    gradient all-reduce each replica steps only the parameters it owns, so its optimizer creates
    state (Adam's moments) for about 1/N of the model; then every owner's updated parameters
    reach the other replicas (one packed buffer per owner), so all replicas stay identical."""

    def __init__(self, params, world: int):
        self.world = world
        self.owner = [0] * len(params)
        load = [0] * world
        for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
            r = min(range(world), key=lambda r: (load[r], r))
            self.owner[i] = r
            load[r] += params[i].numel()
        self.owned = [[i for i in range(len(params)) if self.owner[i] == r]
                      for r in range(world)]

    def owned_grads(self, rank: int, params, grads: GradientStore) -> GradientStore:
        """The part of ``grads`` this replica's optimizer steps."""
        out = GradientStore()
        for i in self.owned[rank]:
            g = grads.get(params[i])
            if g is not None:
                out.accumulate(params[i], g)
        return out

    def _pack(self, rank: int, params) -> Tensor:
        ps = [params[i] for i in self.owned[rank]]
        flat = Tensor.empty((sum(p.numel() for p in ps),), params[0].device)
        off = 0
        with no_grad():
            for p in ps:
                copy_into(flat_view(flat, p.shape, off), p)
                off += p.numel()
        return flat

    def _unpack(self, rank: int, params, flat: Tensor) -> None:
        off = 0
        with no_grad():
            for i in self.owned[rank]:
                copy_into(params[i], flat_view(flat, params[i].shape, off))
                off += params[i].numel()

    def gather_group(self, group, params) -> None:
        """Each owner broadcasts its packed parameters to this replica's group (every replica
        calls it with its own group and parameters)."""
        for r in range(self.world):
            if not self.owned[r]:
                continue
            if group.rank == r:
                group.broadcast(self._pack(r, params), root=r)
            else:
                n = sum(params[i].numel() for i in self.owned[r])
                like = Tensor.empty((n,), params[0].device)
                self._unpack(r, params, group.broadcast(like, root=r))
