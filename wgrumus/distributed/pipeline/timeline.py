"""Validate, simulate and draw pipeline schedules before anything runs.

Dependencies (those the interpreter obeys; SEND/RECV follow from them), with chunk ``c`` on stage
``s`` as virtual stage ``c * p + s``:

* ``F(mb)`` on virtual stage ``k > 0`` needs ``F(mb)`` on virtual stage ``k - 1`` (its activation).
* ``B(mb)`` / ``BI(mb)`` on virtual stage ``k`` needs its own ``F(mb)`` (the saved activations) and,
  unless ``k`` is the last virtual stage (where the loss is), the input gradient of ``mb`` from
  virtual stage ``k + 1`` -- produced by ``B`` or ``BI`` there.
* ``BW(mb)`` needs ``BI(mb)`` of the same (stage, chunk); nothing waits for ``BW``.

Timing model of :func:`simulate` (exact): each stage runs its list in order, starting an action
once the previous one and its dependencies (``+ comm_time`` across stages) are done; sends never
block. Bubble fraction of a stage: ``(makespan - busy) / makespan``; peak in-flight: the most
(micro-batch, chunk) activations alive along the stage's list (order only).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from fractions import Fraction

from .actions import (
    BACKWARD,
    BACKWARD_INPUT,
    BACKWARD_WEIGHT,
    FORWARD,
    Action,
    Schedule,
    ScheduleError,
    StageActions,
    make_schedule,
)

ScheduleLike = Schedule | Iterable[StageActions]
_MAX_PROBLEMS = 12


@dataclass(frozen=True)
class Slot:
    """One action placed on the time axis of its stage."""
    action: Action
    start: float
    end: float

    def __repr__(self) -> str:
        return f"{self.action!r}@[{self.start:g},{self.end:g})"


@dataclass(frozen=True)
class SimResult:
    """Outcome of :func:`simulate`; see the module docstring for the exact definitions."""
    schedule: Schedule
    timelines: tuple[tuple[Slot, ...], ...]
    makespan: float
    busy: tuple[float, ...]
    stage_bubble_fractions: tuple[float, ...]
    bubble_fraction: float
    peak_in_flight: tuple[int, ...]
    f_time: float
    b_time: float
    bi_time: float
    bw_time: float
    comm_time: float

    def idle(self, stage: int) -> float:
        return self.makespan - self.busy[stage]


def validate(schedule: ScheduleLike, num_microbatches: int | None = None,
             num_chunks: int | None = None) -> Schedule:
    """``schedule`` (also raw lists of Actions or strings like ``"F0"``) as a :class:`Schedule`,
    or a ScheduleError listing every problem: per stage, each (micro-batch, chunk) needs one F
    and one B (or BI then BW) after it; across stages, a deadlock is reported with its cycle."""
    full = make_schedule(schedule, num_microbatches, num_chunks)
    sched = full.compute()  # communication (add_send_recv) follows from the compute actions
    problems = _static_problems(sched)
    if problems:
        raise ScheduleError(_format_problems(sched, problems))
    _execute(sched, {FORWARD: 1, BACKWARD: 1, BACKWARD_INPUT: 0.5, BACKWARD_WEIGHT: 0.5}, 0)
    return full


def _format_problems(sched: Schedule, problems: list[str]) -> str:
    head = (f"invalid pipeline schedule {sched.name!r} (p={sched.num_stages}, "
            f"m={sched.num_microbatches}")
    head += f", v={sched.num_chunks})" if sched.num_chunks > 1 else ")"
    shown = problems[:_MAX_PROBLEMS]
    more = len(problems) - len(shown)
    tail = [f"... and {more} more problem(s)"] if more > 0 else []
    return head + ":\n  " + "\n  ".join(shown + tail)


def _static_problems(sched: Schedule) -> list[str]:
    """Problems visible in each stage's list alone, each naming the stage and the action."""
    m, v = sched.num_microbatches, sched.num_chunks
    if m < 1:
        return ["the schedule has no micro-batches (m must be >= 1)"]
    if v < 1:
        return ["the number of model chunks per stage must be >= 1"]
    problems: list[str] = []
    for s, acts in enumerate(sched):
        bad_range = _range_problems(s, acts, m, v)
        if bad_range:  # the checks below would only repeat these
            problems += bad_range
            continue
        counts = Counter(acts)
        for a, n in sorted(counts.items(), key=lambda kv: (kv[0].chunk, kv[0].mb, kv[0].kind)):
            if n > 1:
                problems.append(f"stage {s}: {a!r} appears {n} times (expected exactly once)")
        pos = {a: i for i, a in reversed(list(enumerate(acts)))}  # first occurrence
        for c in range(v):
            for mb in range(m):
                problems += _micro_batch_problems(s, pos, mb, c, v)
    return problems


