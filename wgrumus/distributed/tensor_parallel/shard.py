"""Dense weights <-> tensor-parallel shards (numpy): column splits rows of [out, in] and the bias,
row splits columns and keeps the bias, vocab splits rows, and a fused QKV [3E, E] splits by heads
(rank r: the q, k and v rows of its heads)."""
from __future__ import annotations

import numpy as np

from ...runtime.errors import ShapeError

COLUMN, ROW, QKV, VOCAB, REPLICATE = "column", "row", "qkv", "vocab", "replicate"
MODES = (COLUMN, ROW, QKV, VOCAB, REPLICATE)


def part_size(n: int, world: int, what: str) -> int:
    """``n / world``: each rank's equal part of ``what``, or ShapeError when it does not split."""
    if n % world:
        raise ShapeError(f"{what} of size {n} cannot be split evenly across {world} tensor-"
                         f"parallel ranks; choose a tp that divides {n}")
    return n // world


def check_heads(num_heads: int, world: int) -> int:
    """Heads per rank: attention is split by whole heads, so ``world`` must divide them."""
    if num_heads % world:
        raise ShapeError(f"{num_heads} attention heads cannot be split across {world} "
                         f"tensor-parallel ranks; choose tp dividing the number of heads")
    return num_heads // world


def split(arr: np.ndarray, world: int, rank: int, axis: int) -> np.ndarray:
    """Rank ``rank``'s equal part of ``arr`` along ``axis``."""
    k = part_size(arr.shape[axis], world, f"axis {axis} of {arr.shape}")
    return np.ascontiguousarray(np.take(arr, range(rank * k, (rank + 1) * k), axis=axis))


def qkv_index(num_heads: int, head_dim: int, world: int, rank: int) -> np.ndarray:
    """Rows of the fused [3E, E] projection that rank ``rank`` holds, in shard order."""
    h = num_heads // world
    e = num_heads * head_dim
    mine = np.arange(rank * h * head_dim, (rank + 1) * h * head_dim)
    return np.concatenate([mine, e + mine, 2 * e + mine])


def shard_array(arr, mode: str, world: int, rank: int, *, is_bias=False, num_heads=None):
    """This rank's shard of one dense parameter under ``mode``."""
    arr = np.asarray(arr)
    if mode == REPLICATE or (mode == ROW and is_bias):
        return arr.copy()
    if mode in (COLUMN, VOCAB):
        return split(arr, world, rank, 0)
    if mode == ROW:
        return split(arr, world, rank, arr.ndim - 1)
    if mode == QKV:
        if num_heads is None:
            raise ValueError("qkv sharding needs num_heads")
        check_heads(num_heads, world)
        e = arr.shape[0] // 3
        return np.ascontiguousarray(arr[qkv_index(num_heads, e // num_heads, world, rank)])
    raise ValueError(f"unknown shard mode {mode!r}; use one of {MODES}")


def unshard_arrays(shards, mode: str, *, is_bias=False, num_heads=None) -> np.ndarray:
    """The dense parameter from every rank's shard (in TP-rank order)."""
    shards = [np.asarray(s) for s in shards]
    world = len(shards)
    if mode == REPLICATE or (mode == ROW and is_bias):
        return shards[0].copy()
    if mode in (COLUMN, VOCAB):
        return np.concatenate(shards, 0)
    if mode == ROW:
        return np.concatenate(shards, shards[0].ndim - 1)
    if mode == QKV:
        rows = shards[0].shape[0] * world
        out = np.empty((rows,) + shards[0].shape[1:], shards[0].dtype)
        e = rows // 3
        for r, s in enumerate(shards):
            out[qkv_index(num_heads, e // num_heads, world, r)] = s
        return out
    raise ValueError(f"unknown shard mode {mode!r}; use one of {MODES}")


def shard_state_dict(state: dict, plan: dict, world: int, rank: int, num_heads=None) -> dict:
    """Shard a dense state dict: ``plan`` maps parameter name -> mode (default replicate)."""
    return {name: shard_array(np.asarray(arr), plan.get(name, REPLICATE), world, rank,
                              is_bias=name.endswith("bias"), num_heads=num_heads)
            for name, arr in state.items()}


def unshard_state_dicts(states: list, plan: dict, num_heads=None) -> dict:
    """Merge every TP rank's state dict (rank order) into the dense one."""
    return {name: unshard_arrays([s[name] for s in states], plan.get(name, REPLICATE),
                                 is_bias=name.endswith("bias"), num_heads=num_heads)
            for name in states[0]}
