"""Pipeline actions and schedules as plain, inspectable data.

A schedule is nothing more than, for every pipeline stage, the ordered list of actions that stage
performs in one training step. Keeping it as data (rather than as control flow inside an executor)
is what lets a test print a schedule, compare it with a hand-written list, validate it and simulate
it before a single kernel runs -- the approach of ``torch.distributed.pipelining``. The executor
then only has to follow the list.

Kinds of action:

``F``   forward of one micro-batch through one model chunk;
``B``   full backward (input gradient and weight gradient together);
``BI``  input-gradient half of a split backward (what the previous stage waits for);
``BW``  weight-gradient half of a split backward (nobody waits for it, so it can fill bubbles).

Communication is part of the list too (:func:`add_send_recv`, one pass over the compute actions,
as PyTorch's ``_add_send_recv``): ``SF``/``RF`` send/receive the activation of a micro-batch to/from
the next/previous virtual stage, ``SB``/``RB`` its gradient to/from the previous/next one.

Model chunks exist for the interleaved schedule: with ``v`` chunks per stage, chunk ``c`` on stage
``s`` is virtual stage ``c * p + s`` (Megatron-LM's layout), so a micro-batch visits stages
0..p-1 with chunk 0, then 0..p-1 again with chunk 1, and so on.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

FORWARD = "F"
BACKWARD = "B"
BACKWARD_INPUT = "BI"
BACKWARD_WEIGHT = "BW"
SEND_F, RECV_F, SEND_B, RECV_B = "SF", "RF", "SB", "RB"
COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
COMM_KINDS = (SEND_F, RECV_F, SEND_B, RECV_B)
KINDS = COMPUTE_KINDS + COMM_KINDS


class ScheduleError(ValueError):
    """An action list that cannot be executed (or a schedule that cannot be built).

    A ``ValueError`` so that callers passing bad ``(p, m)`` can catch the usual exception type.
    """


@dataclass(frozen=True, order=True)
class Action:
    """One step of one stage: ``kind`` on micro-batch ``mb`` for model chunk ``chunk``.

    ``repr`` is the compact notation used in charts and tests: ``F0``, ``B3``, ``BI2``, and a
    ``.c`` suffix for chunks other than 0 (``F2.1`` is the forward of micro-batch 2 on chunk 1).
    """

    kind: str
    mb: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"unknown action kind {self.kind!r}; expected one of {KINDS}")
        if not isinstance(self.mb, int) or isinstance(self.mb, bool) or self.mb < 0:
            raise ScheduleError(f"micro-batch index must be an int >= 0, got {self.mb!r}")
        if not isinstance(self.chunk, int) or isinstance(self.chunk, bool) or self.chunk < 0:
            raise ScheduleError(f"chunk index must be an int >= 0, got {self.chunk!r}")

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")

    __str__ = __repr__

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def sends_input_grad(self) -> bool:
        """True for the actions that produce the gradient the previous stage waits for."""
        return self.kind in (BACKWARD, BACKWARD_INPUT)

    @property
    def frees_activations(self) -> bool:
        """True for the action after which this micro-batch's activations are no longer needed."""
        return self.kind in (BACKWARD, BACKWARD_WEIGHT)

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``repr``: ``"F0"``, ``"B3"``, ``"BI2"``, ``"BW2.1"``, ``"F2.1"``."""
        m = _ACTION_RE.fullmatch(text.strip())
        if not m:
            raise ScheduleError(
                f"cannot parse action {text!r}; expected e.g. 'F0', 'B3', 'BI2', 'BW2', 'F2.1'"
            )
        return cls(m.group(1), int(m.group(2)), int(m.group(3) or 0))


_ACTION_RE = re.compile(r"(BI|BW|SF|RF|SB|RB|F|B)(\d+)(?:\.(\d+))?")


def F(mb: int, chunk: int = 0) -> Action:  # noqa: N802 - reads like the notation
    return Action(FORWARD, mb, chunk)


def B(mb: int, chunk: int = 0) -> Action:  # noqa: N802
    return Action(BACKWARD, mb, chunk)


def BI(mb: int, chunk: int = 0) -> Action:  # noqa: N802
    return Action(BACKWARD_INPUT, mb, chunk)


def BW(mb: int, chunk: int = 0) -> Action:  # noqa: N802
    return Action(BACKWARD_WEIGHT, mb, chunk)


ActionLike = Action | str
StageActions = Sequence[ActionLike]


def _to_action(a: ActionLike) -> Action:
    if isinstance(a, Action):
        return a
    if isinstance(a, str):
        return Action.parse(a)
    raise ScheduleError(f"expected an Action or a string like 'F0', got {a!r}")


def parse_actions(text: str) -> tuple[Action, ...]:
    """``"F0 F1 B0 B1"`` -> ``(F0, F1, B0, B1)``; handy for writing expected lists in tests."""
    return tuple(Action.parse(t) for t in text.replace(",", " ").split())


@dataclass(frozen=True)
class Schedule:
    """The per-stage action lists of one training step, plus the sizes they were built for.

    Behaves like a read-only sequence of stages: ``sched[s]`` is stage ``s``'s tuple of actions,
    ``len(sched)`` is the number of stages. ``num_microbatches`` and ``num_chunks`` are stored
    (not inferred) so that validation can notice a micro-batch missing on every stage.
    """

    name: str
    num_stages: int
    num_microbatches: int
    num_chunks: int
    stages: tuple[tuple[Action, ...], ...]

    def __getitem__(self, s: int) -> tuple[Action, ...]:
        return self.stages[s]

    def __len__(self) -> int:
        return len(self.stages)

    def __iter__(self) -> Iterator[tuple[Action, ...]]:
        return iter(self.stages)

    @property
    def num_virtual_stages(self) -> int:
        return self.num_stages * self.num_chunks

    def virtual_stage(self, stage: int, chunk: int) -> int:
        """Position of (stage, chunk) along the model: chunk-major, Megatron's layout."""
        return chunk * self.num_stages + stage

    def locate(self, virtual_stage: int) -> tuple[int, int]:
        """Inverse of :meth:`virtual_stage`: ``(stage, chunk)``."""
        return virtual_stage % self.num_stages, virtual_stage // self.num_stages

    def where(self, virtual_stage: int) -> str:
        """``stage s``, or ``stage s chunk c`` with several chunks (for messages)."""
        s, c = self.locate(virtual_stage)
        return f"stage {s}" + (f" chunk {c}" if self.num_chunks > 1 else "")

    def to_strings(self) -> list[list[str]]:
        """``[["F0", "B0"], ...]``: the easiest form to compare in a test."""
        return [[repr(a) for a in stage] for stage in self.stages]

    def format(self) -> str:
        """One line per stage: ``stage 0: F0 F1 B0 B1``."""
        return "\n".join(
            f"stage {s}: " + " ".join(repr(a) for a in acts) for s, acts in enumerate(self.stages)
        )

    __str__ = format

    def compute(self) -> Schedule:
        """This schedule without its communication actions."""
        return Schedule(self.name, self.num_stages, self.num_microbatches, self.num_chunks,
                        tuple(tuple(a for a in acts if not a.is_comm) for acts in self.stages))


