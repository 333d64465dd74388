"""GpuTimer: how long the GPU spent in a device's compute passes, from timestamp queries.

Host timers cannot tell GPU time from the host's in a host-bound step. Inside ``with
GpuTimer(dev) as t:`` every compute pass writes timestamps at its start and end, summed into
``t.seconds`` on exit (copies and gaps between passes, and earlier work, are not counted).
"""
from __future__ import annotations

import numpy as np
import wgpu

from .errors import AdapterLimitError
from .native import timestamp_period_ns

MAX_PASSES = 2048  # WebGPU allows 4096 queries per query set: two per pass


class GpuTimer:
    def __init__(self, device):
        if "timestamp-query" not in device.features:
            raise AdapterLimitError(
                f"{device.name} has no 'timestamp-query' feature, so GPU time cannot be "
                "measured there; time the step on the host (device.synchronize()) instead")
        self.device = device
        self.seconds = 0.0
        self.spans: list = []  # each timed pass's seconds, in the order the passes opened
        self.passes = 0  # compute passes timed
        self.untimed = 0  # passes past MAX_PASSES (not counted in seconds)
        self._queries = device.wgpu.create_query_set(type=wgpu.QueryType.timestamp,
                                                     count=2 * MAX_PASSES)
        self._resolved = device.wgpu.create_buffer(
            size=16 * MAX_PASSES, usage=wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC)

    def __enter__(self) -> GpuTimer:
        dev = self.device
        with dev.lock:
            if dev.timer is not None:
                raise RuntimeError(f"{dev!r} is already being timed; nest no GpuTimer blocks")
            dev.drain()  # replays queued before the block (CPU adapters) are not timed
            dev.flush_locked()
            self.seconds, self.spans, self.passes, self.untimed = 0.0, [], 0, 0
            dev.timer = self
        return self

    def __exit__(self, *exc) -> None:
        dev = self.device
        with dev.lock:
            dev.drain()
            dev.flush_locked()  # ends the last timed pass
            dev.timer = None
            n = self.passes
            if n:
                dev._close_pass().resolve_query_set(self._queries, 0, 2 * n, self._resolved, 0)
        if n:
            ticks = np.frombuffer(dev.read(self._resolved, 0, 16 * n), np.uint64).reshape(n, 2)
            spans = ticks[:, 1].astype(np.int64) - ticks[:, 0].astype(np.int64)
            sec = np.clip(spans, 0, None) * (timestamp_period_ns(dev.queue) * 1e-9)
            self.spans = sec.tolist()
            self.seconds = float(sec.sum())

    def _pass_writes(self):
        """timestamp_writes for the pass being opened (called under the device lock)."""
        if self.passes == MAX_PASSES:
            self.untimed += 1
            return None
        k = self.passes
        self.passes += 1
        return {"query_set": self._queries, "beginning_of_pass_write_index": 2 * k,
                "end_of_pass_write_index": 2 * k + 1}
