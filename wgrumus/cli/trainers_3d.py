"""The gpt trainer: dp x tp x pp (1x1x1 included) on parallel3d.RankTrainer, with long-lived ranks
(dist.spawn threads taking one command at a time, or this MPI process) keeping their shards and
optimizer state. Checkpoints are dense, so a run resumes in any layout; --jit replays each rank's
step from a wr.jit capture, its communication between the replayed segments."""
from __future__ import annotations

import queue
import threading

import numpy as np

import wgrumus as wr

from ..autograd.store import store_of
from ..distributed import RankMapping, ThreeDParallelismConfig, spawn
from ..distributed.launch import PER_PROCESS
from ..distributed.parallel3d import Layout3DError, RankTrainer, gpt_shard_plan, validate_layout
from ..distributed.tensor_parallel.shard import REPLICATE, shard_array, unshard_arrays
from ..nn import GPTConfig
from ..ops.creation import ones
from ..ops.elementwise import copy_into
from .common import UsageError
from .trainers import Precision, TrainerBase, with_bookkeeping

_POLL = 0.2                 # seconds between checks for "stop" while a rank waits for a command
COLLECTIVE_TIMEOUT = 120.0  # a rank waiting longer on a peer gives up: that peer failed or hung
STEP_TIMEOUT = 900.0        # the longest the driver waits for one command on all ranks


