"""3D-parallel GPT training: data x tensor x pipeline parallel in one run.

Each rank (a thread from ``dist.spawn`` or an MPI process) holds the tensor-parallel shards of
the layers of its pipeline stage. Per step, a rank follows its stage's action list of the 1F1B
schedule (``pipeline.get_schedule``): F receives activations from the previous stage (or embeds
tokens), runs its blocks with TP collectives inside, and sends to the next stage (or computes the
vocab-parallel loss); B receives the output gradient (or starts from the loss), backpropagates and
sends the input gradient back. Gradients are then averaged over the DP group only, and every
rank updates its own shards.

Initial weights come from one dense GPT state made from the seed on every rank and sliced, so
every layout (including 1x1x1, the single-device run) starts from the same model, and the same
global batch is seen in the same order: the loss curves of all layouts agree.
"""
from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass

import numpy as np

from ..autograd import backward, backward_with_grad
from ..autograd.tape import no_grad
from ..ops.creation import zeros
from ..runtime.errors import ShapeError
from ..tensor import Tensor, tensor
from ..utils.checkpoint import checkpoint
from .groups import ProcessGroupManager, RankMapping, ThreeDParallelismConfig
from .tensor_parallel import functional as TF
from .tensor_parallel.shard import COLUMN, QKV, REPLICATE, ROW, VOCAB, shard_array

__all__ = ["GPTConfig", "dense_gpt_state", "gpt_shard_plan", "stage_blocks", "validate_layout",
           "train_3d", "Layout3DError"]


class Layout3DError(ValueError):
    """A dp x tp x pp layout that cannot run this model on these devices."""


@dataclass(frozen=True)
class GPTConfig:
    """The sizes of ``nn.GPT`` (same names); sequences are ``block_size`` tokens long."""
    vocab_size: int = 32
    block_size: int = 8
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 16

    def build(self, seed: int = 0, device=None):
        """The dense single-device ``nn.GPT`` every layout starts from."""
        from ..nn import GPT
        return GPT(self.vocab_size, self.block_size, n_layer=self.n_layer, n_head=self.n_head,
                   n_embd=self.n_embd, device=device, seed=seed)


def dense_gpt_state(cfg: GPTConfig, seed: int = 0, device=None) -> dict:
    """The dense GPT's parameters (numpy): ``nn.GPT`` built from ``seed``, so every layout,
    and the plain single-device model, starts from the same weights."""
    return {k: v.numpy() for k, v in cfg.build(seed, device).state_dict().items()}


_SUFFIX_MODES = {"attn.in_proj_weight": QKV, "attn.in_proj_bias": QKV,
                 "attn.out_proj.weight": ROW, "mlp.fc.weight": COLUMN, "mlp.fc.bias": COLUMN,
                 "mlp.proj.weight": ROW}
_VOCAB = ("wte.weight", "lm_head.weight")


def gpt_shard_plan(names) -> dict:
    """``nn.GPT`` parameter name -> TP shard mode (anything not listed is replicated)."""
    plan = {}
    for n in names:
        if n in _VOCAB:
            plan[n] = VOCAB
        else:
            plan[n] = next((m for s, m in _SUFFIX_MODES.items() if n.endswith(s)), REPLICATE)
    return plan


def stage_blocks(n_layers: int, pp: int) -> list[range]:
    """Contiguous, balanced ranges of block indices per pipeline stage."""
    base, extra = divmod(n_layers, pp)
    out, a = [], 0
    for s in range(pp):
        n = base + (s < extra)
        out.append(range(a, a + n))
        a += n
    return out


def validate_layout(cfg: GPTConfig, dp: int, tp: int, pp: int, n_devices: int,
                    batch_size: int, micro_batches: int) -> None:
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
    if cfg.n_layer < pp:
        problems.append(f"{cfg.n_layer} transformer layers cannot fill pp={pp} pipeline "
                        f"stages; use pp <= {cfg.n_layer}")
    if micro_batches < 1:
        problems.append(f"micro_batches must be >= 1, got {micro_batches}")
    elif batch_size % (dp * micro_batches):
        problems.append(f"batch size {batch_size} is not divisible by dp * micro_batches = "
                        f"{dp} * {micro_batches}")
    if problems:
        raise Layout3DError(f"invalid 3D layout dp={dp} tp={tp} pp={pp}: " + "; ".join(problems))


