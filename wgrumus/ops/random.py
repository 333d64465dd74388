"""Seeded random numbers generated on the device (counter-based hash, see common.wgsl).

With ``seed=None`` each call takes the next seed of a process-wide generator whose state
(``get_rng_state`` / ``set_rng_state``) goes into training checkpoints.
"""
from __future__ import annotations

import threading

from ..runtime.capture import refuse

_lock = threading.Lock()
_state = {"seed": 0, "calls": 0}


def manual_seed(seed: int) -> None:
    with _lock:
        _state["seed"], _state["calls"] = int(seed) & 0xFFFFFFFF, 0


def get_rng_state() -> dict:
    with _lock:
        return dict(_state)


def set_rng_state(state: dict) -> None:
    with _lock:
        _state["seed"], _state["calls"] = int(state["seed"]), int(state["calls"])


def next_seed(seed=None) -> int:
    """The explicit seed, or the next one from the global generator."""
    if seed is not None:
        return int(seed) & 0xFFFFFFFF
    refuse("a random op drawing from the global generator (dropout, rand, randn, init)",
           "every replay would reuse the seed drawn at capture (the same mask each step); pass "
           "an explicit seed= or keep the random op out of the jitted function")
    with _lock:
        k = _state["calls"]
        _state["calls"] += 1
        x = (_state["seed"] * 0x9E3779B1 + k * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    return x ^ (x >> 12)
