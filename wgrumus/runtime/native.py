"""wgpu-native's C API for staging buffers, where wgpu-py's wrapper cannot do what we need.

wgpu-py resolves a ``map_async`` promise on its per-device poll thread, which blocks in
``wgpuDevicePoll(wait=True)`` until *all* submitted work is done (and holds the device's fence
lock meanwhile, so other threads' submits wait too). A pipeline that keeps several copies in
flight then sees each map resolve only when the pipeline drains. Here each map request carries
its own callback, and the waiter polls for exactly the submission its copy went in
(``wgpuQueueSubmitForIndex`` + ``wgpuDevicePoll(wait, &index)``), so chunk k's map resolves while
chunk k+1's copy is still running.

Everything here is behind a check of wgpu-py's version (the tested range) and of the C symbols;
outside it ``api()`` returns the same interface over wgpu-py's own promises (correct, but maps
resolve only when the device is idle, so transfers do not overlap).
"""
from __future__ import annotations

import itertools
import threading
import time

import numpy as np

TESTED = ((0, 27), (0, 32))  # wgpu-py versions (major, minor), inclusive
_SYMBOLS = ("wgpuQueueSubmitForIndex", "wgpuDevicePoll", "wgpuBufferMapAsync",
            "wgpuBufferGetMappedRange", "wgpuBufferUnmap")
MAP_READ, MAP_WRITE = 1, 2  # WGPUMapMode bits
_api_obj = None
_api_lock = threading.Lock()


def _version(v: str) -> tuple:
    parts = []
    for p in v.split(".")[:2]:
        digits = "".join(itertools.takewhile(str.isdigit, p))
        parts.append(int(digits or 0))
    return tuple(parts)


def api():
    """The staging API: wgpu-native's C functions (``.native`` True) where this wgpu-py is in
    the tested range and has every symbol, else wgpu-py's promises (WGRUMUS_NO_NATIVE=1 forces
    that)."""
    global _api_obj
    if _api_obj is not None:
        return _api_obj
    with _api_lock:
        if _api_obj is None:
            _api_obj = _load() or _WgpuPy()
        return _api_obj


def _load():
    import os
    if os.environ.get("WGRUMUS_NO_NATIVE"):
        return None
    try:
        import wgpu
        from wgpu.backends.wgpu_native import _api
    except ImportError:
        return None
    if not TESTED[0] <= _version(wgpu.__version__) <= TESTED[1]:
        return None
    try:
        if not all(hasattr(_api.lib, s) for s in _SYMBOLS):
            return None
        return _Native(_api)
    except Exception:  # noqa: BLE001 - a header of another shape: use wgpu-py's API
        return None


class MapRequest:
    """One ``wgpuBufferMapAsync``: ``status`` is None while pending, then True (mapped) or an
    error message (through wgpu-py's API: its promise). ``index`` is the submission whose
    completion the map waits for (None: no copy to wait for)."""
    __slots__ = ("buffer", "index", "mode", "size", "status")

    def __init__(self, buffer, mode: int, size: int, index):
        self.buffer, self.mode, self.size, self.index = buffer, mode, size, index
        self.status = None