def _range_problems(s: int, acts, m: int, v: int) -> list[str]:
    problems = []
    for i, a in enumerate(acts):
        if a.mb >= m:
            problems.append(f"stage {s}: {a!r} (position {i}) refers to micro-batch {a.mb}, "
                            f"but there are only m={m} micro-batches (0..{m - 1})")
        if a.chunk >= v:
            problems.append(f"stage {s}: {a!r} (position {i}) refers to chunk {a.chunk}, "
                            f"but there are only v={v} chunk(s) per stage")
    return problems


def _micro_batch_problems(s: int, pos: dict, mb: int, c: int, v: int) -> list[str]:
    """What is missing, doubled or out of order for micro-batch ``mb`` of chunk ``c`` on stage
    ``s`` (``pos``: action -> first position in the stage's list)."""
    f, b, bi, bw = (Action(k, mb, c) for k in (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT))
    no_backward = b not in pos and bi not in pos and bw not in pos
    if f not in pos and no_backward:
        return [f"stage {s}: missing micro-batch {mb}" + (f" chunk {c}" if v > 1 else "")
                + f" (no {f!r} and no backward)"]
    problems = []
    if f not in pos:
        problems.append(f"stage {s}: missing {f!r}")
    if b in pos and (bi in pos or bw in pos):
        split = " and ".join(repr(x) for x in (bi, bw) if x in pos)
        problems.append(f"stage {s}: micro-batch {mb} has both a full backward {b!r} and "
                        f"{split}; use either B or the BI+BW pair")
    elif no_backward:
        problems.append(f"stage {s}: missing backward for {f!r} (need {b!r}, or {bi!r} and "
                        f"{bw!r})")
    elif b not in pos and (bi in pos) != (bw in pos):
        have, lack = (bi, bw) if bi in pos else (bw, bi)
        problems.append(f"stage {s}: {have!r} without {lack!r}")
    for back in (b, bi):
        if back in pos and f in pos and pos[back] < pos[f]:
            problems.append(f"stage {s}: {back!r} (position {pos[back]}) comes before its "
                            f"forward {f!r} (position {pos[f]})")
    if bw in pos and bi in pos and pos[bw] < pos[bi]:
        problems.append(f"stage {s}: {bw!r} (position {pos[bw]}) comes before {bi!r} "
                        f"(position {pos[bi]}); the weight gradient needs the input-gradient pass")
    return problems


def _needs(sched: Schedule, stage: int, a: Action) -> list[tuple[tuple, str]]:
    """Completion keys ``a`` waits for, each with a human description of who produces it."""
    k = sched.virtual_stage(stage, a.chunk)
    last = sched.num_virtual_stages - 1

    def name(kind: str, vs: int) -> str:
        return repr(Action(kind, a.mb, sched.locate(vs)[1]))

    if a.kind == FORWARD:
        return [(("F", a.mb, k - 1), f"{name(FORWARD, k - 1)} on {sched.where(k - 1)}")] \
            if k > 0 else []
    if a.kind == BACKWARD_WEIGHT:
        return [(("G", a.mb, k), f"{name(BACKWARD_INPUT, k)} on {sched.where(k)}")]
    needs = [(("F", a.mb, k), f"{name(FORWARD, k)} on {sched.where(k)}")]
    if k < last:
        nxt = f"{name(BACKWARD, k + 1)}/{name(BACKWARD_INPUT, k + 1)}"
        needs.append((("G", a.mb, k + 1), f"{nxt} on {sched.where(k + 1)}"))
    return needs


def _produces(sched: Schedule, stage: int, a: Action) -> list[tuple]:
    k = sched.virtual_stage(stage, a.chunk)
    return {FORWARD: [("F", a.mb, k)], BACKWARD: [("G", a.mb, k), ("W", a.mb, k)],
            BACKWARD_INPUT: [("G", a.mb, k)], BACKWARD_WEIGHT: [("W", a.mb, k)]}[a.kind]