def synthetic_tokens(cfg: GPTConfig, n: int, seed: int) -> np.ndarray:
    """[n, block_size + 1] token rows with learnable structure (each row counts up by a stride)."""
    rs = np.random.default_rng(seed + 1)
    start = rs.integers(0, cfg.vocab_size, (n, 1))
    stride = rs.integers(1, 4, (n, 1))
    return ((start + stride * np.arange(cfg.block_size + 1)) % cfg.vocab_size).astype(np.int32)


# ---------------------------------------------------------------------------- model pieces
def _layer_norm(x, w, b):
    from ..nn import functional as NF
    return NF.layer_norm(x, (x.shape[-1],), w, b, 1e-5)


class _Stage:
    """This rank's pipeline stage: its shards (leaf tensors) and its forward."""
    loss_scale = 1.0  # a GradScaler's scale (mixed precision): multiplies the backward's seed

    def __init__(self, cfg, dense: dict, pgm: ProcessGroupManager, device,
                 checkpoint: bool = False):
        m = pgm.mapping
        self.checkpoint = checkpoint  # recompute each block's activations in backward
        self.cfg, self.group, self.device = cfg, pgm.tp_group, device
        self.first, self.last = m.is_first_stage, m.is_last_stage
        self.blocks = stage_blocks(cfg.n_layer, pgm.config.pp)[m.pp_rank]
        names = []
        if self.first:
            names += ["wte.weight", "wpe.weight"]
        for i in self.blocks:
            names += [n for n in dense if n.startswith(f"blocks.{i}.")]
        if self.last:
            names += ["ln_f.weight", "ln_f.bias", "lm_head.weight"]
        plan = gpt_shard_plan(names)
        tp, r = pgm.config.tp, m.tp_rank
        self.params = {n: tensor(shard_array(dense[n], plan[n], tp, r,
                                             is_bias=n.endswith("bias"), num_heads=cfg.n_head),
                                 device=device, requires_grad=True) for n in names}

    def forward(self, x, targets=None):
        """nn.GPT's forward (pre-LN blocks, GELU-tanh MLP) on this stage's shards; the last
        stage returns the micro-batch's mean cross-entropy."""
        P, g, ln = self.params, self.group, _layer_norm
        if self.first:
            t = x.shape[-1]
            x = TF.vocab_parallel_embedding(x, P["wte.weight"], g) + P["wpe.weight"][:t]
        for i in self.blocks:
            x = checkpoint(self._block, x, i) if self.checkpoint else self._block(x, i)
        if self.last:
            h = ln(x, P["ln_f.weight"], P["ln_f.bias"])
            logits = TF.column_parallel_linear(h, P["lm_head.weight"], None, g)
            return TF.vocab_parallel_cross_entropy(logits, targets, g)
        return x


    def _block(self, x, i: int):
        """Transformer block ``i`` (its TP collectives inside; a checkpointed block re-runs
        them in backward, in the same order on every TP rank)."""
        P, g, p = self.params, self.group, f"blocks.{i}."
        h = _layer_norm(x, P[p + "ln1.weight"], P[p + "ln1.bias"])
        x = x + TF.parallel_self_attention(
            h, P[p + "attn.in_proj_weight"], P[p + "attn.in_proj_bias"],
            P[p + "attn.out_proj.weight"], P[p + "attn.out_proj.bias"], self.cfg.n_head, g)
        h = _layer_norm(x, P[p + "ln2.weight"], P[p + "ln2.bias"])
        return x + TF.parallel_mlp(h, P[p + "mlp.fc.weight"], P[p + "mlp.fc.bias"],
                                   P[p + "mlp.proj.weight"], P[p + "mlp.proj.bias"], g,
                                   activation="gelu_tanh")


