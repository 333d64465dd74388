"""3D-parallel GPT training: each rank (thread or MPI process) is a :class:`RankTrainer` that
builds ``nn.GPT`` from the seed, keeps its pipeline chunks' blocks sharded over its TP group, runs
its action list through the one schedule interpreter and averages gradients over its DP group.
Every layout starts from the same dense model and batches, so all layouts' losses agree."""
from __future__ import annotations

import math
import time
from dataclasses import asdict

import numpy as np

from ..autograd.tape import no_grad
from ..nn.gpt import GPTConfig
from ..ops.creation import zeros
from ..runtime.capture import host_start
from ..runtime.errors import ShapeError
from ..tensor import tensor
from ..utils.checkpoint import checkpoint
from .groups import ProcessGroupManager, RankMapping, ThreeDParallelismConfig
from .pipeline.actions import RECV_F, SEND_F, ScheduleError, add_send_recv
from .pipeline.interpreter import StageRunner
from .pipeline.p2p import PipelineP2P
from .pipeline.schedules import get_schedule
from .tensor_parallel.functional import vocab_parallel_cross_entropy
from .tensor_parallel.layers import dense_name, shard_gpt
from .tensor_parallel.shard import COLUMN, QKV, REPLICATE, ROW, VOCAB
from .transport import split_bounds

__all__ = ["GPTConfig", "dense_gpt_state", "gpt_shard_plan", "stage_blocks", "validate_layout",
           "train_3d", "Layout3DError", "RankTrainer", "GPTChunk"]


class Layout3DError(ValueError):
    """A dp x tp x pp layout that cannot run this model on these devices."""


def chunks_per_stage(schedule: str) -> int:
    """Model chunks per pipeline rank: 2 for the interleaved schedule (Megatron's v), else 1."""
    return 2 if schedule.strip().lower().startswith("interleaved") else 1


def dense_gpt_state(cfg: GPTConfig, seed: int = 0, device=None) -> dict:
    """The dense ``nn.GPT``'s parameters (numpy) from ``seed``, where every layout starts."""
    return {k: v.numpy() for k, v in cfg.build(seed, device).state_dict().items()}


_SUFFIX_MODES = {"attn.in_proj_weight": QKV, "attn.in_proj_bias": QKV,
                 "attn.out_proj.weight": ROW, "mlp.fc.weight": COLUMN, "mlp.fc.bias": COLUMN,
                 "mlp.proj.weight": ROW}
_VOCAB = ("wte.weight", "lm_head.weight")


def gpt_shard_plan(names) -> dict:
    """``nn.GPT`` parameter name -> TP shard mode (anything not listed is replicated)."""
    return {n: VOCAB if n in _VOCAB else next((m for s, m in _SUFFIX_MODES.items()
                                               if n.endswith(s)), REPLICATE) for n in names}


def stage_blocks(n_layers: int, pp: int) -> list[range]:
    """Contiguous, balanced ranges of block indices per pipeline stage."""
    cuts = split_bounds(n_layers, pp)
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def validate_layout(cfg: GPTConfig, dp: int, tp: int, pp: int, n_devices: int,
                    batch_size: int, micro_batches: int, schedule: str = "1f1b") -> None:
    """Every reason this layout cannot run, as one clear error, before any rank starts."""
    try:
        ThreeDParallelismConfig(dp, tp, pp).validate(n_devices)
    except ValueError as e:
        raise Layout3DError(f"invalid 3D layout: {e}") from None
    problems = []
    if cfg.n_embd % cfg.n_head:
        problems.append(f"n_embd {cfg.n_embd} is not divisible by n_head {cfg.n_head}")
    if cfg.n_head % tp:
        problems.append(f"{cfg.n_head} attention heads cannot be split across tp={tp} ranks; "
                        f"choose tp dividing {cfg.n_head}")
    if cfg.vocab_size % tp:
        problems.append(f"vocabulary {cfg.vocab_size} is not divisible by tp={tp}")
    v = chunks_per_stage(schedule)
    if cfg.n_layer < pp * v:
        what = f"pp={pp} pipeline stages" + (f" x {v} interleaved chunks" if v > 1 else "")
        problems.append(f"{cfg.n_layer} transformer layers cannot fill {what}; use "
                        f"pp <= {cfg.n_layer // v}" + (" or another schedule" if v > 1 else ""))
    if micro_batches < 1:
        problems.append(f"micro_batches must be >= 1, got {micro_batches}")
    elif batch_size % (dp * micro_batches):
        problems.append(f"batch size {batch_size} is not divisible by dp * micro_batches = "
                        f"{dp} * {micro_batches}")
    try:
        get_schedule(schedule, pp, max(micro_batches, 1), **({"v": v} if v > 1 else {}))
    except ScheduleError as e:
        problems.append(f"--schedule {schedule}: {e}")
    if problems:
        raise Layout3DError(f"invalid 3D layout dp={dp} tp={tp} pp={pp}: " + "; ".join(problems))


