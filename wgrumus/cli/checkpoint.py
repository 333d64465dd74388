"""Training checkpoints of `wgrumus train --checkpoint DIR`: one safetensors file holding the
model and optimizer state, the step, the loss history and what was trained (model, sizes,
seed), written atomically (temporary file, fsync, rename), so a crash or Ctrl-C mid-save leaves
the previous checkpoint intact.

Nested state (optimizer state dicts) is flattened to arrays plus a JSON skeleton stored in the
file's metadata, so any state the trainer returns round-trips."""
from __future__ import annotations

import json
import os

import numpy as np

from .common import UsageError, is_main_rank

FILE = "checkpoint.safetensors"
FORMAT = "wgrumus-train-1"


def path_of(cfg) -> str:
    return os.path.join(cfg.checkpoint, FILE)


def flatten(obj, arrays: dict, prefix: str = ""):
    """JSON skeleton of ``obj``; tensors and arrays go to ``arrays`` under dotted names."""
    if isinstance(obj, dict):
        return {"__dict__": [[k if isinstance(k, str) else {"__int__": k},
                              flatten(v, arrays, f"{prefix}.{k}" if prefix else str(k))]
                             for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"__list__": [flatten(v, arrays, f"{prefix}.{i}") for i, v in enumerate(obj)],
                "tuple": isinstance(obj, tuple)}
    if hasattr(obj, "numpy") and callable(obj.numpy):
        obj = obj.numpy()
    if isinstance(obj, np.ndarray):
        arrays[prefix] = np.ascontiguousarray(obj)
        return {"__array__": prefix}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot checkpoint {prefix}: {type(obj).__name__}")


def unflatten(skel, arrays: dict):
    if isinstance(skel, dict):
        if "__array__" in skel:
            return arrays[skel["__array__"]]
        if "__dict__" in skel:
            return {(k["__int__"] if isinstance(k, dict) else k): unflatten(v, arrays)
                    for k, v in skel["__dict__"]}
        if "__list__" in skel:
            items = [unflatten(v, arrays) for v in skel["__list__"]]
            return tuple(items) if skel.get("tuple") else items
    return skel


def save(cfg, task, trainer, step: int, losses) -> None:
    """Every rank gathers (collectives may be involved); rank 0 writes."""
    from safetensors.numpy import save as st_save

    from ..io import atomic_write, with_checksum
    state = trainer.state_dict()
    if not is_main_rank():
        return
    arrays: dict = {}
    skeleton = flatten(state, arrays)
    meta = {"format": FORMAT, "task": json.dumps(task.config), "step": str(step),
            "losses": json.dumps([float(v) for v in losses]), "state": json.dumps(skeleton),
            "seed": str(cfg.seed), "optimizer": cfg.optimizer,
            "layout": json.dumps({"dp": cfg.layout.dp, "tp": cfg.layout.tp,
                                  "pp": cfg.layout.pp})}
    atomic_write(path_of(cfg), with_checksum(st_save(arrays, metadata=meta)))


def read(path: str):
    """(metadata, arrays) of a checkpoint file, or UsageError naming what is wrong."""
    from safetensors import safe_open

    from ..io import verify_checksum
    if not os.path.exists(path):
        raise UsageError(f"--resume: no checkpoint at {path!r} (train with --checkpoint "
                         f"{os.path.dirname(path)!r} first)")
    try:
        with open(path, "rb") as f:
            verify_checksum(f.read(), path)
        with safe_open(path, "numpy") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except Exception as e:  # corrupt header / truncated file
        raise UsageError(f"--resume: {path!r} is not a readable checkpoint ({e})") from None
    if meta.get("format") != FORMAT:
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
    trainer.load_state_dict(unflatten(json.loads(meta["state"]), arrays))
    return int(meta["step"]), [float(v) for v in json.loads(meta["losses"])]
