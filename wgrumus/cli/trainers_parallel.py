"""Data-parallel (distributed.DataParallel) and pipeline-parallel (PipelineExecutor, one pipeline
per --dp replica averaging with the GradientAverager) trainers for the mlp / cnn models."""
from __future__ import annotations

import numpy as np

import wgrumus as wr

from ..autograd import GradientStore
from ..distributed import ProcessGroup, ThreadWorld, spawn
from ..distributed.averaging import GradientAverager
from ..distributed.data_parallel import DataParallel
from ..distributed.errors import CollectiveError
from ..distributed.launch import PER_PROCESS
from ..distributed.pipeline import PipelineExecutor, split_sequential
from ..optim import clip_grad_norm_
from .common import UsageError
from .trainers import TrainerBase, to_tensor, with_bookkeeping


def _copy_weights(src, dst) -> None:
    """dst gets src's values (replicas start identical whatever device they are on)."""
    dst.load_state_dict({k: v.numpy() if hasattr(v, "numpy") else v
                         for k, v in src.state_dict().items()})


class DataParallelTrainer(TrainerBase):
    """One replica per device (threads) or per process (mpi, on device rank % devices)."""

    def __init__(self, cfg, task):
        self.task = task
        devs = ([self.join_mpi(120.0)] if cfg.layout.backend in PER_PROCESS
                else wr.devices()[:cfg.layout.world])
        self.model, self.device = task.make_model(devs[0]), devs[0]
        self.dp = DataParallel(self.model, devs, timeout=120.0, backend=cfg.layout.backend,
                               group=self.group, jit=cfg.jit)
        self.opts = [task.make_optimizer(list(r.parameters())) for r in self.dp.replicas]

    def step(self, x, y) -> float:
        return with_bookkeeping(self.opts if self.dp.jit else [], lambda: float(
            self.dp.train_step(x, y, self.task.loss, self.opts)))

    def _loaded(self) -> None:
        self.dp.broadcast_weights()

    def device_stats(self, seconds: float) -> list[dict]:
        rows = [{"device": d.host_index, "role": f"replica {k}", "dispatches": d.dispatches,
                 "submits": d.submits,
                 "comm share": _share(self.dp.groups[k].stats()["seconds"], seconds)}
                for k, d in enumerate(self.dp.devices)]
        if self.group is not None:
            rows = [dict(r, role=f"rank {i}")
                    for i, rr in enumerate(self.group.all_gather_object(rows)) for r in rr]
        return rows

    def close(self) -> None:
        self.dp.close()


