"""Pipeline parallelism: schedules as data (importable without tensors or wgpu), and the
thread-per-stage executor that follows them."""

from .._lazy import lazy_getattr
from .actions import (BI, BW, Action, B, F, Schedule, ScheduleError, add_send_recv,
                      make_schedule, parse_actions)
from .schedules import SCHEDULES, get_schedule, gpipe, interleaved, one_f_one_b, zb_h1
from .timeline import SimResult, Slot, format_timeline, peak_in_flight, render, simulate, validate

# The executor half needs tensors (so wgpu): loaded on first use.
_LAZY = {name: mod for mod, names in {
    ".stage": ("PipelineStage",), ".interpreter": ("StageRunner",),
    ".executor": ("PipelineExecutor", "PipelineError", "PipelineShapeError",
                  "PipelineConfigError", "PipelineTimeoutError"),
    ".trace": ("ActionRecord", "PipelineTrace"),
    ".split": ("StageChain", "balanced_partition", "split_sequential", "split_gpt"),
    ".p2p": ("PipelineP2P", "P2PWork"),
}.items() for name in names}
__getattr__ = lazy_getattr(__name__, _LAZY, globals())

__all__ = ["Action", "F", "B", "BI", "BW", "Schedule", "ScheduleError", "make_schedule",
           "parse_actions", "add_send_recv", "SCHEDULES", "get_schedule", "gpipe", "one_f_one_b",
           "interleaved", "zb_h1", "validate", "simulate", "render", "format_timeline",
           "peak_in_flight", "SimResult", "Slot", "PipelineStage", "PipelineExecutor",
           "PipelineError", "PipelineShapeError", "PipelineConfigError", "PipelineTimeoutError",
           "ActionRecord", "PipelineTrace", "StageChain", "balanced_partition", "split_sequential",
           "split_gpt", "StageRunner", "PipelineP2P", "P2PWork"]
