"""The one place that touches wgpu-py internals: its private attributes and wgpu-native's C API
through wgpu-py's cffi handles. Everything else in wgrumus uses wgpu-py's public API and these
functions.

Each use is behind ``c_api()``, which is None outside the wgpu-py range that _deps.py pins (only
reachable with WGRUMUS_ANY_WGPU=1) or where the C symbols are missing; then each feature falls
back to wgpu-py's public API (slower, same results). The features:
- staging maps (``api()``): wgpu-py resolves a ``map_async`` promise on its per-device poll
  thread, which blocks in ``wgpuDevicePoll(wait=True)`` until *all* submitted work is done (and
  holds the device's fence lock meanwhile). Here each map request carries its own callback, tied
  to the submission its copy went in (``wgpuQueueSubmitForIndex``), and the waiter waits for
  that submission only (``wgpuDevicePoll(wait, &index)``, or polls without blocking: see
  BLOCKING_WAIT), so chunk k's map resolves while chunk k+1's copy runs;
- ``RawPass`` / ``RawReplay``: recording dispatches with three C calls each (wgpu-py's wrapper
  costs about a fifth of a small dispatch's host time); ``RawTextureCopy``: buffer-to-texture
  copies with one;
- ``trusted_module``: shaders compiled without wgpu's injected bounds checks;
- ``timestamp_period_ns``, ``mapped_range`` and ``map_read_async``.
"""
from __future__ import annotations

import functools
import itertools
import os
import threading
import time

import numpy as np

from .._deps import WGPU_TESTED
from .._deps import _minor as _version

TESTED = (WGPU_TESTED[0], (WGPU_TESTED[1][0], WGPU_TESTED[1][1] - 1))  # (major, minor), inclusive
_SYMBOLS = ("wgpuQueueSubmitForIndex", "wgpuDevicePoll", "wgpuBufferMapAsync",
            "wgpuBufferGetMappedRange", "wgpuBufferUnmap", "wgpuComputePassEncoderSetPipeline",
            "wgpuComputePassEncoderSetBindGroup", "wgpuComputePassEncoderDispatchWorkgroups",
            "wgpuCommandEncoderCopyBufferToBuffer", "wgpuQueueGetTimestampPeriod",
            "wgpuCommandEncoderBeginComputePass", "wgpuComputePassEncoderEnd",
            "wgpuComputePassEncoderRelease")
MAP_READ, MAP_WRITE = 1, 2  # WGPUMapMode bits
# Waiting for a map: a blocking wgpuDevicePoll holds the device's fence lock (read) until the
# submission is done, and every queue submit needs it (write; wgpu-core Device::maintain and
# Queue::submit): another thread's submits to the same device (a DataParallel replica's step
# while its comm thread waits for a gradient chunk) stall behind the wait. BLOCKING_WAIT = False
# polls without blocking instead, every POLL_FIRST_S doubling to POLL_MAX_S. Blocking stays the
# default until that is measured on a GPU: on lavapipe polling made 2-device eager DP 8% slower
# (BENCHMARKS.md, 2026-11-24).
BLOCKING_WAIT = True
POLL_FIRST_S = 1e-5
POLL_MAX_S = 1e-4
_api_obj = None
_api_lock = threading.Lock()


@functools.cache
def c_api():
    """wgpu-py's cffi module of wgpu-native (``lib``, ``libf``, ``ffi``) where this wgpu-py is
    in the tested range and has every symbol used here; else None."""
    try:
        import wgpu
        from wgpu.backends.wgpu_native import _api
    except ImportError:
        return None
    if not TESTED[0] <= _version(wgpu.__version__) <= TESTED[1]:
        return None
    try:
        return _api if all(hasattr(_api.lib, s) for s in _SYMBOLS) else None
    except Exception:  # noqa: BLE001 - another layout of wgpu-py's internals: public API
        return None


def api():
    """The staging API: wgpu-native's C functions (``.native`` True) where ``c_api()`` is
    available, else wgpu-py's promises (WGRUMUS_NO_NATIVE=1 forces that)."""
    global _api_obj
    if _api_obj is not None:  # (every submit asks)
        return _api_obj
    with _api_lock:
        if _api_obj is None:
            capi = None if os.environ.get("WGRUMUS_NO_NATIVE") else c_api()
            try:
                _api_obj = _Native(capi) if capi is not None else _WgpuPy()
            except Exception:  # noqa: BLE001 - a header of another shape: use wgpu-py's API
                _api_obj = _WgpuPy()
        return _api_obj


def mapped_range(buffer, size: int) -> memoryview:
    """A writable memoryview of the first ``size`` bytes of a mapped buffer (no copy)."""
    return buffer._experimental_get_mapped_range(0, size)


def map_read_async(buffer, size: int):
    """wgpu-py's promise of mapping ``buffer`` for reading, without the empty submit that its
    public "READ" mode makes first to sync on (the copy into it was submitted just before)."""
    return buffer.map_async("READ_NOSYNC" if c_api() else "READ", 0, size)


