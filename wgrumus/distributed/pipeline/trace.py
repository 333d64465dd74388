"""What a pipeline run did (per stage, the executed actions with timestamps), so tests and
benchmarks check order, bubbles and memory without knowing the threads."""
from __future__ import annotations

from dataclasses import dataclass

from .actions import Action, Schedule


@dataclass(frozen=True)
class ActionRecord:
    """One executed action, times in seconds since the run started; ``wait``: the part spent
    blocked on a channel; ``live_bytes``: activation memory held after it; ``received``/``sent``:
    when its input arrived / its output was handed on."""
    stage: int
    action: Action
    start: float
    end: float
    wait: float
    live_bytes: int
    received: float | None = None
    sent: float | None = None

    @property
    def busy(self) -> float:
        return max(self.end - self.start - self.wait, 0.0)


@dataclass(frozen=True)
class PipelineTrace:
    """Per-stage action records of one ``PipelineExecutor.run`` (also of a failed one)."""
    schedule: Schedule
    records: tuple[tuple[ActionRecord, ...], ...]

    def executed(self) -> list[list[Action]]:
        """The actions each stage ran, in the order it ran them."""
        return [[r.action for r in recs] for recs in self.records]

    def to_strings(self) -> list[list[str]]:
        return [[repr(r.action) for r in recs] for recs in self.records]

    @property
    def start(self) -> float:
        return min((recs[0].start for recs in self.records if recs), default=0.0)

    @property
    def makespan(self) -> float:
        end = max((recs[-1].end for recs in self.records if recs), default=0.0)
        return end - self.start

    def busy(self) -> tuple[float, ...]:
        return tuple(sum(r.busy for r in recs) for recs in self.records)

    def stage_bubble_fractions(self) -> tuple[float, ...]:
        """Idle share of the makespan per stage: 1 - busy / makespan (``simulate``'s definition)."""
        span = self.makespan
        return tuple(1.0 - b / span if span > 0 else 0.0 for b in self.busy())

    @property
    def bubble_fraction(self) -> float:
        fr = self.stage_bubble_fractions()
        return sum(fr) / len(fr) if fr else 0.0

    def peak_activation_bytes(self) -> tuple[int, ...]:
        """Most activation bytes each stage held at once (parameters excluded)."""
        return tuple(max((r.live_bytes for r in recs), default=0) for recs in self.records)

    def mean_durations(self) -> dict[str, float]:
        """Mean busy seconds per action kind (F, B, BI, BW) over all stages."""
        sums: dict[str, list[float]] = {}
        for recs in self.records:
            for r in recs:
                sums.setdefault(r.action.kind, []).append(r.busy)
        return {k: sum(v) / len(v) for k, v in sums.items()}

    def format(self) -> str:
        t0 = self.start
        return "\n".join(f"stage {s}: " + " ".join(f"{r.action!r}@{1e3 * (r.start - t0):.1f}ms"
                                                   for r in recs)
                         for s, recs in enumerate(self.records))

    __str__ = format
