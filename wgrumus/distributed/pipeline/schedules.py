"""Pipeline schedules as plain data: for ``p`` stages and ``m`` micro-batches, the ordered list of
actions of every stage.

Each builder returns a :class:`Schedule` (``sched[s]`` is stage ``s``'s tuple of
:class:`Action`), which tests can print and compare, :func:`validate` can check, :func:`simulate`
can time and :func:`render` can draw. The executor follows the list exactly, so what is printed
is what runs.

The original design labelled its executor "1F1B" but ran every forward before any backward
(GPipe order), keeping all ``m`` micro-batches' activations alive. Here the two are separate
schedules, and :func:`one_f_one_b` really interleaves: stage ``s`` keeps at most
``min(p - s, m)`` micro-batches in flight.

Summary under the timing model of :mod:`.timeline` (per-action times f, b = bi + bw, no
communication cost; every number below is exact and checked by the tests):

===========  =============================  ================================  ==================
schedule     bubble fraction                peak in flight on stage s         requirements
===========  =============================  ================================  ==================
gpipe        (p-1)/(m+p-1), any f, b        m                                 p, m >= 1
1f1b         (p-1)/(m+p-1), any f, b        min(p-s, m)                       p, m >= 1
interleaved  (p-1)/(v*m+p-1), any f, b      min(2(p-1-s) + (v-1)p + 1, v*m)   m % p == 0, v >= 2
zb-h1        (p-1)/(3m+p-1) if f = bi = bw  min(p, m)                         p, m >= 1
             and m >= p
===========  =============================  ================================  ==================

For interleaved, "in flight" counts (micro-batch, chunk) pairs, each holding the activations of
1/v of the stage's layers.
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

__all__ = ["gpipe", "one_f_one_b", "interleaved", "zb_h1", "get_schedule", "SCHEDULES"]


def _check_sizes(name: str, p: int, m: int) -> None:
    for label, value in (("number of stages p", p), ("number of micro-batches m", m)):
        if not isinstance(value, int) or isinstance(value, bool):
            raise ScheduleError(f"{name}: {label} must be an int, got {value!r}")
        if value < 1:
            raise ScheduleError(f"{name}: {label} must be >= 1, got {value}")


def _build(name: str, p: int, m: int, v: int, stages: list[list[Action]]) -> Schedule:
    return Schedule(name, p, m, v, tuple(tuple(acts) for acts in stages))


def gpipe(p: int, m: int) -> Schedule:
    """GPipe: every stage runs all ``m`` forwards, then all ``m`` backwards (in micro-batch order).

    Simple and correct, but each stage holds the activations of all ``m`` micro-batches at once.
    """
    _check_sizes("gpipe", p, m)
    stage = [Action(FORWARD, i) for i in range(m)] + [Action(BACKWARD, i) for i in range(m)]
    return _build("gpipe", p, m, 1, [list(stage) for _ in range(p)])


def one_f_one_b(p: int, m: int) -> Schedule:
    """1F1B (PipeDream-Flush): warm-up, steady one-forward-one-backward, cool-down.

    Stage ``s`` first runs ``w = min(p - 1 - s, m)`` warm-up forwards -- exactly enough that the
    first backward can come back to it without idling the stages behind it -- then alternates
    ``F(w + i), B(i)`` for the remaining ``m - w`` micro-batches, then runs the last ``w``
    backwards. It has the same bubble as GPipe, but stage ``s`` holds at most ``min(p - s, m)``
    activations instead of ``m``.
    """
    _check_sizes("1f1b", p, m)
    stages = [_one_f_one_b_order(min(p - 1 - s, m), m, lambda i: Action(FORWARD, i),
                                 lambda i: Action(BACKWARD, i)) for s in range(p)]
    return _build("1f1b", p, m, 1, stages)


def _one_f_one_b_order(warmup: int, total: int, forward, backward) -> list[Action]:
    """``warmup`` forwards, then alternate ``forward(warmup + k), backward(k)``, then the last
    ``warmup`` backwards: the order shared by 1F1B and interleaved 1F1B, which differ only in
    the warm-up count and in what the k-th forward and backward step are."""
    acts = [forward(k) for k in range(warmup)]
    for k in range(total - warmup):
        acts += [forward(warmup + k), backward(k)]
    acts += [backward(k) for k in range(total - warmup, total)]
    return acts


def interleaved(p: int, m: int, v: int = 2) -> Schedule:
    """Megatron-LM's interleaved 1F1B with ``v`` model chunks per stage.

    The model is cut into ``p * v`` pieces; stage ``s`` holds chunks ``s, s + p, s + 2p, ...``
    (virtual stage ``c * p + s`` is chunk ``c`` of stage ``s``). Micro-batches move through the
    stage in groups of ``p``: forward step ``k`` of a stage is micro-batch
    ``(k // (p*v)) * p + k % p`` on chunk ``(k // p) % v``; backward steps use the same order with
    the chunks reversed. Stage ``s`` warms up with ``min((p - 1 - s) * 2 + (v - 1) * p, m * v)``
    forwards, then alternates one forward and one backward, then cools down.

    Requirements (checked, with a ``ValueError``):

    * ``v >= 2`` -- with one chunk use :func:`one_f_one_b`;
    * ``m`` divisible by ``p`` -- micro-batches are issued in groups of ``p``, one per stage, so
      that each group's chunk-0 forward reaches the last stage just as the group's chunk-1 forward
      is due on stage 0; a partial group would leave the order (and Megatron's warm-up count)
      wrong.

    The bubble fraction is ``(p-1)/(v*m+p-1)`` (for any ratio of backward to forward time):
    the ``p - 1`` fill-and-drain steps now last one chunk (``1/v`` of a stage) each. The price is
    ``v`` times more messages and a deeper warm-up: stage ``s`` holds up to
    ``min(2(p-1-s) + (v-1)p + 1, v*m)`` (micro-batch, chunk) activations, each ``1/v`` of a stage.
    """
    _check_sizes("interleaved", p, m)
    if not isinstance(v, int) or isinstance(v, bool) or v < 2:
        raise ScheduleError(
            f"interleaved: needs v >= 2 model chunks per stage, got v={v!r} "
            f"(with one chunk per stage use the '1f1b' schedule)"
        )
    if m % p:
        lower = m - m % p
        options = f"m={lower} or m={lower + p}" if lower else f"m={p}"
        raise ScheduleError(
            f"interleaved: the number of micro-batches m={m} must be a multiple of the number of "
            f"stages p={p} (micro-batches are issued in groups of p); use e.g. {options}"
        )
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
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): 1F1B with a split backward.

    The backward is split into ``BI`` (gradient w.r.t. the stage input: the previous stage waits
    for it) and ``BW`` (gradient w.r.t. the weights: nobody waits for it). The order is 1F1B's --
    same warm-up of ``min(p - 1 - s, m)`` forwards -- with ``BI`` in place of ``B``, and stage ``s``
    postpones each ``BW`` by ``s`` steps: after ``BI(i)`` it runs ``BW(i - s)``; the postponed
    ``BW`` s fill the idle slots of the cool-down. Postponing by ``s`` keeps at most ``p``
    micro-batches' activations on every stage (a micro-batch is released only by its ``BW``),
    which is the peak of 1F1B's stage 0, so ZB-H1 costs no extra peak memory.

    Bubble: with ``m >= p`` and ``bw <= min(f, bi)`` every stage idles exactly
    ``(p-1) * (f + bi - bw)`` -- the first input gradient travelling back up the pipeline --
    against ``(p-1) * (f + b)`` for 1F1B; with ``f = bi = bw`` that is a third, and the bubble
    fraction is ``(p-1)/(3m+p-1)``. With ``m < p`` there are too few ``BW`` s to fill the gaps.
    """
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

_ALIASES = {"one_f_one_b": "1f1b", "zb_h1": "zb-h1", "zbh1": "zb-h1",
            "interleaved_1f1b": "interleaved"}


def get_schedule(name: str, p: int, m: int, **kwargs) -> Schedule:
    """Build the schedule called ``name`` ("gpipe" | "1f1b" | "interleaved" | "zb-h1").

    ``kwargs`` go to the builder (``v=`` for "interleaved"). Unknown names, unknown keyword
    arguments and invalid ``(p, m)`` raise ``ValueError`` with the reason. The result is
    validated before it is returned.
    """
    if not isinstance(name, str):
        raise ScheduleError(f"schedule name must be a string, got {name!r}")
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in SCHEDULES:
        raise ScheduleError(f"unknown pipeline schedule {name!r}; choose one of "
                            f"{sorted(SCHEDULES)}")
    builder = SCHEDULES[key]
    allowed = {"interleaved": {"v"}}.get(key, set())
    unknown = set(kwargs) - allowed
    if unknown:
        raise ScheduleError(
            f"schedule {key!r} takes no argument(s) {sorted(unknown)}"
            + (f"; it accepts {sorted(allowed)}" if allowed else "")
        )
    sched = builder(p, m, **kwargs)
    validate(sched)
    return sched