def _execute(sched: Schedule, durations: dict, comm_time: float) -> list[list[Slot]]:
    """List-schedule every stage in order (as early as possible); raise on deadlock."""
    p = sched.num_stages
    done: dict[tuple, tuple[float, int]] = {}
    ptr = [0] * p
    free = [0.0] * p
    timelines: list[list[Slot]] = [[] for _ in range(p)]
    progress = True
    while progress:
        progress = False
        for s in range(p):
            acts = sched[s]
            while ptr[s] < len(acts):
                a = acts[ptr[s]]
                start = free[s]
                ready = True
                for key, _ in _needs(sched, s, a):
                    if key not in done:
                        ready = False
                        break
                    t, src = done[key]
                    start = max(start, t + (comm_time if src != s else 0))
                if not ready:
                    break
                end = start + durations[a.kind]
                timelines[s].append(Slot(a, start, end))
                for key in _produces(sched, s, a):
                    done[key] = (end, s)
                free[s] = end
                ptr[s] += 1
                progress = True
    if any(ptr[s] < len(sched[s]) for s in range(p)):
        raise ScheduleError(_deadlock_message(sched, ptr, done))
    return timelines


def _deadlock_message(sched: Schedule, ptr: list[int], done: dict) -> str:
    owner = {}  # completion key -> stage whose list holds the producing action
    for s, acts in enumerate(sched):
        for a in acts:
            for key in _produces(sched, s, a):
                owner.setdefault(key, s)
    waits: dict[int, int] = {}
    lines = []
    for s, acts in enumerate(sched):
        if ptr[s] >= len(acts):
            continue
        a = acts[ptr[s]]
        missing = [(key, desc) for key, desc in _needs(sched, s, a) if key not in done]
        desc = ", ".join(d for _, d in missing)
        lines.append(f"stage {s} is blocked at {a!r} (position {ptr[s]}) waiting for {desc}")
        if missing and missing[0][0] in owner:
            waits[s] = owner[missing[0][0]]
    cycle = _find_cycle(waits)
    head = f"deadlock in pipeline schedule {sched.name!r}"
    if cycle:
        head += ": wait cycle " + " -> ".join(f"stage {s}" for s in cycle + [cycle[0]])
    return head + "\n  " + "\n  ".join(lines)


def _find_cycle(waits: dict[int, int]) -> list[int]:
    for start in waits:
        seen: list[int] = []
        s = start
        while s in waits and s not in seen:
            seen.append(s)
            s = waits[s]
        if s in seen:
            return seen[seen.index(s):]
    return []


def peak_in_flight(schedule: ScheduleLike) -> tuple[int, ...]:
    """Per stage, the most (micro-batch, chunk) activations held at once (order only)."""
    sched = make_schedule(schedule).compute()
    peaks = []
    for acts in sched:
        live = peak = 0
        for a in acts:
            if a.kind == FORWARD:
                live += 1
                peak = max(peak, live)
            elif a.frees_activations:
                live -= 1
        peaks.append(peak)
    return tuple(peaks)


def _durations(f_time, b_time, bi_time, bw_time) -> dict:
    if bi_time is None and bw_time is None:
        bi_time = bw_time = b_time / 2
    elif bi_time is None:
        bi_time = b_time - bw_time
    elif bw_time is None:
        bw_time = b_time - bi_time
    d = {FORWARD: f_time, BACKWARD: b_time, BACKWARD_INPUT: bi_time, BACKWARD_WEIGHT: bw_time}
    for kind, t in d.items():
        if not t > 0:
            raise ScheduleError(f"the duration of {kind} actions must be > 0, got {t!r}")
    return d


def simulate(schedule: ScheduleLike, f_time: float = 1, b_time: float = 2,
             bi_time: float | None = None, bw_time: float | None = None,
             comm_time: float = 0) -> SimResult:
    """Validate ``schedule`` and time it under the module docstring's model; ``bi_time`` and
    ``bw_time`` default to half of ``b_time`` each (or ``b_time`` minus the other)."""
    sched = validate(schedule).compute()
    if comm_time < 0:
        raise ScheduleError(f"comm_time must be >= 0, got {comm_time!r}")
    d = _durations(f_time, b_time, bi_time, bw_time)
    timelines = _execute(sched, d, comm_time)
    makespan = max((tl[-1].end for tl in timelines if tl), default=0.0)
    busy = tuple(sum(sl.end - sl.start for sl in tl) for tl in timelines)
    fractions = tuple((makespan - b) / makespan if makespan else 0.0 for b in busy)
    return SimResult(sched, tuple(tuple(tl) for tl in timelines), makespan, busy, fractions,
                     sum(fractions) / len(fractions), peak_in_flight(sched), d[FORWARD],
                     d[BACKWARD], d[BACKWARD_INPUT], d[BACKWARD_WEIGHT], comm_time)


