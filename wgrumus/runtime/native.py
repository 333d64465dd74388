"""The one place that touches wgpu-py internals (private attributes, wgpu-native's C API).

Each use is behind ``c_api()``, None outside the pinned wgpu-py range or where symbols are
missing; each feature then falls back to wgpu-py's public API (slower, same results):
- staging maps (``api()``): wgpu-py's promises wait for *all* submitted work; here each map waits
  for the submission its copy went in only, so chunk k maps while chunk k+1 copies;
- ``RawPass`` / ``RawReplay`` / ``RawTextureCopy``: commands with one C call each (wgpu-py's
  wrapper costs about a fifth of a small dispatch's host time);
- ``trusted_module``: shaders compiled without wgpu's injected bounds checks.
"""
from __future__ import annotations

import functools
import itertools
import os
import threading
import time

import numpy as np

from .._deps import wgpu_in_range

_SYMBOLS = ("wgpuQueueSubmitForIndex", "wgpuDevicePoll", "wgpuBufferMapAsync",
            "wgpuBufferGetMappedRange", "wgpuBufferUnmap", "wgpuComputePassEncoderSetPipeline",
            "wgpuComputePassEncoderSetBindGroup", "wgpuComputePassEncoderDispatchWorkgroups",
            "wgpuCommandEncoderCopyBufferToBuffer", "wgpuQueueGetTimestampPeriod",
            "wgpuCommandEncoderBeginComputePass", "wgpuComputePassEncoderEnd",
            "wgpuComputePassEncoderRelease")
MAP_READ, MAP_WRITE = 1, 2  # WGPUMapMode bits
# A blocking wgpuDevicePoll holds the device's fence lock until the GPU is done, so every other
# thread's submit to that device waits for the GPU to drain (wgpu-native 29, gfx-rs/wgpu#9470);
# wgpu-py's poll thread makes such blocking polls while any of its promises is pending. Waits
# that must not stall submits poll without blocking: spinning SPIN_S, then sleeping POLL_FIRST_S
# doubling to POLL_MAX_S (Device.blocking_waits decides which, per adapter).
SPIN_S = 2e-4
POLL_FIRST_S = 1e-5
POLL_MAX_S = 1e-4
_api_obj = None
_api_lock = threading.Lock()


@functools.cache
def c_api():
    """wgpu-py's cffi module of wgpu-native where it is in the tested range with every symbol."""
    try:
        import wgpu
        from wgpu.backends.wgpu_native import _api
    except ImportError:
        return None
    if not wgpu_in_range(wgpu.__version__):
        return None
    try:
        return _api if all(hasattr(_api.lib, s) for s in _SYMBOLS) else None
    except Exception:  # noqa: BLE001 - another layout of wgpu-py's internals: public API
        return None


def api():
    """The staging API: C functions (``.native``) where available, else wgpu-py's promises
    (forced by WGRUMUS_NO_NATIVE=1)."""
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
    """Map for reading without the empty submit of wgpu-py's "READ" (the copy was submitted)."""
    return buffer.map_async("READ_NOSYNC" if c_api() else "READ", 0, size)


def timestamp_period_ns(queue) -> float:
    """Nanoseconds per timestamp tick (1.0 where wgpu-py already resolves raw ticks)."""
    capi = c_api()
    return float(capi.lib.wgpuQueueGetTimestampPeriod(queue._internal)) or 1.0 if capi else 1.0


def trusted_module(device, code: str, label: str):
    """A shader module without runtime checks; None where wgpu-native lacks the call."""
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
    """Records into the open compute pass through the C functions (errors still surface at
    ``finish()``, through wgpu-py); a pipeline already set is not set again."""

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
    """Buffer-to-texture copies through the C function (wgpu-py's wrapper took ~0.1 ms a copy,
    a third of a small CPU matmul's host time). One per device, used under its lock."""

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
        """``structs`` set to a copy of ``height`` rows of ``width`` texels into rows y.."""
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
    """A replay's segments lowered once to wgpu-native handles, encoded by C calls per replay."""
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
        """``before`` copies, the segments (passes by ``open_pass(enc)``, or None: untimed
        passes through the C calls), ``after`` copies."""
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
    """One map request: ``status`` None while pending, then True or an error message (wgpu-py's
    API: its promise); ``index``: the submission it waits for."""
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

    def wait(self, device, req: MapRequest, deadline: float, block: bool = True) -> None:
        """Until ``req`` resolves (TimeoutError past ``deadline``): with ``block``, a blocking
        poll for its submission first (not interruptible; stalls other threads' submits to the
        device until the GPU is done); then non-blocking polls, spinning a moment and then
        backing off (a poll on another thread may fire the callback a moment later)."""
        if block and req.status is None and req.index is not None:
            self.wait_index(device, req.index)
        spin_until = time.perf_counter() + SPIN_S
        delay = POLL_FIRST_S
        while req.status is None:
            self.poll(device)
            if req.status is not None:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"buffer map of {req.size:,} bytes did not complete")
            if time.perf_counter() < spin_until:
                os.sched_yield()
                continue
            time.sleep(delay)
            delay = min(delay * 2, POLL_MAX_S)
        if req.status is not True:
            raise RuntimeError(req.status)

    def is_done(self, req: MapRequest) -> bool:
        return req.status is not None

    def mapped_array(self, buffer, size: int, dtype=np.uint8) -> np.ndarray:
        """The mapped bytes as a numpy view (drop every view before ``unmap``)."""
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

    def wait(self, device, req: MapRequest, deadline: float, block: bool = True) -> None:
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