# ---------------------------------------------------------------------------- one rank
def _rank_main(group, cfg, dense, dp, tp, pp, steps, batch_size, micro_batches, lr, data,
               schedule, on_step, optimizer):
    from .pipeline import get_schedule
    pgm = ProcessGroupManager(ThreeDParallelismConfig(dp, tp, pp), group)
    m_ = pgm.mapping
    dev = group.device
    stage = _Stage(cfg, dense, pgm, dev)
    actions = get_schedule(schedule, pp, micro_batches)[m_.pp_rank]
    names = list(stage.params)
    params = [stage.params[n] for n in names]
    if optimizer is None:
        from ..optim import SGD
        opt = SGD(params, lr=lr)
    else:
        opt = optimizer(params)
    losses, t0 = [], time.perf_counter()
    for step in range(steps):
        if on_step is not None:
            on_step(group.rank, step)
        rows = (np.arange(batch_size) + step * batch_size) % len(data)
        mbs = replica_micro_batches(data[rows], m_.dp_rank, dp, micro_batches)
        grads = _run_schedule(stage, pgm, actions, mbs, micro_batches, dev)
        grads = dp_mean_grads(pgm, grads, names, dev)
        for n, p in zip(names, params):  # this rank's shards only
            p.grad = grads[n]
        opt.step()
        if stage.last:
            losses.append(stage_loss(stage, pgm))
    seconds = time.perf_counter() - t0
    return {"losses": losses, "seconds": seconds, "stats": pgm.stats(),
            "coords": (m_.dp_rank, m_.tp_rank, m_.pp_rank)}


def replica_micro_batches(tokens: np.ndarray, dp_rank: int, dp: int, m: int) -> list:
    """This data-parallel replica's equal share of the global batch, cut into ``m``
    micro-batches (the layout check guarantees both divisions are exact)."""
    per = len(tokens) // dp
    mine = tokens[dp_rank * per:(dp_rank + 1) * per]
    size = per // m
    return [mine[k * size:(k + 1) * size] for k in range(m)]


def dp_mean_grads(pgm, grads: dict, names: list, dev) -> dict:
    """Gradients averaged over the data-parallel group only (TP and PP peers hold other
    shards) by the one gradient averager: flat device buckets through the group's
    ``all_reduce_async``."""
    if pgm.config.dp == 1:
        return grads
    from types import SimpleNamespace

    from .averaging import GradientAverager
    gs = [grads[n] for n in names]
    specs = [SimpleNamespace(shape=g.shape, dtype=g.dtype) for g in gs]
    return dict(zip(names, GradientAverager(specs, pgm.dp_group, names=names,
                                            device=dev).average(gs)))


def stage_loss(stage, pgm) -> float:
    """The step's loss on a last-stage rank: the mean over micro-batches, then over replicas."""
    loss = np.array([np.mean(stage.mb_losses)], np.float64)
    if pgm.config.dp > 1:
        loss = pgm.all_reduce_dp(loss, "mean")
    return float(loss[0])


def _run_schedule(stage, pgm, actions, mbs, m, dev):
    """Follow this stage's action list for one step; returns the summed parameter gradients."""
    live = {}  # mb -> (input leaf or None, output)
    grads = {}
    stage.mb_losses = []
    for a in actions:
        mb = a.mb
        if a.kind == "F":
            tokens = mbs[mb]
            if stage.first:
                x_in = None
                x = tensor(tokens[:, :-1], device=dev)
            else:
                x_in = pgm.recv_from_prev_stage(tag=2 * mb, device=dev).requires_grad_(True)
                x = x_in
            targets = tensor(tokens[:, 1:], device=dev) if stage.last else None
            out = stage.forward(x, targets)
            if stage.last:
                stage.mb_losses.append(out.item())
                out = out * (stage.loss_scale / m)  # the mean over micro-batches
            else:
                pgm.send_to_next_stage(out, tag=2 * mb)
            live[mb] = (x_in, out)
        elif a.kind == "B":
            x_in, out = live.pop(mb)
            if stage.last:
                store = backward(out)
            else:
                g = pgm.recv_from_next_stage(tag=2 * mb + 1, device=dev)
                store = backward_with_grad(out, g)
            for n, p in stage.params.items():
                gp = store.get(p)
                if gp is not None:
                    grads[n] = gp if n not in grads else grads[n] + gp
            if x_in is not None:
                pgm.send_to_prev_stage(store.get(x_in), tag=2 * mb + 1)
        else:
            raise ValueError(f"the 3D runner follows F/B schedules; {a!r} is not supported "
                             f"(use schedule '1f1b' or 'gpipe')")
    with no_grad():
        for n, p in stage.params.items():
            if n not in grads:  # e.g. unused: keep the flat bucket aligned across ranks
                grads[n] = zeros(p.shape, device=dev)
    return grads


