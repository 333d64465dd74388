"""Training checkpoints of `wgrumus train --checkpoint DIR`: one safetensors file (state, step,
losses, what was trained; nested state as a JSON skeleton in its metadata), written atomically so
a crash mid-save leaves the previous one intact."""
from __future__ import annotations

import json
import os

from ..io import CheckpointError, join_state, load_numpy, split_state
from ..io import save as save_file
from .common import UsageError, is_main_rank

FILE = "checkpoint.safetensors"
FORMAT = "wgrumus-train-2"  # 2: the state skeleton of io.split_state
LEGACY = "wgrumus-train-1"  # (earlier releases' checkpoints resume too: _legacy_state)


def path_of(cfg) -> str:
    return os.path.join(cfg.checkpoint, FILE)


def save(cfg, task, trainer, step: int, losses) -> None:
    """Every rank gathers (collectives may be involved); rank 0 writes."""
    state = trainer.state_dict()
    if not is_main_rank():
        return
    arrays: dict = {}
    skeleton = {k: split_state(v, k, arrays) for k, v in state.items()}
    meta = {"format": FORMAT, "task": json.dumps(task.config), "step": str(step),
            "losses": json.dumps([float(v) for v in losses]), "state": json.dumps(skeleton),
            "seed": str(cfg.seed), "optimizer": cfg.optimizer,
            "layout": json.dumps({"dp": cfg.layout.dp, "tp": cfg.layout.tp,
                                  "pp": cfg.layout.pp})}
    save_file(arrays, path_of(cfg), meta)


def read(path: str):
    """(metadata, arrays) of a checkpoint file, or UsageError naming what is wrong."""
    if not os.path.exists(path):
        raise UsageError(f"--resume: no checkpoint at {path!r} (train with --checkpoint "
                         f"{os.path.dirname(path)!r} first)")
    try:
        arrays, meta = load_numpy(path)
    except (CheckpointError, OSError) as e:  # corrupt / truncated / unreadable file
        raise UsageError(f"--resume: {path!r} is not a readable checkpoint ({e})") from None
    if meta.get("format") not in (FORMAT, LEGACY):
        raise UsageError(f"--resume: {path!r} is not a wgrumus train checkpoint")
    return meta, arrays


def check(cfg, task):
    """Read and vet the checkpoint to resume before any model is built: (meta, arrays)."""
    meta, arrays = read(path_of(cfg))
    saved = json.loads(meta["task"])
    if saved != task.config:
        diff = ", ".join(f"{k}={saved.get(k)!r} (now {task.config.get(k)!r})"
                         for k in sorted(set(saved) | set(task.config))
                         if saved.get(k) != task.config.get(k))
        raise UsageError(f"--resume: the checkpoint in {cfg.checkpoint!r} is for a different "
                         f"model: {diff}")
    if meta.get("optimizer") != cfg.optimizer:
        raise UsageError(f"--resume: the checkpoint was trained with --optimizer "
                         f"{meta.get('optimizer')}, not {cfg.optimizer}")
    if int(meta.get("seed", cfg.seed)) != cfg.seed:
        raise UsageError(f"--resume: --seed {cfg.seed} differs from the checkpoint's seed "
                         f"{meta['seed']} (the seed fixes the data order)")
    return meta, arrays


def load(trainer, meta, arrays):
    """Restore the trainer from check()'s result; returns (step, losses so far)."""
    join = _legacy_state if meta["format"] == LEGACY else join_state
    trainer.load_state_dict(join(json.loads(meta["state"]), arrays))
    return int(meta["step"]), [float(v) for v in json.loads(meta["losses"])]


def _legacy_state(skel, arrays):
    """A format-1 skeleton (__dict__ pairs, __list__, __array__) with its arrays put back."""
    if isinstance(skel, dict):
        if "__array__" in skel:
            return arrays[skel["__array__"]]
        if "__dict__" in skel:
            return {(k["__int__"] if isinstance(k, dict) else k): _legacy_state(v, arrays)
                    for k, v in skel["__dict__"]}
        if "__list__" in skel:
            items = [_legacy_state(v, arrays) for v in skel["__list__"]]
            return tuple(items) if skel.get("tuple") else items
    return skel