def add_send_recv(sched: Schedule) -> Schedule:
    """The schedule with its communication: each forward of virtual stage k > 0 receives its
    input right before it (``RF``) and each one of k < last sends its output right after (``SF``);
    each input-gradient backward (B, BI) receives from k + 1 before and sends to k - 1 after.
    Sends are buffered, so receiving just before use cannot deadlock a schedule that
    ``validate`` accepts."""
    last = sched.num_virtual_stages - 1
    stages = []
    for s, acts in enumerate(sched.compute()):
        out = []
        for a in acts:
            k = sched.virtual_stage(s, a.chunk)
            if a.kind == FORWARD:
                out += ([Action(RECV_F, a.mb, a.chunk)] if k > 0 else []) + [a] + \
                    ([Action(SEND_F, a.mb, a.chunk)] if k < last else [])
            elif a.sends_input_grad:
                out += ([Action(RECV_B, a.mb, a.chunk)] if k < last else []) + [a] + \
                    ([Action(SEND_B, a.mb, a.chunk)] if k > 0 else [])
            else:
                out.append(a)
        stages.append(tuple(out))
    return Schedule(sched.name, sched.num_stages, sched.num_microbatches, sched.num_chunks,
                    tuple(stages))


def make_schedule(
    stages: Schedule | Iterable[StageActions],
    num_microbatches: int | None = None,
    num_chunks: int | None = None,
    name: str = "custom",
) -> Schedule:
    """Normalise a :class:`Schedule` or a raw list of per-stage lists (Actions or strings).

    For raw lists the number of micro-batches and chunks is inferred from the largest indices seen
    unless given; pass them explicitly to catch a micro-batch that is missing on every stage.
    """
    if isinstance(stages, Schedule):
        if num_microbatches is None and num_chunks is None:
            return stages
        name = stages.name
        num_microbatches = stages.num_microbatches if num_microbatches is None else num_microbatches
        num_chunks = stages.num_chunks if num_chunks is None else num_chunks
        stages = stages.stages
    if isinstance(stages, str):
        raise ScheduleError("expected a list of per-stage action lists, got a single string")
    lists = []
    for s, acts in enumerate(stages):
        if isinstance(acts, str):
            acts = parse_actions(acts)
        try:
            lists.append(tuple(_to_action(a) for a in acts))
        except ScheduleError as e:
            raise ScheduleError(f"stage {s}: {e}") from None
    if not lists:
        raise ScheduleError("a schedule needs at least one stage")
    all_actions = [a for acts in lists for a in acts]
    if num_microbatches is None:
        num_microbatches = 1 + max((a.mb for a in all_actions), default=-1)
    if num_chunks is None:
        num_chunks = 1 + max((a.chunk for a in all_actions), default=0)
    return Schedule(name, len(lists), int(num_microbatches), int(num_chunks), tuple(lists))