def synthetic_tokens(cfg: GPTConfig, n: int, seed: int) -> np.ndarray:
    """[n, block_size + 1] token rows with learnable structure (each row counts up by a stride)."""
    rs = np.random.default_rng(seed + 1)
    start = rs.integers(0, cfg.vocab_size, (n, 1))
    stride = rs.integers(1, 4, (n, 1))
    return ((start + stride * np.arange(cfg.block_size + 1)) % cfg.vocab_size).astype(np.int32)


class GPTChunk:
    """One virtual pipeline stage of an ``nn.GPT``: its ``blocks``, the embedding on the first,
    the final norm, head and vocab-parallel loss on the last."""

    def __init__(self, model, blocks: range, first: bool, last: bool, tp_group,
                 checkpoint: bool = False):
        self.model, self.blocks, self.first, self.last = model, blocks, first, last
        self.group, self.checkpoint = tp_group, checkpoint  # recompute blocks in backward

    def __call__(self, x, targets=None):
        m = self.model
        if self.first:
            x = m.embed(x)
        for i in self.blocks:
            blk = getattr(m.blocks, str(i))  # by name: the other blocks are gone
            x = checkpoint(blk, x) if self.checkpoint else blk(x)
        if self.last:
            return vocab_parallel_cross_entropy(m.lm_head(m.ln_f(x)), targets, self.group)
        return x


