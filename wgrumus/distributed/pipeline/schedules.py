"""Pipeline schedules as plain data (``sched[s]``: stage ``s``'s actions), so what a test prints
is what the executor runs.

Under the timing model of :mod:`.timeline` (f, b = bi + bw, free communication; checked by tests):

===========  =============================  ================================  ==================
schedule     bubble fraction                peak in flight on stage s         requirements
===========  =============================  ================================  ==================
gpipe        (p-1)/(m+p-1), any f, b        m                                 p, m >= 1
1f1b         (p-1)/(m+p-1), any f, b        min(p-s, m)                       p, m >= 1
interleaved  (p-1)/(v*m+p-1), any f, b      min(2(p-1-s) + (v-1)p + 1, v*m)   m % p == 0, v >= 2
zb-h1        (p-1)/(3m+p-1) if f = bi = bw  min(p, m)                         p, m >= 1
             and m >= p
===========  =============================  ================================  ==================
"""
from __future__ import annotations

from collections.abc import Callable

from .actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    ScheduleError,
)
from .timeline import validate


def _check_sizes(name: str, p: int, m: int) -> None:
    for label, value in (("number of stages p", p), ("number of micro-batches m", m)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScheduleError(f"{name}: {label} must be an int, got {value!r}")
        if value < 1:
            raise ScheduleError(f"{name}: {label} must be >= 1, got {value}")


def _build(name: str, p: int, m: int, v: int, stages: list[list[Action]]) -> Schedule:
    return Schedule(name, p, m, v, tuple(tuple(acts) for acts in stages))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: all ``m`` forwards, then all ``m`` backwards (holds all ``m`` activations)."""
    _check_sizes("gpipe", p, m)
    stage = [Action(FORWARD, i) for i in range(m)] + [Action(BACKWARD, i) for i in range(m)]
    return _build("gpipe", p, m, 1, [list(stage) for _ in range(p)])


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush): ``min(p - 1 - s, m)`` warm-up forwards (just enough that the first
    backward reaches stage ``s`` without idling it), then F/B alternating: GPipe's bubble with at
    most ``min(p - s, m)`` activations held."""
    _check_sizes("1f1b", p, m)
    stages = [_one_f_one_b_order(min(p - 1 - s, m), m, lambda i: Action(FORWARD, i),
                                 lambda i: Action(BACKWARD, i)) for s in range(p)]
    return _build("1f1b", p, m, 1, stages)


def _one_f_one_b_order(warmup: int, total: int, forward, backward) -> list[Action]:
    """The order 1F1B and interleaved 1F1B share: warm-up forwards, F/B pairs, cool-down."""
    acts = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        acts += [forward(warmup + k), backward(k)]
    acts += [backward(k) for k in range(total - warmup, total)]
    return acts


def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B: stage ``s`` holds chunks ``s, s + p, ...`` of the ``p * v``
    pieces, so fill and drain last one chunk each. Micro-batches go in groups of ``p`` (hence
    ``m % p == 0``: each group's chunk-0 forward reaches the last stage as its chunk-1 forward is
    due on stage 0); backward steps take the forward order with the chunks reversed."""
    _check_sizes("interleaved", p, m)
    if not isinstance(v, int) or isinstance(v, bool) or v < 2:
        raise ScheduleError(f"interleaved: needs v >= 2 model chunks per stage, got v={v!r} "
                            f"(with one chunk per stage use the '1f1b' schedule)")
    if m % p:
        lower = m - m % p
        options = f"m={lower} or m={lower + p}" if lower else f"m={p}"
        raise ScheduleError(f"interleaved: the number of micro-batches m={m} must be a multiple "
                            f"of the number of stages p={p} (micro-batches are issued in groups "
                            f"of p); use e.g. {options}")
    total = m * v

    def forward_step(k: int) -> Action:
        group, within = divmod(k, p * v)
        return Action(FORWARD, group * p + within % p, within // p)

    def backward_step(k: int) -> Action:
        group, within = divmod(k, p * v)
        return Action(BACKWARD, group * p + within % p, v - 1 - within // p)

    stages = [_one_f_one_b_order(min((p - 1 - s) * 2 + (v - 1) * p, total), total,
                                 forward_step, backward_step) for s in range(p)]
    return _build("interleaved", p, m, v, stages)


def zb_h1(p: int, m: int) -> Schedule:
    """ZB-H1 (Qi et al. 2023): 1F1B with ``BI`` (input gradient, which the previous stage waits
    for) in place of ``B``, and each ``BW`` (weight gradient, which nobody waits for) postponed by
    ``s`` steps into the cool-down's idle slots; that keeps at most ``p`` activations per stage,
    1F1B's peak."""
    _check_sizes("zb-h1", p, m)
    stages = []
    for s in range(p):
        w = min(p - 1 - s, m)
        acts = [Action(FORWARD, i) for i in range(w)]
        next_w = 0  # next micro-batch whose BW is still owed

        def backward(i: int, acts=acts, s=s) -> None:  # this stage's list and index
            nonlocal next_w
            acts.append(Action(BACKWARD_INPUT, i))
            if i - s >= next_w:
                acts.append(Action(BACKWARD_WEIGHT, next_w))
                next_w += 1

        for i in range(m - w):
            acts.append(Action(FORWARD, w + i))
            backward(i)
        for i in range(m - w, m):
            backward(i)
        acts += [Action(BACKWARD_WEIGHT, j) for j in range(next_w, m)]
        stages.append(acts)
    return _build("zb-h1", p, m, 1, stages)


SCHEDULES: dict[str, Callable[..., Schedule]] = {"gpipe": gpipe, "1f1b": one_f_one_b,
                                                  "interleaved": interleaved, "zb-h1": zb_h1}

_ALIASES = {"one-f-one-b": "1f1b", "zbh1": "zb-h1", "interleaved-1f1b": "interleaved"}


def schedule_key(name: str) -> str:
    """The SCHEDULES key of ``name`` (case, ``_`` for ``-`` and the aliases accepted)."""
    key = name.strip().lower().replace("_", "-")
    return _ALIASES.get(key, key)


def get_schedule(name: str, p: int, m: int, **kwargs) -> Schedule:
    """The validated schedule ``name`` ("gpipe" | "1f1b" | "interleaved" | "zb-h1"); ``kwargs``
    go to the builder (``v=`` for "interleaved")."""
    if not isinstance(name, str):
        raise ScheduleError(f"schedule name must be a string, got {name!r}")
    key = schedule_key(name)
    if key not in SCHEDULES:
        raise ScheduleError(f"unknown pipeline schedule {name!r}; choose one of "
                            f"{sorted(SCHEDULES)}")
    builder = SCHEDULES[key]
    allowed = {"interleaved": {"v"}}.get(key, set())
    unknown = set(kwargs) - allowed
    if unknown:
        raise ScheduleError(f"schedule {key!r} takes no argument(s) {sorted(unknown)}"
                            + (f"; it accepts {sorted(allowed)}" if allowed else ""))
    sched = builder(p, m, **kwargs)
    validate(sched)
    return sched
