"""Checkpoints in the safetensors format (no pickle, interchangeable with PyTorch's), written
atomically and checksummed. Training checkpoints add optimizer, scheduler, RNG and data loader
state: tensors in the tensor section, the rest as JSON in ``__metadata__``.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile

import numpy as np

from .runtime import get_device
from .runtime.errors import WgrumusError
from .tensor import Tensor, tensor

FORMAT = "wgrumus-checkpoint-1"


class CheckpointError(WgrumusError):
    """A checkpoint file is missing, corrupt, or does not match what it is loaded into."""


class CheckpointWriteError(CheckpointError, OSError):
    """A checkpoint could not be written (also an OSError, for callers catching that)."""


def _temp_prefix(path: str, pid: int | None = None) -> str:
    return f".tmp-{os.path.basename(path)}-{os.getpid() if pid is None else pid}-"


def _remove_stale_temps(path: str, folder: str) -> None:
    """Delete temporaries of ``path`` whose writer (pid in the name) was killed mid-write."""
    if os.name != "posix":  # os.kill(pid, 0) probes a process only on POSIX
        return
    head = f".tmp-{os.path.basename(path)}-"
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        pid = name[len(head):].split("-", 1)[0] if name.startswith(head) else ""
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
            continue  # that writer is still running
        except ProcessLookupError:
            pass
        except (PermissionError, OSError, AttributeError):  # another user's, or no os.kill
            continue
        try:
            os.unlink(os.path.join(folder, name))
        except OSError:
            pass


def atomic_write(path, data: bytes) -> None:
    """Write ``data`` so a crash leaves the old file or the new one, never a torn one
    (temporary file, fsync, rename, fsync of the folder)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    _remove_stale_temps(path, folder)
    fd, tmp = tempfile.mkstemp(prefix=_temp_prefix(path), dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:
        dfd = os.open(folder, os.O_RDONLY)
    except OSError:  # platforms without directory fds (Windows)
        return
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _to_numpy(name, v) -> np.ndarray:
    if isinstance(v, Tensor):
        v = v.numpy()
    if isinstance(v, (np.ndarray, np.generic, int, float, bool, list)):
        a = np.asarray(v)
        return a if a.flags.c_contiguous else a.copy(order="C")  # keeps 0-d arrays 0-d
    raise CheckpointError(f"cannot save '{name}' of type {type(v).__name__}: values must be "
                          f"tensors or numpy arrays")


CHECKSUM_KEY = "wgrumus.tensors.sha256"  # metadata entry: tensors_digest of the file's tensors
OLD_CHECKSUM_KEY = "wgrumus.sha256"  # earlier files: sha256 of the whole tensor data region
SINGLE_KEY, SINGLE_NAME = "wgrumus.object", "tensor"  # a file holding one tensor, not a dict


def tensors_digest(arrays: dict) -> str:
    """sha256 over every tensor's name, dtype, shape and bytes, in name order: carried in the
    file's metadata, so a flipped bit is an error on load, not silently different weights."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(json.dumps([name, a.dtype.str, list(a.shape)]).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def verify_checksum(arrays: dict, meta: dict, path) -> None:
    """Raise CheckpointError when the recorded checksum (if any) does not match."""
    if CHECKSUM_KEY in meta:
        ok = tensors_digest(arrays) == meta[CHECKSUM_KEY]
    elif OLD_CHECKSUM_KEY in meta:  # the data region is the file's last bytes, all tensors'
        total = sum(a.nbytes for a in arrays.values())
        with open(path, "rb") as f:
            f.seek(-total, os.SEEK_END) if total else f.seek(0, os.SEEK_END)
            ok = hashlib.sha256(f.read()).hexdigest() == meta[OLD_CHECKSUM_KEY]
    else:
        return  # a file written elsewhere carries none
    if not ok:
        raise CheckpointError(f"{os.fspath(path)} is corrupt: its tensor data does not match "
                              f"the checksum written with it (damaged on disk or in transfer); "
                              f"restore it from a copy or save it again")


def _serialize(tensors: dict, metadata=None) -> bytes:
    from safetensors.numpy import save as st_save
    arrays = {}
    for k, v in tensors.items():
        if not isinstance(k, str):
            raise CheckpointError(f"state dict keys must be strings, got {k!r}")
        arrays[k] = _to_numpy(k, v)
    meta = {} if metadata is None else {str(k): str(v) for k, v in metadata.items()}
    meta[CHECKSUM_KEY] = tensors_digest(arrays)
    return st_save(arrays, metadata=meta)


def save(obj, path, metadata=None) -> None:
    """Write a tensor or a dict name -> tensor (or array); ``load`` gives back the same kind."""
    if isinstance(obj, (Tensor, np.ndarray)):
        obj, metadata = {SINGLE_NAME: obj}, {**(metadata or {}), SINGLE_KEY: SINGLE_NAME}
    elif not isinstance(obj, dict):
        raise CheckpointError(f"save takes a tensor or a dict of tensors (a state_dict), got "
                              f"{type(obj).__name__}")
    data = _serialize(obj, metadata)
    if os.path.isdir(path):
        example = os.path.join(path, "model.safetensors")
        raise CheckpointWriteError(f"cannot write checkpoint {os.fspath(path)}: it is a folder; "
                                   f"pass a file path such as {example}")
    try:
        atomic_write(path, data)
    except OSError as e:
        raise CheckpointWriteError(
            f"cannot write checkpoint {os.fspath(path)}: {e.strerror or e} "
            f"({type(e).__name__}); choose a path in a writable folder with free space") from e


def load_numpy(path) -> tuple:
    """(name -> numpy array, metadata) of a safetensors file, without a device."""
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CheckpointError(f"checkpoint {path} is a folder, not a file; pass the path of the "
                              f".safetensors file inside it")
    if not os.path.isfile(path):
        raise FileNotFoundError(f"checkpoint {path} does not exist")
    if os.path.getsize(path) < 8:
        raise CheckpointError(f"{path} is not a safetensors file: only "
                              f"{os.path.getsize(path)} bytes")
    from safetensors import SafetensorError, safe_open
    try:
        with safe_open(path, framework="np") as f:
            meta = f.metadata() or {}
            arrays = {k: f.get_tensor(k) for k in f.keys()}
    except SafetensorError as e:
        raise CheckpointError(f"{path} is not a valid safetensors file, truncated or corrupt "
                              f"({e}); restore it from a copy or save it again") from e
    verify_checksum(arrays, meta, path)
    return arrays, meta


def _device_array(a: np.ndarray, name: str = "") -> np.ndarray:
    """``a`` in a dtype tensors hold (int64 -> int32, float64 -> float32); values that would
    change (overflow, flush to 0) are an error."""
    if a.dtype.kind == "f" and a.dtype != np.float16:
        with np.errstate(over="ignore"):  # overflow is checked (and named) below
            b = a.astype(np.float32, copy=False)
        if b.dtype != a.dtype and a.size:
            bad = (np.isinf(b) & np.isfinite(a)) | ((b == 0) & (a != 0))
            if bad.any():
                i = int(np.flatnonzero(bad.reshape(-1))[0])
                raise CheckpointError(
                    f"tensor {name or '?'} ({a.dtype}) holds {a.reshape(-1)[i]!r}, outside the "
                    f"float32 range (|x| from {np.finfo(np.float32).smallest_subnormal:.1e} to "
                    f"{np.finfo(np.float32).max:.2e}); {int(bad.sum())} such values. Rescale "
                    f"them before saving, or read them with wgrumus.io.load_numpy (keeps float64)")
        return b
    if a.dtype.kind in "iub":
        if a.size and (a.max() > np.iinfo(np.int32).max or a.min() < np.iinfo(np.int32).min):
            raise CheckpointError("integer tensor values do not fit in int32")
        return a.astype(np.int32, copy=False)
    if a.dtype == np.float16:
        return a.astype(np.float32)
    raise CheckpointError(f"unsupported tensor dtype {a.dtype} in checkpoint")


def load(path, device=None):
    """name -> Tensor on ``device``, or the one Tensor ``save`` was given."""
    arrays, meta = load_numpy(path)
    dev = get_device(device)
    f16 = "shader-f16" in dev.features  # float16 stays float16 where the device holds it
    out = {k: _tensor(a if f16 and a.dtype == np.float16 else _device_array(a, k), dev)
           for k, a in arrays.items()}
    return out[SINGLE_NAME] if meta.get(SINGLE_KEY) == SINGLE_NAME else out


def _tensor(a: np.ndarray, dev) -> Tensor:
    t = tensor(a.reshape(-1), device=dev, dtype=a.dtype)
    return t.reshape(a.shape) if a.ndim != 1 else t  # 0-d arrays stay 0-d


def split_state(obj, prefix, tensors):
    """Replace tensors/arrays in a nested dict/list by {"__tensor__": key}; collect them."""
    if isinstance(obj, dict):
        return {str(k): split_state(v, f"{prefix}.{k}", tensors) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [split_state(v, f"{prefix}.{i}", tensors) for i, v in enumerate(obj)]
    if isinstance(obj, (Tensor, np.ndarray)):
        tensors[prefix] = obj
        return {"__tensor__": prefix}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise CheckpointError(f"cannot store {prefix} of type {type(obj).__name__} in a checkpoint")


def join_state(obj, arrays):
    """``split_state``'s inverse: the skeleton ``obj`` with ``arrays`` put back."""
    if isinstance(obj, dict):
        if set(obj) == {"__tensor__"}:
            return arrays[obj["__tensor__"]]
        return {k: join_state(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [join_state(v, arrays) for v in obj]
    return obj


def save_checkpoint(path, model, optimizer=None, scheduler=None, step: int = 0, extra=None,
                    data_loader=None) -> None:
    """One atomic file with everything needed to resume training bit for bit."""
    from .ops.random import get_rng_state
    tensors = {"model." + k: v for k, v in model.state_dict().items()}
    meta = {"format": FORMAT, "step": int(step), "rng": get_rng_state(),
            "extra": split_state(extra or {}, "extra", tensors)}
    for key, obj in (("optimizer", optimizer), ("scheduler", scheduler),
                     ("data_loader", data_loader)):
        if obj is not None:
            meta[key] = split_state(obj.state_dict(), key, tensors)
    save(tensors, path, {"wgrumus": json.dumps(meta)})


def load_checkpoint(path, model, optimizer=None, scheduler=None, data_loader=None,
                    restore_rng: bool = True) -> dict:
    """Restore ``save_checkpoint``'s file into the objects; returns {"step", "extra"}."""
    arrays, meta = load_numpy(path)
    if "wgrumus" not in meta:
        raise CheckpointError(f"{path} is a plain safetensors file, not a wgrumus training "
                              f"checkpoint; load weights with model.load_state_dict(wr.load(...))")
    try:
        info = json.loads(meta["wgrumus"])
    except ValueError as e:
        raise CheckpointError(f"{path} has corrupt wgrumus metadata (not JSON: {e}); the file "
                              f"was damaged or edited: use another checkpoint") from e
    if not isinstance(info, dict):
        raise CheckpointError(f"{path} has corrupt wgrumus metadata (a JSON "
                              f"{type(info).__name__}, expected an object); use another "
                              f"checkpoint")
    if info.get("format") != FORMAT:
        raise CheckpointError(f"{path} has checkpoint format {info.get('format')!r}, expected "
                              f"{FORMAT!r}")
    missing = [k for k in ("step", "rng", "extra") if k not in info]
    if missing:
        raise CheckpointError(f"{path} has incomplete wgrumus metadata (no {', '.join(missing)});"
                              f" the file was damaged or edited: use another checkpoint")
    model_sd = {k[len("model."):]: _device_array(a, k) for k, a in arrays.items()
                if k.startswith("model.")}
    model.load_state_dict(model_sd)
    for key, obj in (("optimizer", optimizer), ("scheduler", scheduler),
                     ("data_loader", data_loader)):
        if obj is not None:
            if key not in info:
                raise CheckpointError(f"{path} holds no {key.replace('_', ' ')} state")
            obj.load_state_dict(join_state(info[key], arrays))
    if restore_rng:
        from .ops.random import set_rng_state
        set_rng_state(info["rng"])
    return {"step": info["step"], "extra": join_state(info["extra"], arrays)}