class RankTrainer:
    """One rank of a dp x tp x pp GPT run: its shards (``params``: dense name -> tensor), its
    action list and :meth:`gradients` (the caller steps its optimizer on them)."""
    loss_scale = 1.0  # a GradScaler's scale (mixed precision): multiplies the backward's seed

    def __init__(self, group, cfg: GPTConfig, dp: int, tp: int, pp: int,
                 schedule: str = "1f1b", micro_batches: int | None = None, seed: int = 0,
                 checkpoint: bool = False):
        self.pgm = ProcessGroupManager(ThreeDParallelismConfig(dp, tp, pp), group)
        self.mapping, self.device = self.pgm.mapping, group.device
        s, v = self.mapping.pp_rank, chunks_per_stage(schedule)
        self.m = pp if micro_batches is None else micro_batches
        sched = get_schedule(schedule, pp, self.m, **({"v": v} if v > 1 else {}))
        self.actions = add_send_recv(sched)[s]
        self.nv = nv = pp * v
        ranges = stage_blocks(cfg.n_layer, nv)
        model = cfg.build(seed, self.device)  # then keep only this rank's pieces
        mine = [ranges[c * pp + s] for c in range(v)]
        owned = {i for r in mine for i in r}
        for i in range(cfg.n_layer):
            if i not in owned:
                setattr(model.blocks, str(i), None)
        self.first, self.last = s == 0, s == pp - 1  # holds virtual stage 0 / the loss
        if not self.first:
            model.wte = model.wpe = None
        if not self.last:
            model.ln_f = model.lm_head = None
        if tp > 1:
            shard_gpt(model, self.pgm.tp_group)
        self.chunks = [GPTChunk(model, mine[c], c * pp + s == 0, c * pp + s == nv - 1,
                                self.pgm.tp_group, checkpoint) for c in range(v)]
        self.params = {dense_name(n): p for n, p in model.named_parameters()}
        self.names = list(self.params)
        self.mb_losses: list = []
        self._dp_avg = None  # the GradientAverager of the data-parallel group
        # asynchronous stage-to-stage transfers (every rank of the pipeline group makes them)
        self.p2p = PipelineP2P(self.pgm.pp_group) if pp > 1 else None

    def close(self) -> None:
        """Stop the pipeline transfer threads."""
        if self.p2p is not None:
            self.p2p.close()

    @property
    def coords(self) -> tuple:
        return (self.mapping.dp_rank, self.mapping.tp_rank, self.mapping.pp_rank)

    def gradients(self, tokens: np.ndarray) -> dict:
        """One step's gradients of this rank's shards for the global batch ``tokens`` [B, T+1]."""
        return self.step_gradients(self.micro_batches(tokens))

    def micro_batches(self, tokens: np.ndarray) -> list:
        """This replica's share of ``tokens`` as ``m`` (inputs, targets) device micro-batches."""
        per = len(tokens) // self.pgm.config.dp
        size, start = per // self.m, self.mapping.dp_rank * per
        mbs = [tokens[start + k * size:start + (k + 1) * size] for k in range(self.m)]
        return [(tensor(mb[:, :-1], device=self.device), tensor(mb[:, 1:], device=self.device))
                for mb in mbs]

    def step_gradients(self, mbs: list, average: bool = True) -> dict:
        """:meth:`gradients` from device micro-batches without a host read (what ``wr.jit``
        captures); ``mb_losses`` gets the micro-batch losses as device tensors. ``average=False``
        leaves the data-parallel mean to the caller (the training engine's gradient sync)."""
        self.mb_losses = [None] * self.m
        store = StageRunner(_RankWork(self, mbs), self.pgm.config.pp, self.nv,
                            self.mapping.pp_rank).gradients(self.actions)
        grads = {}
        with no_grad():
            for n, p in self.params.items():  # unused ones: zeros keep the buckets aligned
                g = store.get(p)
                grads[n] = zeros(p.shape, device=self.device) if g is None else g
        return self._dp_mean(grads) if average else grads

    def _dp_mean(self, grads: dict) -> dict:
        """Gradients averaged over the data-parallel group only (TP/PP peers hold other shards)."""
        if self.pgm.config.dp == 1:
            return grads
        if self._dp_avg is None:
            from .averaging import GradientAverager
            self._dp_avg = GradientAverager([self.params[n] for n in self.names],
                                            self.pgm.dp_group, names=self.names)
        return dict(zip(self.names, self._dp_avg.average([grads[n] for n in self.names])))

    def loss(self) -> float | None:
        """The step's loss on last-stage ranks: the mean over micro-batches, then replicas."""
        if not self.last:
            return None
        loss = np.array([np.mean([float(v.item()) for v in self.mb_losses])], np.float64)
        if self.pgm.config.dp > 1:
            loss = self.pgm.all_reduce_dp(loss, "mean")
        return float(loss[0])


class _RankWork:
    """A 3D rank's work for the interpreter: chunk forwards, pipeline-group sends/receives."""

    def __init__(self, trainer: RankTrainer, mbs: list):
        self.t, self.mbs = trainer, mbs

    def forward(self, a, k: int, x):
        t, (inputs, targets) = self.t, self.mbs[a.mb]
        if k == 0:
            x = inputs
        if k < t.nv - 1:
            return t.chunks[a.chunk](x)
        loss = t.chunks[a.chunk](x, targets)
        t.mb_losses[a.mb] = loss.detach()
        return loss * (t.loss_scale / t.m)  # the mean over micro-batches

    def _tag(self, mb: int, k: int, grad: bool) -> int:
        return 2 * (mb * self.t.nv + k) + grad

    def isend(self, a, k: int, value):
        """Start the send (PipelineP2P); the interpreter waits for it at the end of the step (a
        replay too: ``host_start``), so no send waits for a receive its peer posts later."""
        to = k + 1 if a.kind == SEND_F else k - 1
        p2p, dst, tag = self.t.p2p, to % self.t.pgm.config.pp, \
            self._tag(a.mb, to, a.kind != SEND_F)
        return host_start(value.device, lambda v: p2p.isend(v, dst, tag), value)

    def irecv(self, a, k: int):
        """Post the receive; waited where the compute action takes the data."""
        src = (k - 1 if a.kind == RECV_F else k + 1) % self.t.pgm.config.pp
        p2p, dev, tag = self.t.p2p, self.t.device, self._tag(a.mb, k, a.kind != RECV_F)
        return host_start(dev, lambda: p2p.irecv(src, tag, dev))

    def send(self, a, k: int, value) -> None:
        self.isend(a, k, value).wait()

    def recv(self, a, k: int):
        return self.irecv(a, k).wait()


