"""What one rank of `wgrumus train` computes, for the training engine (distributed/engine.py):
``gradients(micro_batch, seed, on_leaf_grad) -> (loss or None, gradients)``. A whole replica
(mlp / cnn without --pp), a pipeline stage of one (mlp / cnn with --pp), or a gpt rank of any
dp x tp x pp layout (parallel3d.RankTrainer)."""
from __future__ import annotations

from ..autograd import backward_with_grad
from ..distributed.parallel3d import chunks_per_stage
from ..distributed.pipeline import add_send_recv, get_schedule, split_sequential
from ..distributed.pipeline.actions import RECV_F, SEND_F
from ..distributed.pipeline.interpreter import StageRunner
from ..ops.creation import full
from ..tensor import Tensor


def _seed_for(loss, seed):
    """The backward's seed: ``seed`` (float or 0-d device tensor) in the loss's shape."""
    if isinstance(seed, Tensor):
        return seed.reshape(loss.shape) if seed.shape != loss.shape else seed
    return full(loss.shape, float(seed), device=loss.device)


def _mean(values):
    total = values[0]
    for v in values[1:]:
        total = total + v
    return total * (1.0 / len(values)) if len(values) > 1 else total


class ReplicaPart:
    """A whole model on this rank; gradients reach the averager as backward makes them."""
    overlaps = True

    def __init__(self, model, loss_fn):
        self.model, self.loss_fn = model, loss_fn
        named = list(model.named_parameters())
        self.names = [n for n, _ in named]
        self.params = [p for _, p in named]

    def gradients(self, mb, seed, on_leaf_grad):
        x, y = mb
        loss = self.loss_fn(self.model(x), y)
        grads = backward_with_grad(loss, _seed_for(loss, seed), on_leaf_grad=on_leaf_grad)
        return loss.detach(), grads


class StagePart:
    """Pipeline stage ``pp_rank`` of a Sequential model (its chunks, for the interleaved
    schedule), following the stage's action list through the one schedule interpreter."""
    overlaps = False

    def __init__(self, model, loss_fn, pgm, schedule: str, micro_batches: int, device):
        self.loss_fn, self.pgm, self.m, self.device = loss_fn, pgm, micro_batches, device
        pp, s = pgm.config.pp, pgm.mapping.pp_rank
        v = chunks_per_stage(schedule)
        self.nv, self.stage, self.last = pp * v, s, s == pp - 1
        sched = get_schedule(schedule, pp, micro_batches, **({"v": v} if v > 1 else {}))
        self.actions = add_send_recv(sched)[s]
        pieces = split_sequential(model, pp * v)
        self.chunks = [pieces[c * pp + s] for c in range(v)]
        name_of = {id(p): n for n, p in model.named_parameters()}
        self.params = [p for ch in self.chunks for p in ch.parameters()]
        self.names = [name_of[id(p)] for p in self.params]

    def gradients(self, mb, seed, on_leaf_grad):
        work = _StageWork(self, list(zip(mb[::2], mb[1::2])), seed)
        store = StageRunner(work, self.pgm.config.pp, self.nv, self.stage).gradients(self.actions)
        return (_mean(work.losses) if self.last else None), store


class _StageWork:
    """The interpreter's view of a StagePart: chunk forwards, pipeline sends and receives."""

    def __init__(self, part: StagePart, mbs: list, seed):
        self.p, self.mbs = part, mbs
        # the mean over micro-batches, times the loss scale: once a step, on the last stage
        if part.last:
            seed = seed * (1.0 / part.m) if isinstance(seed, Tensor) else seed / part.m
        self.seed = seed
        self.losses = [None] * len(mbs)

    def forward(self, a, k: int, x):
        p, (inputs, targets) = self.p, self.mbs[a.mb]
        out = p.chunks[a.chunk](inputs if k == 0 else x)
        if k < p.nv - 1:
            return out
        loss = p.loss_fn(out, targets)
        self.losses[a.mb] = loss.detach()
        return loss * self.seed

    def _tag(self, mb: int, k: int, grad: bool) -> int:
        return 2 * (mb * self.p.nv + k) + grad

    def send(self, a, k: int, value) -> None:
        to = k + 1 if a.kind == SEND_F else k - 1
        pp = self.p.pgm.config.pp
        self.p.pgm.pp_group.send(value, to % pp, self._tag(a.mb, to, a.kind != SEND_F))

    def recv(self, a, k: int):
        src = k - 1 if a.kind == RECV_F else k + 1
        pp = self.p.pgm.config.pp
        return self.p.pgm.pp_group.recv(src % pp, self._tag(a.mb, k, a.kind != RECV_F),
                                        self.p.device)


class GPTPart:
    """A gpt rank of any dp x tp x pp layout; the engine averages over the replicas."""
    overlaps = False

    def __init__(self, rank_trainer):
        self.r = rank_trainer
        self.names = list(rank_trainer.names)
        self.params = [rank_trainer.params[n] for n in self.names]
        self.last = rank_trainer.last

    def gradients(self, mb, seed, on_leaf_grad):
        self.r.loss_scale = seed
        grads = self.r.step_gradients(list(zip(mb[::2], mb[1::2])), average=False)
        loss = _mean(self.r.mb_losses) if self.last else None
        return loss, [grads[n] for n in self.names]

    def close(self) -> None:
        self.r.close()  # its pipeline transfer threads