# ---------------------------------------------------------------------------- entry point
def train_3d(config: GPTConfig | dict | None = None, dp: int = 1, tp: int = 1, pp: int = 1,
             steps: int = 10, batch_size: int = 8, micro_batches: int | None = None,
             lr: float = 0.1, seed: int = 0, devices=None, data=None, schedule: str = "1f1b",
             backend: str = "threads", timeout: float = 60.0, on_step=None,
             optimizer=None, return_details: bool = False):
    """Train the GPT with dp x tp x pp ranks; returns the loss of every step (the global-batch
    mean cross-entropy), identical across layouts up to float32 rounding.

    devices: one per rank (dp * tp * pp of them; default the first dp*tp*pp of wr.devices();
    under backend="mpi", run in every process of ``mpiexec -n dp*tp*pp``, rank r uses this
    process's device r mod n).
    data: int array [N, block_size + 1] (default: a seeded synthetic corpus). micro_batches:
    pipeline micro-batches per replica (default pp). on_step(rank, step): called on every rank
    before each step (fault injection, progress). optimizer: params -> Optimizer, called on
    every rank with its shards (default ``wr.optim.SGD(params, lr)``). Invalid layouts raise
    Layout3DError before any rank starts; a failure in one rank stops all ranks and raises it
    (CollectiveError for the ranks that were waiting on it)."""
    cfg = _config(config)
    world = dp * tp * pp
    if devices is None:
        devices = _default_devices(world, backend)
    micro_batches = pp if micro_batches is None else micro_batches
    validate_layout(cfg, dp, tp, pp, len(devices), batch_size, micro_batches)
    from .pipeline import get_schedule
    sched = get_schedule(schedule, pp, micro_batches)
    kinds = {a.kind for st in sched for a in st}
    if not kinds <= {"F", "B"} or sched.num_chunks != 1:
        raise Layout3DError(f"schedule {schedule!r} needs split backwards or model chunks; the "
                            f"3D runner follows one-chunk F/B schedules ('1f1b' or 'gpipe')")
    data = _token_rows(cfg, data, batch_size, seed)
    from .launch import spawn
    dense = dense_gpt_state(cfg, seed, devices[0])

    def fn(group):
        return _rank_main(group, cfg, dense, dp, tp, pp, steps, batch_size, micro_batches, lr,
                          data, schedule, on_step, optimizer)

    results = spawn(fn, world, backend=backend, devices=list(devices), timeout=timeout)
    last = RankMapping.from_3d_coords(ThreeDParallelismConfig(dp, tp, pp), 0, 0, pp - 1)
    losses = results[last]["losses"]
    if not return_details:
        return losses
    secs = max(r["seconds"] for r in results)
    return {"losses": losses, "seconds": secs, "layout": {"dp": dp, "tp": tp, "pp": pp,
                                                          "schedule": schedule,
                                                          "devices": world},
            "tokens_per_s": steps * batch_size * cfg.block_size / secs if secs else math.inf,
            "config": asdict(cfg), "ranks": results}


def _default_devices(world: int, backend: str) -> list:
    """The first ``world`` devices; under MPI (one process per rank) rank r takes this host's
    device r mod n. Fewer devices than ranks is left for ``validate_layout`` to report."""
    from ..runtime import devices as _devs
    devs = _devs()
    if backend == "mpi":
        return [devs[r % len(devs)] for r in range(world)]
    return devs[:world]


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
    if config is None:
        return GPTConfig()
    if isinstance(config, GPTConfig):
        return config
    if isinstance(config, dict):
        known = set(GPTConfig.__dataclass_fields__)
        bad = set(config) - known
        if bad:
            raise ValueError(f"unknown GPT config keys {sorted(bad)}; known: {sorted(known)}")
        return GPTConfig(**config)
    raise TypeError(f"config must be a GPTConfig or a dict, got {type(config).__name__}")