def train_3d(config: GPTConfig | dict | None = None, dp: int = 1, tp: int = 1, pp: int = 1,
             steps: int = 10, batch_size: int = 8, micro_batches: int | None = None,
             lr: float = 0.1, seed: int = 0, devices=None, data=None, schedule: str = "1f1b",
             backend: str = "threads", timeout: float = 60.0, on_step=None,
             optimizer=None, return_details: bool = False):
    """Train the GPT with dp x tp x pp ranks; returns every step's global-batch loss, the same
    in every layout up to float32 rounding. ``data``: int rows [N, block_size + 1] (default
    synthetic); ``on_step(rank, step)`` runs before each step; ``optimizer``: params ->
    Optimizer (default SGD). Bad layouts raise Layout3DError before any rank starts."""
    cfg = _config(config)
    world = dp * tp * pp
    if devices is None:
        devices = _default_devices(world, backend, timeout)
    micro_batches = pp if micro_batches is None else micro_batches
    validate_layout(cfg, dp, tp, pp, len(devices), batch_size, micro_batches, schedule)
    data = _token_rows(cfg, data, batch_size, seed)
    from .launch import spawn

    def fn(group):
        rank = RankTrainer(group, cfg, dp, tp, pp, schedule, micro_batches, seed)
        params = [rank.params[n] for n in rank.names]
        from ..optim import SGD
        opt = SGD(params, lr=lr) if optimizer is None else optimizer(params)
        losses, t0 = [], time.perf_counter()
        for step in range(steps):
            if on_step is not None:
                on_step(group.rank, step)
            grads = rank.gradients(data[(np.arange(batch_size) + step * batch_size) % len(data)])
            for n, p in zip(rank.names, params):  # this rank's shards only
                p.grad = grads[n]
            opt.step()
            if rank.last:
                losses.append(rank.loss())
        rank.close()
        return {"losses": losses, "seconds": time.perf_counter() - t0,
                "stats": rank.pgm.stats(), "coords": rank.coords}

    results = spawn(fn, world, backend=backend, devices=list(devices), timeout=timeout)
    last = RankMapping.from_3d_coords(ThreeDParallelismConfig(dp, tp, pp), 0, 0, pp - 1)
    losses = results[last]["losses"]
    if not return_details:
        return losses
    secs = max(r["seconds"] for r in results)
    return {"losses": losses, "seconds": secs,
            "layout": {"dp": dp, "tp": tp, "pp": pp, "schedule": schedule, "devices": world},
            "tokens_per_s": steps * batch_size * cfg.block_size / secs if secs else math.inf,
            "config": asdict(cfg), "ranks": results}


def _default_devices(world: int, backend: str, timeout: float) -> list:
    """The first ``world`` devices; under MPI rank r takes this host's device r mod n, the
    process group made first so that it opens only this rank's adapter (launch.py)."""
    from ..runtime import devices as _devs
    if backend != "mpi":
        return _devs()[:world]
    from .launch import init_process_group, rank_device
    init_process_group("mpi", timeout)  # the group spawn then uses, with its own config
    return [rank_device(r) for r in range(world)]


def _token_rows(cfg: GPTConfig, data, batch_size: int, seed: int) -> np.ndarray:
    """The training rows, checked before any rank starts (default: a seeded synthetic corpus)."""
    if data is None:
        data = synthetic_tokens(cfg, max(4 * batch_size, 64), seed)
    data = np.asarray(data)
    if data.ndim != 2 or data.shape[1] != cfg.block_size + 1:
        raise ShapeError(f"data must be [N, block_size + 1] = [N, {cfg.block_size + 1}] token "
                         f"rows, got {data.shape}")
    if data.min() < 0 or data.max() >= cfg.vocab_size:
        raise ValueError(f"token ids must be in [0, {cfg.vocab_size}), got "
                         f"[{data.min()}, {data.max()}]; pass tokens of a vocabulary of at "
                         f"most config.vocab_size")
    return data


def _config(config) -> GPTConfig:
    if config is None or isinstance(config, GPTConfig):
        return config or GPTConfig()
    if isinstance(config, dict):
        known = set(GPTConfig.__dataclass_fields__)
        if bad := set(config) - known:
            raise ValueError(f"unknown GPT config keys {sorted(bad)}; known: {sorted(known)}")
        return GPTConfig(**config)
    raise TypeError(f"config must be a GPTConfig or a dict, got {type(config).__name__}")
