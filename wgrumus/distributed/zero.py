"""ZeRO stage 1 for DataParallel: each replica's optimizer keeps state for the parameters it owns
only, and the owners' updated parameters then reach the other replicas."""
from __future__ import annotations

import numpy as np

from ..autograd import GradientStore, no_grad
from ..autograd.store import grads_of, store_of
from ..ops.elementwise import copy_into
from ..tensor import Tensor
from .averaging import flat_view


class OptimizerSharding:
    """ZeRO stage 1 (DeepSpeed; PyTorch's ZeroRedundancyOptimizer): each parameter has one owner
    (counts balanced greedily), whose optimizer alone steps it and keeps its state; the owners
    then broadcast their updated parameters, one packed buffer each."""

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
        return store_of(grads_of([params[i] for i in self.owned[rank]], grads))

    def _packed(self, r: int, params, flat: Tensor) -> list:
        """Owner ``r``'s parameters with their views of the flat buffer ``flat``."""
        ps = [params[i] for i in self.owned[r]]
        offs = np.cumsum([0] + [p.numel() for p in ps])
        return [(p, flat_view(flat, p.shape, int(o))) for p, o in zip(ps, offs)]

    def gather_group(self, group, params) -> None:
        """Each owner broadcasts its packed parameters (every replica calls it on its group)."""
        for r in range(self.world):
            if not self.owned[r]:
                continue
            flat = Tensor.empty((sum(params[i].numel() for i in self.owned[r]),),
                                params[0].device)
            with no_grad():
                if group.rank == r:
                    for p, v in self._packed(r, params, flat):
                        copy_into(v, p)
                    group.broadcast(flat, root=r)
                else:
                    for p, v in self._packed(r, params, group.broadcast(flat, root=r)):
                        copy_into(p, v)
