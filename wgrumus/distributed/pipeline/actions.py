"""Pipeline actions and schedules as data, so a test can print, validate and simulate a schedule
before a kernel runs (as ``torch.distributed.pipelining``). Kinds: ``F`` forward, ``B`` full
backward, ``BI``/``BW`` its input/weight-gradient halves (nobody waits for ``BW``), and the
communication ``SF``/``RF``/``SB``/``RB`` that :func:`add_send_recv` adds. Chunk ``c`` on stage
``s`` is virtual stage ``c * p + s`` (Megatron-LM's interleaved layout).
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial

FORWARD = "F"
BACKWARD = "B"
BACKWARD_INPUT = "BI"
BACKWARD_WEIGHT = "BW"
SEND_F, RECV_F, SEND_B, RECV_B = "SF", "RF", "SB", "RB"
COMPUTE_KINDS = (FORWARD, BACKWARD, BACKWARD_INPUT, BACKWARD_WEIGHT)
COMM_KINDS = (SEND_F, RECV_F, SEND_B, RECV_B)
KINDS = COMPUTE_KINDS + COMM_KINDS


class ScheduleError(ValueError):
    """An action list that cannot be executed (a ValueError, what bad ``(p, m)`` raise)."""


@dataclass(frozen=True, order=True)
class Action:
    """``kind`` on micro-batch ``mb`` of model chunk ``chunk``; repr ``F0``, ``BI2``, ``F2.1``."""
    kind: str
    mb: int
    chunk: int = 0

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ScheduleError(f"unknown action kind {self.kind!r}; expected one of {KINDS}")
        for what, v in (("micro-batch", self.mb), ("chunk", self.chunk)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ScheduleError(f"{what} index must be an int >= 0, got {v!r}")

    def __repr__(self) -> str:
        return f"{self.kind}{self.mb}" + (f".{self.chunk}" if self.chunk else "")

    __str__ = __repr__

    @property
    def is_comm(self) -> bool:
        return self.kind in COMM_KINDS

    @property
    def sends_input_grad(self) -> bool:  # the gradient the previous stage waits for
        return self.kind in (BACKWARD, BACKWARD_INPUT)

    @property
    def frees_activations(self) -> bool:  # the micro-batch's activations are no longer needed
        return self.kind in (BACKWARD, BACKWARD_WEIGHT)

    @classmethod
    def parse(cls, text: str) -> Action:
        """Inverse of ``repr``: ``"F0"``, ``"B3"``, ``"BI2"``, ``"BW2.1"``, ``"F2.1"``."""
        m = _ACTION_RE.fullmatch(text.strip())
        if not m:
            raise ScheduleError(f"cannot parse action {text!r}; expected e.g. 'F0', 'B3', 'BI2', "
                                f"'BW2', 'F2.1'")
        return cls(m.group(1), int(m.group(2)), int(m.group(3) or 0))


_ACTION_RE = re.compile(r"(BI|BW|SF|RF|SB|RB|F|B)(\d+)(?:\.(\d+))?")


# F(mb, chunk=0) etc.: the notation, for writing expected lists
F, B, BI, BW = (partial(Action, k) for k in COMPUTE_KINDS)


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
    """Per-stage action lists (``sched[s]``), with the sizes stored so that validation notices a
    micro-batch missing on every stage."""
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
        return "\n".join(f"stage {s}: " + " ".join(map(repr, acts))
                         for s, acts in enumerate(self.stages))

    __str__ = format

    def compute(self) -> Schedule:
        """This schedule without its communication actions."""
        return Schedule(self.name, self.num_stages, self.num_microbatches, self.num_chunks,
                        tuple(tuple(a for a in acts if not a.is_comm) for acts in self.stages))


def add_send_recv(sched: Schedule) -> Schedule:
    """The schedule with its communication: a receive right before each F, B or BI that needs one,
    a send right after; sends are buffered, so a valid schedule cannot deadlock."""
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


def make_schedule(stages: Schedule | Iterable[StageActions], num_microbatches: int | None = None,
                  num_chunks: int | None = None, name: str = "custom") -> Schedule:
    """A :class:`Schedule` from raw per-stage lists (Actions or strings); sizes not given are
    inferred from the largest indices."""
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