def gpt_config(cfg, task):
    g = cfg.gpt
    vocab = task.config["vocab_size"]
    # A multiple of 8, so tp in {1, 2, 4, 8} splits it and every layout trains the same model.
    padded = -(-vocab // 8) * 8
    return GPTConfig(vocab_size=padded, block_size=g["block_size"], n_layer=g["n_layer"],
                     n_head=g["n_head"], n_embd=g["n_embd"])


class _Rank:
    """One rank's RankTrainer, optimizer and precision (used by thread ranks and MPI ranks)."""

    def __init__(self, group, gcfg, lay, task, seed, precision="f32", jit: bool = False):
        self.group, self.gcfg, self.lay = group, gcfg, lay
        self.rank = RankTrainer(group, gcfg, lay.dp, lay.tp, lay.pp, lay.schedule,
                                lay.micro_batches, seed, task.activation_checkpointing)
        self.map, self.device, self.coords = self.rank.mapping, group.device, self.rank.coords
        self.names, self.params = self.rank.names, self.rank.params
        self.plan = gpt_shard_plan(self.names)
        self.opt = task.make_optimizer([self.params[n] for n in self.names],
                                       **self._clip_scope(task, group))
        self.amp = Precision(precision, self.device)
        self._jit = wr.jit(self._captured_step, devices=[self.device]) if jit else None

    def _clip_scope(self, task, group) -> dict:
        """--clip's norm over this replica's tp x pp ranks (whose shards make up the model), with
        TP-replicated parameters counted on tp rank 0 only."""
        if task.clip is None or self.lay.tp * self.lay.pp == 1:
            return {}
        model = group.split(self.map.dp_rank, name=f"model-dp{self.map.dp_rank}")
        dup = [self.params[n] for n in self.names
               if self.map.tp_rank > 0 and self.plan[n] == REPLICATE]
        return {"group": model, "counted_elsewhere": dup}

    def _captured_step(self, *mbs):
        """The rank's whole step on device micro-batches (inputs, targets alternating) with no
        host read, as --jit captures it; returns the micro-batch losses (last stage)."""
        if self.amp.f16:  # the scale stays on the device, so a replay follows its updates
            self.rank.loss_scale = self.amp.scaler.scale(ones((), device=self.device))
        with self.amp.autocast():
            grads = self.rank.step_gradients(list(zip(mbs[::2], mbs[1::2])))
        self.amp.step(self.opt, store_of((self.params[n], grads[n]) for n in self.names))
        return self.rank.mb_losses

    def close(self) -> None:
        """Give the captured step's buffers back to the pool (--jit)."""
        if self._jit is not None:
            self._jit.free()
        self.rank.close()

    def step(self, tokens: np.ndarray):
        """One optimizer step on ``tokens`` [B, T+1]; the global loss on rank (0, 0, last)."""
        mbs = [t for mb in self.rank.micro_batches(tokens) for t in mb]
        run = self._jit or self._captured_step
        self.rank.mb_losses = with_bookkeeping([self.opt], lambda: run(*mbs))
        loss = self.rank.loss()
        return loss if self.coords == (0, 0, self.lay.pp - 1) else None

    def state(self) -> dict:
        """This rank's shards (numpy) of parameters and optimizer state, keyed by name."""
        osd = self.opt.state_dict()
        opt = {n: {k: (v.numpy() if hasattr(v, "numpy") else v)
                   for k, v in osd["state"].get(i, {}).items()} for i, n in enumerate(self.names)}
        groups = [{k: v for k, v in g.items() if k != "params"} for g in osd["param_groups"]]
        return {"coords": self.coords, "params": {n: self.params[n].numpy() for n in self.names},
                "opt": opt, "groups": groups}

    def load(self, dense: dict) -> None:
        """Take this rank's shards of a dense checkpoint (any layout wrote it)."""
        tp, r = self.lay.tp, self.map.tp_rank

        def shard(n, arr):
            return shard_array(np.asarray(arr, np.float32), self.plan[n], tp, r,
                               is_bias=n.endswith("bias"), num_heads=self.gcfg.n_head)
        with wr.no_grad():
            for n in self.names:
                copy_into(self.params[n], wr.tensor(shard(n, dense["params"][n]),
                                                          device=self.device))
        state = {i: {k: (shard(n, v) if isinstance(v, np.ndarray) and v.ndim > 0 else v)
                     for k, v in dense["opt"].get(n, {}).items()} for i, n in enumerate(self.names)}
        groups = [dict(g, params=list(range(len(self.names)))) for g in dense["groups"]]
        self.opt.load_state_dict({"state": state, "param_groups": groups})

    def stats(self) -> dict:
        s = self.rank.pgm.stats()
        return {"coords": self.coords, "device": self.device.host_index,
                "comm_seconds": sum(s[k]["seconds"] for k in ("dp", "tp", "pp")),
                "dispatches": self.device.dispatches}


def _dense(states: list, gcfg, lay) -> dict:
    """Replica 0's shards merged into dense parameters and optimizer state."""
    by = {s["coords"]: s for s in states}
    params, opt = {}, {}
    for pp in range(lay.pp):
        shards = [by[(0, t, pp)] for t in range(lay.tp)]
        plan = gpt_shard_plan(list(shards[0]["params"]))
        for n in shards[0]["params"]:
            kw = {"is_bias": n.endswith("bias"), "num_heads": gcfg.n_head}
            params[n] = unshard_arrays([s["params"][n] for s in shards], plan[n], **kw)
            opt[n] = {k: unshard_arrays([s["opt"][n][k] for s in shards], plan[n], **kw)
                      if isinstance(v, np.ndarray) and v.ndim > 0 else v
                      for k, v in shards[0]["opt"].get(n, {}).items()}
    return {"params": params, "opt": opt, "groups": by[(0, 0, 0)]["groups"]}


class ThreeDTrainer(TrainerBase):
    """The gpt trainer for every layout (see the module docstring)."""

    def __init__(self, cfg, task):
        self.cfg, self.task, self.lay = cfg, task, cfg.layout
        self.gcfg = gpt_config(cfg, task)
        try:
            validate_layout(self.gcfg, self.lay.dp, self.lay.tp, self.lay.pp, self.lay.world,
                            cfg.batch_size, self.lay.micro_batches, self.lay.schedule)
        except Layout3DError as e:
            raise UsageError(str(e)) from None
        self._dense_model = None  # every rank builds the nn.GPT of --seed and keeps its shards
        if self.lay.backend in PER_PROCESS:
            device = self.join_mpi(COLLECTIVE_TIMEOUT)
            self.group.device = device
            self.rank = _Rank(self.group, self.gcfg, self.lay, task, cfg.seed, cfg.precision,
                              cfg.jit)
            self._loss_rank = RankMapping.from_3d_coords(  # the rank that holds the loss
                ThreeDParallelismConfig(self.lay.dp, self.lay.tp, self.lay.pp), 0, 0,
                self.lay.pp - 1)
            return
        self._start_threads(wr.devices()[:self.lay.world])

    def _start_threads(self, devices):
        world = self.lay.world
        self._inbox = [queue.Queue() for _ in range(world)]
        self._replies: queue.Queue = queue.Queue()
        self._stop = threading.Event()
        self._error: list = []

        def rank_main(group):
            rank = _Rank(group, self.gcfg, self.lay, self.task, self.cfg.seed, self.cfg.precision,
                         self.cfg.jit)
            self._replies.put((group.rank, "ready", None))
            while not self._stop.is_set():
                try:
                    cmd, args = self._inbox[group.rank].get(timeout=_POLL)
                except queue.Empty:
                    continue
                if cmd == "close":
                    return rank.close()
                try:
                    out = getattr(rank, cmd)(*args)  # step, state, load or stats
                except BaseException:
                    self._stop.set()  # ranks idle between commands stop too; spawn reports it
                    raise
                self._replies.put((group.rank, cmd, out))
            return None

        def driver():
            try:
                spawn(rank_main, world, backend="threads", devices=list(devices),
                      timeout=COLLECTIVE_TIMEOUT)
            except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
                self._error.append(e)
                self._replies.put((-1, "error", e))

        self._driver = threading.Thread(target=driver, name="wgrumus-3d-driver", daemon=True)
        self._driver.start()
        self._collect("ready")

    def _collect(self, kind) -> list:
        """One reply per rank (rank order), or the first rank failure re-raised here."""
        out = [None] * self.lay.world
        got = 0
        while got < self.lay.world:
            try:
                rank, k, val = self._replies.get(timeout=STEP_TIMEOUT)
            except queue.Empty:
                raise TimeoutError(f"gpt ranks did not answer '{kind}' within "
                                   f"{STEP_TIMEOUT:.0f} s") from None
            if k == "error":
                raise val
            out[rank] = val
            got += 1
        return out

    def _all(self, cmd, *args) -> list:
        if self.lay.backend in PER_PROCESS:
            out = getattr(self.rank, cmd)(*args)
            return self.group.all_gather_object(out) if cmd in ("state", "stats") else [out]
        for q in self._inbox:
            q.put((cmd, args))
        return self._collect(cmd)

    def step(self, x, y) -> float:
        tokens = np.concatenate([x, y[:, -1:]], axis=1).astype(np.int32)
        self._dense_model = None
        if self.lay.backend in PER_PROCESS:
            loss = self.rank.step(tokens)
            return float(self.group.broadcast(np.array([loss or 0.0]),
                                              root=self._loss_rank)[0])
        losses = self._all("step", tokens)
        return next(v for v in losses if v is not None)

    def state_dict(self) -> dict:
        return _dense(self._all("state"), self.gcfg, self.lay)

    def load_state_dict(self, sd) -> None:
        self._all("load", sd)
        self._dense_model = None

    def predict(self, x) -> np.ndarray:
        """The gathered weights in a dense nn.GPT on device 0 (evaluation and sampling)."""
        if self._dense_model is None:
            model = self.gcfg.build(self.cfg.seed, wr.devices()[0])
            model.load_state_dict(self.state_dict()["params"])
            model.eval()
            self._dense_model = model
        with wr.no_grad():
            logits = self._dense_model(np.asarray(x, np.int32)).numpy()
        return logits[..., :self.task.config["vocab_size"]]

    def device_stats(self, seconds: float) -> list[dict]:
        return [{"device": s["device"], "role": "dp {} tp {} pp {}".format(*s["coords"]),
                 "dispatches": s["dispatches"],
                 "comm share": min(1.0, s["comm_seconds"] / seconds) if seconds else 0.0}
                for s in sorted(self._all("stats"), key=lambda s: s["device"])]

    def close(self) -> None:
        if self.lay.backend in PER_PROCESS:
            return self.rank.close()
        for q in self._inbox:
            q.put(("close", ()))
        self._driver.join(30.0)
        self._stop.set()

