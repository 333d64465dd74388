"""Seeded random numbers generated on the device (counter-based hash, see common.wgsl).

With ``seed=None`` each call takes the next seed of a generator (its state goes into
checkpoints). A thread that seeds gets a generator of its own (``distributed.spawn`` gives each
rank thread a copy), so thread ranks draw what process ranks would, whatever the scheduling.
"""
from __future__ import annotations

import threading

from ..runtime.capture import refuse


class _Generator:
    __slots__ = ("seed", "calls", "lock")

    def __init__(self, seed: int = 0, calls: int = 0):
        self.seed, self.calls, self.lock = seed, calls, threading.Lock()

    def state(self) -> dict:
        with self.lock:
            return {"seed": self.seed, "calls": self.calls}


_process = _Generator()
_local = threading.local()


def _current(own: bool = False) -> _Generator:
    """This thread's generator; ``own``: create one for a thread other than the main thread
    that has none yet (it is about to seed)."""
    gen = getattr(_local, "gen", None)
    if gen is None:
        if not own or threading.current_thread() is threading.main_thread():
            return _process
        gen = _local.gen = _Generator()
    return gen


def use_thread_generator(state: dict | None = None) -> None:
    """Give the calling thread its own generator, starting from ``state`` (a
    ``get_rng_state()`` taken elsewhere, e.g. by the thread that starts this one)."""
    st = state if state is not None else _process.state()
    _local.gen = _Generator(int(st["seed"]), int(st["calls"]))


def manual_seed(seed: int) -> None:
    gen = _current(own=True)
    with gen.lock:
        gen.seed, gen.calls = int(seed) & 0xFFFFFFFF, 0


def get_rng_state() -> dict:
    return _current().state()


def set_rng_state(state: dict) -> None:
    gen = _current(own=True)
    with gen.lock:
        gen.seed, gen.calls = int(state["seed"]), int(state["calls"])


def next_seed(seed=None) -> int:
    """The explicit seed, or the next one from this thread's generator."""
    if seed is not None:
        return int(seed) & 0xFFFFFFFF
    refuse("a random op drawing from the global generator (dropout, rand, randn, init)",
           "every replay would reuse the seed drawn at capture (the same mask each step); pass "
           "an explicit seed= or keep the random op out of the jitted function")
    gen = _current()
    with gen.lock:
        k = gen.calls
        gen.calls += 1
        x = (gen.seed * 0x9E3779B1 + k * 0x85EBCA77 + 0x165667B1) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x2C1B3C6D) & 0xFFFFFFFF
    return x ^ (x >> 12)