class _Native:
    native = True

    def __init__(self, _api):
        ffi, lib = _api.ffi, _api.lib
        self.ffi, self.lib = ffi, lib
        self._submit = _api.libf.wgpuQueueSubmitForIndex  # raises wgpu's validation errors
        self._poll = lib.wgpuDevicePoll
        self._map = lib.wgpuBufferMapAsync
        self._range = lib.wgpuBufferGetMappedRange
        self._unmap = _api.libf.wgpuBufferUnmap
        self._pending: dict[int, MapRequest] = {}
        self._keys = itertools.count(1)  # next() is atomic under the GIL
        # One C callback for every map request; userdata1 carries the request's key.
        self._cb = ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)",
                                self._on_map)
        self._ok = lib.WGPUMapAsyncStatus_Success
        self._mode = lib.WGPUCallbackMode_AllowProcessEvents
        # Fails here (and wgpu-py's API is used) if this header's struct has other fields.
        ffi.new("WGPUBufferMapCallbackInfo *", {"mode": self._mode, "callback": self._cb,
                                                "userdata1": ffi.NULL})

    # ------------------------------------------------------------------ submissions
    def submit(self, queue, command_buffer) -> int:
        """Submit one command buffer; return its submission index."""
        cbs = self.ffi.new("WGPUCommandBuffer[1]", [command_buffer._internal])
        return int(self._submit(queue._internal, 1, cbs))

    def wait_index(self, device, index: int) -> None:
        """Block until submission ``index`` of ``device`` is done (fires ready callbacks)."""
        idx = self.ffi.new("WGPUSubmissionIndex *", index)
        self._poll(device._internal, 1, idx)

    def poll(self, device) -> None:
        """Non-blocking: fire the callbacks of whatever has completed."""
        self._poll(device._internal, 0, self.ffi.NULL)

    # ------------------------------------------------------------------ mapping
    def map_async(self, buffer, mode: int, size: int, index=None) -> MapRequest:
        req = MapRequest(buffer, mode, size, index)
        key = next(self._keys)
        self._pending[key] = req
        info = self.ffi.new("WGPUBufferMapCallbackInfo *", {
            "mode": self._mode, "callback": self._cb, "userdata1": self.ffi.cast("void *", key)})
        self._map(buffer._internal, mode, 0, size, info[0])
        return req

    def _on_map(self, status, message, userdata1, _userdata2) -> None:
        req = self._pending.pop(int(self.ffi.cast("uintptr_t", userdata1)), None)
        if req is None:
            return
        if status == self._ok:
            req.status = True
        else:
            msg = self.ffi.string(message.data, message.length).decode(errors="replace") \
                if message.data else ""
            req.status = f"map failed (status {int(status)}): {msg}"

    def wait(self, device, req: MapRequest, deadline: float) -> None:
        """Until ``req`` resolves: first a blocking poll for its submission, then (the callback
        may be fired by a poll on another thread a moment later) short non-blocking polls.
        Raises TimeoutError past ``deadline`` (time.monotonic()), RuntimeError if the map
        failed."""
        if req.status is None and req.index is not None:
            self.wait_index(device, req.index)
        delay = 2e-5
        while req.status is None:
            self.poll(device)
            if req.status is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"buffer map of {req.size:,} bytes did not complete")
            time.sleep(delay)
            delay = min(delay * 2, 1e-3)
        if req.status is not True:
            raise RuntimeError(req.status)

    def is_done(self, req: MapRequest) -> bool:
        return req.status is not None

    def mapped_array(self, buffer, size: int, dtype=np.uint8) -> np.ndarray:
        """The mapped bytes as a numpy view (valid until ``unmap``: drop every view first)."""
        ptr = self._range(buffer._internal, 0, size)
        if ptr == self.ffi.NULL:
            raise RuntimeError("wgpuBufferGetMappedRange returned NULL: buffer not mapped")
        return np.frombuffer(self.ffi.buffer(ptr, size), dtype)

    def unmap(self, buffer) -> None:
        self._unmap(buffer._internal)

    @property
    def pending(self) -> int:
        """Map requests whose callback has not fired yet (all buffers, all devices)."""
        return len(self._pending)


class _WgpuPy:
    """The same interface over wgpu-py's public API (``map_async`` promises)."""
    native = False

    def submit(self, queue, command_buffer):
        queue.submit([command_buffer])

    def map_async(self, buffer, mode: int, size: int, index=None) -> MapRequest:
        req = MapRequest(buffer, mode, size, index)
        req.status = buffer.map_async("READ_NOSYNC" if mode == MAP_READ else "WRITE", 0, size)
        return req

    def wait(self, device, req: MapRequest, deadline: float) -> None:
        promise = req.status
        if not isinstance(promise, bool):
            if not promise._thread_event.wait(max(0.0, deadline - time.monotonic())):
                raise TimeoutError(f"buffer map of {req.size:,} bytes did not complete")
            promise.sync_wait()  # raises the map's error; marks the buffer mapped
            req.status = True

    def is_done(self, req: MapRequest) -> bool:
        return req.status is True or req.status._thread_event.is_set()

    def mapped_array(self, buffer, size: int, dtype=np.uint8) -> np.ndarray:
        return np.frombuffer(buffer._experimental_get_mapped_range(0, size), dtype)

    def unmap(self, buffer) -> None:
        buffer.unmap()

    pending = 0


def submit(queue, command_buffer):
    """Submit one command buffer; its submission index (None through wgpu-py's API)."""
    return api().submit(queue, command_buffer)