def timestamp_period_ns(queue) -> float:
    """Nanoseconds per timestamp tick (1.0 where wgpu-py already resolves raw ticks)."""
    capi = c_api()
    return float(capi.lib.wgpuQueueGetTimestampPeriod(queue._internal)) or 1.0 if capi else 1.0


def trusted_module(device, code: str, label: str):
    """wgpuDeviceCreateShaderModuleTrusted with no runtime checks; None where this wgpu-native
    lacks it (then the caller compiles through the checked path)."""
    capi = c_api()
    fn = getattr(capi.libf, "wgpuDeviceCreateShaderModuleTrusted", None) if capi else None
    if fn is None:
        return None
    ffi = capi.ffi
    src = capi.new_struct_p("WGPUShaderSourceWGSL *", code=capi.to_c_string_view(code))
    src[0].chain.next = ffi.NULL
    src[0].chain.sType = capi.lib.WGPUSType_ShaderSourceWGSL
    desc = capi.new_struct_p("WGPUShaderModuleDescriptor *",
                             nextInChain=ffi.cast("WGPUChainedStruct *", src),
                             label=capi.to_c_string_view(label))
    mid = fn(device._internal, desc, 0)
    return None if mid == ffi.NULL else capi.GPUShaderModule(label, mid, device)


class RawPass:
    """Records into the open compute pass through wgpu-native's C functions directly. Pass
    commands report no errors of their own (WebGPU defers them to ``finish()``, which still goes
    through wgpu-py), so nothing is lost. A pipeline already set in this pass is not set again."""

    @classmethod
    def create(cls):
        """A RawPass, or None under WGRUMUS_CHECKED_PASS=1 or without ``c_api()``."""
        capi = c_api()
        return None if capi is None or os.environ.get("WGRUMUS_CHECKED_PASS") else cls(capi)

    def __init__(self, capi):
        self._set_pipeline = capi.lib.wgpuComputePassEncoderSetPipeline
        self._set_bind_group = capi.lib.wgpuComputePassEncoderSetBindGroup
        self._dispatch = capi.lib.wgpuComputePassEncoderDispatchWorkgroups
        self._offset = capi.ffi.new("uint32_t[1]")
        self._pass = self._pipe = None

    def begin(self, compute_pass) -> None:
        self._pass, self._pipe = compute_pass._internal, None

    def dispatch(self, pipe, bind_group, offset: int, gx: int, gy: int, gz: int) -> None:
        cp = self._pass
        if pipe is not self._pipe:
            self._set_pipeline(cp, pipe._internal)
            self._pipe = pipe
        self._offset[0] = offset
        self._set_bind_group(cp, 0, bind_group._internal, 1, self._offset)
        self._dispatch(cp, gx, gy, gz)


class RawTextureCopy:
    """Buffer-to-texture copies through wgpu-native's C function directly (wgpu-py's wrapper
    builds and checks five structs a call, ~0.1 ms: a third of a small matmul's host time on
    a CPU adapter, which copies two operands a matmul). Encoder commands report errors at
    ``finish()``, which still goes through wgpu-py. One instance per device, used under its
    lock (the structs are reused)."""

    @classmethod
    def create(cls):
        """A RawTextureCopy, or None under WGRUMUS_CHECKED_PASS=1 or without ``c_api()``."""
        capi = c_api()
        if capi is None or os.environ.get("WGRUMUS_CHECKED_PASS") or not hasattr(
                capi.lib, "wgpuCommandEncoderCopyBufferToTexture"):
            return None
        try:
            return cls(capi)
        except Exception:  # noqa: BLE001 - other struct names: wgpu-py's public API
            return None

    def __init__(self, capi):
        self._copy = capi.lib.wgpuCommandEncoderCopyBufferToTexture
        self._structs = self.structs(capi)

    @staticmethod
    def structs(capi) -> tuple:
        """The (source, destination, size) structs of one copy."""
        ffi = capi.ffi
        src, dst, size = (ffi.new("WGPUTexelCopyBufferInfo *"),
                          ffi.new("WGPUTexelCopyTextureInfo *"), ffi.new("WGPUExtent3D *"))
        dst.aspect = capi.lib.WGPUTextureAspect_All
        size.depthOrArrayLayers = 1
        return src, dst, size

    @staticmethod
    def fill(structs, buffer, offset: int, bytes_per_row: int, texture, y: int, width: int,
             height: int) -> tuple:
        """``structs`` set to ``height`` rows of ``width`` texels from ``buffer`` at ``offset``
        into rows y.. of (2-D, mip 0) ``texture``."""
        src, dst, size = structs
        src.layout.offset, src.layout.bytesPerRow = offset, bytes_per_row
        src.layout.rowsPerImage, src.buffer = height, buffer._internal
        dst.texture, dst.origin.y = texture._internal, y
        size.width, size.height = width, height
        return structs

    def copy(self, encoder, *region) -> None:
        """The copy ``fill`` describes (its arguments after ``structs``), into ``encoder``."""
        self._copy(encoder._internal, *self.fill(self._structs, *region))