class PipelineTrainer(TrainerBase):
    """dp replicas x pp stages; replica r's stage s runs on device r * pp + s."""

    def __init__(self, cfg, task):
        lay = cfg.layout
        self.task, self.lay = task, lay
        devs = wr.devices()[:lay.world]
        self.master = task.make_model(devs[0])
        n_layers = len(list(iter(self.master)))
        chunks = 2 if lay.schedule == "interleaved" else 1
        if lay.pp * chunks > n_layers:
            raise UsageError(f"--pp {lay.pp}{' x 2 interleaved chunks' if chunks > 1 else ''} "
                             f"needs at least {lay.pp * chunks} layers; {cfg.model} has "
                             f"{n_layers}")
        self.replicas, self.stages, self.execs, self.opts = [], [], [], []
        for r in range(lay.dp):
            model = self.master if r == 0 else task.make_model(devs[r * lay.pp])
            if r:
                _copy_weights(self.master, model)
            mine = devs[r * lay.pp:(r + 1) * lay.pp]
            # interleaved: 2 chunks per stage thread; chunk c of stage s is piece c * pp + s
            stage_devs = [mine[k % lay.pp] for k in range(lay.pp * chunks)]
            stages = split_sequential(model, lay.pp * chunks, devices=stage_devs)
            self.replicas.append(model)
            self.stages.append(stages)
            self.execs.append(PipelineExecutor(stages, lay.micro_batches, schedule=lay.schedule,
                                               timeout=120.0, jit=cfg.jit))
            # a stage of parameter-free layers only (e.g. a lone ReLU) has no optimizer
            # clip=False: the stages clip together, with the norm over all of them
            self.opts.append([task.make_optimizer(st.parameters(), clip=False)
                              if st.parameters() else None for st in stages])
        self.worlds, self.averagers = [], [[] for _ in range(lay.dp)]
        self.piece_groups = [[[] for _ in range(lay.pp)] for _ in range(lay.dp)]
        if lay.dp > 1:
            self._build_averagers()

    def _build_averagers(self) -> None:
        """Stage piece k of every replica forms a group (a ThreadWorld of dp ranks)."""
        for k in range(len(self.stages[0])):
            if not self.stages[0][k].parameters():
                continue
            world = ThreadWorld(self.lay.dp, 120.0, name=f"pipeline-piece{k}")
            self.worlds.append(world)
            for r in range(self.lay.dp):
                st = self.stages[r][k]
                group = ProcessGroup(world.transport(r), device=st.device)
                self.averagers[r].append(GradientAverager(st.parameters(), group))
                self.piece_groups[r][k % self.lay.pp].append(group)  # piece k: stage k % pp

    def _run(self, r, x, y):
        return self.execs[r].run(to_tensor(x, self.stages[r][0].device),
                                 to_tensor(y, self.stages[r][-1].device), self.task.loss)

    def step(self, x, y) -> float:
        dp = self.lay.dp
        if dp == 1:
            loss, store = self._run(0, x, y)
            _step_stages(self.opts[0], store, self.task.clip)
            return float(loss)
        n = len(x) // dp

        def go(group):
            r = group.rank
            try:
                loss, store = self._run(r, x[r * n:(r + 1) * n], y[r * n:(r + 1) * n])
                avg = GradientStore()
                for a in self.averagers[r]:  # the mean over the replicas, piece by piece
                    avg.merge_from(a.average(store, timeout=120.0))
                return loss, avg
            except BaseException as e:
                for w in self.worlds:  # the other replicas must not wait for this one
                    w.abort(CollectiveError(f"replica {r} failed: {e}", rank=r))
                raise

        results = spawn(go, dp, timeout=120.0)
        for r in range(dp):
            _step_stages(self.opts[r], results[r][1], self.task.clip)
        return float(np.mean([res[0] for res in results]))

    def close(self) -> None:
        for w in self.worlds:
            w.close()
        for ex in self.execs:
            ex.close()

    def predict(self, x) -> np.ndarray:
        with wr.no_grad():
            h = to_tensor(x, self.stages[0][0].device)
            for st in self.stages[0]:
                h = st(h)
            return h.numpy()

    def state_dict(self) -> dict:
        """The stages' optimizer states as one dense optimizer's, so any layout resumes it."""
        state, off, groups = {}, 0, []
        for st, o in zip(self.stages[0], self.opts[0]):
            if o is not None:
                osd = o.state_dict()
                state.update({off + int(k): v for k, v in osd["state"].items()})
                groups = osd["param_groups"]
            off += len(st.parameters())
        groups = [dict(g, params=list(range(off))) for g in groups]
        return {"model": self.master.state_dict(),
                "optimizer": {"state": state, "param_groups": groups}}

    def load_state_dict(self, sd) -> None:
        self.master.load_state_dict(sd["model"])
        for r in range(1, self.lay.dp):
            _copy_weights(self.master, self.replicas[r])
        dense = sd["optimizer"]
        for stages, opts in zip(self.stages, self.opts):
            off = 0
            for st, o in zip(stages, opts):
                n = len(st.parameters())
                if o is None:
                    continue  # parameter-free stage: n == 0, nothing to skip over
                o.load_state_dict({
                    "state": {int(k) - off: v for k, v in dense["state"].items()
                              if off <= int(k) < off + n},
                    "param_groups": [dict(g, params=list(range(n)))
                                     for g in dense["param_groups"]]})
                off += n

    def device_stats(self, seconds: float) -> list[dict]:
        rows = []
        for r, ex in enumerate(self.execs):
            tr = ex.last_trace  # None after a jit replay: no busy share
            busy = None if tr is None else [1.0 - b for b in tr.stage_bubble_fractions()]
            for s in range(self.lay.pp):
                d = self.stages[r][s].device
                row = {"device": d.index, "role": f"replica {r} stage {s}",
                       "dispatches": d.dispatches}
                if busy is not None:
                    row["busy"] = busy[s]
                if self.lay.dp > 1:  # the replicas' gradient all-reduces of this stage
                    row["comm share"] = _share(sum(g.stats()["seconds"]
                                                   for g in self.piece_groups[r][s]), seconds)
                rows.append(row)
        return rows


def _share(comm_seconds: float, seconds: float) -> float:
    """The part of the run's wall time spent in communication calls (as the gpt rows show)."""
    return min(1.0, comm_seconds / seconds) if seconds else 0.0


def _step_stages(opts, store, clip=None) -> None:
    """Clip ``store`` to one norm over all stages, then step each stage's optimizer."""
    opts = [o for o in opts if o is not None]
    if clip is not None:
        clip_grad_norm_([p for o in opts for p in o.params], clip, grads=store)
    for opt in opts:
        opt.step(store)