def _as_fraction(x: float) -> Fraction:
    return Fraction(x).limit_denominator(10_000)


def render(schedule: ScheduleLike | SimResult, f_time: float | None = None,
           b_time: float | None = None, bi_time: float | None = None,
           bw_time: float | None = None, comm_time: float = 0, header: bool = True) -> str:
    """The timeline as text, one row per stage and one slot per action unless durations are
    given (as for :func:`simulate`); a schedule with SEND/RECV is also listed below it::

        1f1b: p=2 m=3 (F=1 B=1): makespan 8, bubble 25.0%
        t   0  1  2  3  4  5  6  7
        s0  F0 F1 .  B0 F2 B1 .  B2
        s1  .  F0 B0 F1 B1 F2 B2 .
    """
    if isinstance(schedule, SimResult):
        res = schedule
    elif f_time is None and b_time is None and bi_time is None and bw_time is None:
        res = simulate(schedule, 1, 1, 1, 1, comm_time)
    else:
        f = 1 if f_time is None else f_time
        b = 2 * f if b_time is None else b_time
        res = simulate(schedule, f, b, bi_time, bw_time, comm_time)
    sched = res.schedule
    slot = _slot_length(res)
    n_slots = int(round(_as_fraction(res.makespan) / slot)) if res.makespan else 0
    width = max([len(repr(a)) for acts in sched for a in acts] + [2, len(str(max(n_slots - 1, 0)))])
    label_w = len(f"s{sched.num_stages - 1}")
    rows = []
    if header:
        rows.append(_title(res, slot))
        ruler = [str(t).ljust(width) for t in range(n_slots)]
        rows.append(("t" if slot == 1 else "#").ljust(label_w) + "  " + " ".join(ruler).rstrip())
    for s, tl in enumerate(res.timelines):
        cells = [".".ljust(width)] * n_slots
        for sl in tl:
            a = int(round(_as_fraction(sl.start) / slot))
            b = int(round(_as_fraction(sl.end) / slot))
            cells[a] = repr(sl.action).ljust(width)
            for i in range(a + 1, b):
                cells[i] = "-" * width
        rows.append(f"s{s}".ljust(label_w) + "  " + " ".join(cells).rstrip())
    if not isinstance(schedule, SimResult) and any(a.is_comm for acts in
                                                   make_schedule(schedule) for a in acts):
        rows.append(make_schedule(schedule).format())  # with its SEND/RECV, as it runs
    return "\n".join(rows)


format_timeline = render  # (the earlier name, kept for user code)


def _slot_length(res: SimResult) -> Fraction:
    """The rational gcd of the durations, so each action fills whole columns of the chart."""
    durs = [res.f_time, res.b_time, res.bi_time, res.bw_time]
    if res.comm_time:
        durs.append(res.comm_time)
    slot = Fraction(0)
    for d in durs:
        fd = _as_fraction(d)
        slot = fd if slot == 0 else Fraction(
            math.gcd(slot.numerator * fd.denominator, fd.numerator * slot.denominator),
            slot.denominator * fd.denominator)
    return slot


def _title(res: SimResult, slot: Fraction) -> str:
    """The chart's first line: schedule, durations of the kinds it uses, makespan, bubble."""
    sched = res.schedule
    kinds = {a.kind for acts in sched for a in acts}
    times = {FORWARD: res.f_time, BACKWARD: res.b_time, BACKWARD_INPUT: res.bi_time,
             BACKWARD_WEIGHT: res.bw_time}
    durs_txt = " ".join(f"{k}={times[k]:g}" for k in times if k in kinds)
    if res.comm_time:
        durs_txt += f" comm={res.comm_time:g}"
    unit = "" if slot == 1 else f", 1 slot = {float(slot):g}"
    return (f"{sched.name}: p={sched.num_stages} m={sched.num_microbatches}"
            + (f" v={sched.num_chunks}" if sched.num_chunks > 1 else "")
            + f" ({durs_txt}{unit}): makespan {res.makespan:g}, "
            f"bubble {100 * res.bubble_fraction:.1f}%")