class RawReplay:
    """A replay's segments ((PASS, dispatches), (COPY, copy) or (TEXTURE, buffer-to-texture
    copy)) lowered once to wgpu-native handles (a texture copy: its three structs), and encoded
    with the C calls at every replay."""
    PASS, COPY, TEXTURE = 0, 1, 2

    def __init__(self, capi, segs, ndispatch: int):
        self.lib, ffi = capi.lib, capi.ffi
        self._pass_desc = capi.new_struct_p("WGPUComputePassDescriptor *",
                                            label=capi.to_c_string_view(""),
                                            timestampWrites=ffi.NULL)
        self._offsets = ffi.new("uint32_t[]", max(ndispatch, 1))
        self.segs, k = [], 0
        for kind, body in segs:
            if kind == self.COPY:
                src, so, dst, do, nb = body
                self.segs.append((kind, (src._internal, so, dst._internal, do, nb)))
                continue
            if kind == self.TEXTURE:  # structs of its own per copy, filled once
                self.segs.append((kind, RawTextureCopy.fill(RawTextureCopy.structs(capi),
                                                            *body)))
                continue
            lowered, last = [], None
            for pipe, bg, offs, gx, gy, gz in body:
                p = None if pipe is last else pipe._internal  # set only where it changes
                last = pipe
                if offs:
                    self._offsets[k] = offs[0]
                    lowered.append((p, bg._internal, 1, self._offsets + k, gx, gy, gz))
                else:
                    lowered.append((p, bg._internal, 0, ffi.NULL, gx, gy, gz))
                k += 1
            self.segs.append((kind, lowered))

    def encode(self, enc, open_pass, before, after) -> None:
        """Into encoder ``enc``: the ``before`` copies, the segments (passes opened by
        ``open_pass(enc)``, or None: untimed passes through the C calls, ~16 us less host time
        a pass than wgpu-py's wrapper), the ``after`` copies."""
        lib = self.lib
        begin, end = lib.wgpuCommandEncoderBeginComputePass, lib.wgpuComputePassEncoderEnd
        release = lib.wgpuComputePassEncoderRelease
        copy = lib.wgpuCommandEncoderCopyBufferToBuffer
        texture_copy = lib.wgpuCommandEncoderCopyBufferToTexture
        set_pipe = lib.wgpuComputePassEncoderSetPipeline
        set_bg = lib.wgpuComputePassEncoderSetBindGroup
        dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        e = enc._internal
        for src, so, dst, do, nb in before:
            copy(e, src._internal, so, dst._internal, do, nb)
        for kind, body in self.segs:
            if kind == self.COPY:
                copy(e, *body)
                continue
            if kind == self.TEXTURE:
                texture_copy(e, *body)
                continue
            cp = open_pass(enc) if open_pass is not None else None
            h = cp._internal if cp is not None else begin(e, self._pass_desc)
            for pipe, bg, n, offs, gx, gy, gz in body:
                if pipe is not None:
                    set_pipe(h, pipe)
                set_bg(h, 0, bg, n, offs)
                dispatch(h, gx, gy, gz)
            if cp is not None:
                cp.end()
            else:
                end(h)
                release(h)
        for src, so, dst, do, nb in after:
            copy(e, src._internal, so, dst._internal, do, nb)


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

    def __init__(self, capi):
        ffi, lib = capi.ffi, capi.lib
        self.ffi, self.lib = ffi, lib
        self._submit = capi.libf.wgpuQueueSubmitForIndex  # raises wgpu's validation errors
        self._poll = lib.wgpuDevicePoll
        self._map = lib.wgpuBufferMapAsync
        self._range = lib.wgpuBufferGetMappedRange
        self._unmap = capi.libf.wgpuBufferUnmap
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
        """Until ``req`` resolves: with BLOCKING_WAIT first a blocking poll for its submission,
        then (the callback may be fired by a poll on another thread a moment later) non-blocking
        polls backing off from POLL_FIRST_S to POLL_MAX_S. Raises TimeoutError past
        ``deadline`` (time.monotonic()), RuntimeError if the map failed. The blocking poll
        itself cannot be interrupted: it returns when the submission is done or the device is
        lost, and the deadline is checked after it (BLOCKING_WAIT False: polls only)."""
        if BLOCKING_WAIT and req.status is None and req.index is not None:
            self.wait_index(device, req.index)
        delay = POLL_FIRST_S
        while req.status is None:
            self.poll(device)
            if req.status is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"buffer map of {req.size:,} bytes did not complete")
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
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

    def poll(self, device) -> None:
        """wgpu-py's own poll thread resolves its promises."""

    def submit(self, queue, command_buffer):
        queue.submit([command_buffer])

    def map_async(self, buffer, mode: int, size: int, index=None) -> MapRequest:
        req = MapRequest(buffer, mode, size, index)
        req.status = (map_read_async(buffer, size) if mode == MAP_READ
                      else buffer.map_async("WRITE", 0, size))
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
        return np.frombuffer(mapped_range(buffer, size), dtype)

    def unmap(self, buffer) -> None:
        buffer.unmap()

    pending = 0

