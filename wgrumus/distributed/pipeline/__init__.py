"""Pipeline parallelism: schedules as data, and (later) the thread-per-stage executor.

The schedule half has no dependency on tensors or autograd: it can be imported, printed,
validated and simulated on any machine.
"""

from .actions import (
    B,
    BI,
    BW,
    F,
    Action,
    Schedule,
    ScheduleError,
    make_schedule,
    parse_actions,
)
from .schedules import SCHEDULES, get_schedule, gpipe, interleaved, one_f_one_b, zb_h1
from .timeline import SimResult, Slot, format_timeline, peak_in_flight, render, simulate, validate

__all__ = [
    "Action",
    "F",
    "B",
    "BI",
    "BW",
    "Schedule",
    "ScheduleError",
    "make_schedule",
    "parse_actions",
    "SCHEDULES",
    "get_schedule",
    "gpipe",
    "one_f_one_b",
    "interleaved",
    "zb_h1",
    "validate",
    "simulate",
    "render",
    "format_timeline",
    "peak_in_flight",
    "SimResult",
    "Slot",
]
