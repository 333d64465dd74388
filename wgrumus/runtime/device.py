"""Device: one wgpu device + queue, with its own pipeline cache, buffer pool and command batch.

Ops record dispatches into the device's open compute pass; the batch is submitted on readback,
when the parameter arena is full, or on ``synchronize()``. Per-op parameters (shapes, strides,
scalars) go into 256-byte slots of one uniform arena buffer that is uploaded right before the
batch's submit, so recording an op never waits on the GPU.
"""
from __future__ import annotations

import threading

import numpy as np
import wgpu

from .errors import AdapterLimitError, KernelError
from .kernels import Kernel
from .pool import BufferPool

SLOT = 256  # bytes of parameters per dispatch
ARENA_SLOTS = 1024
MAX_WG_PER_DIM = 65535
_OPTIONAL_FEATURES = ("shader-f16", "timestamp-query", "subgroup")


class Device:
    def __init__(self, index: int, adapter, logical: int = 0):
        self.index = index
        self.adapter = adapter
        self.logical = logical  # k-th logical device on the same adapter
        info = adapter.info
        self.name = f"{info.get('device') or 'adapter'} ({info.get('backend_type', '?')})"
        if logical:
            self.name += f" #{logical}"
        self.adapter_info = dict(info)
        feats = [f for f in _OPTIONAL_FEATURES if f in adapter.features]
        limits = {k: v for k, v in adapter.limits.items() if isinstance(v, int) and v > 0}
        self.wgpu = adapter.request_device_sync(required_features=feats, required_limits=limits,
                                                label=f"wgrumus:{index}")
        self.queue = self.wgpu.queue
        self.features = frozenset(self.wgpu.features)
        self.limits = dict(self.wgpu.limits)
        self.max_binding = min(self.limits["max-storage-buffer-binding-size"],
                               self.limits["max-buffer-size"])
        self.pool = BufferPool(self.wgpu)
        self.lock = threading.RLock()
        self._pipelines: dict = {}
        self._arena = self.wgpu.create_buffer(
            size=SLOT * ARENA_SLOTS, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST)
        self._params = np.zeros((ARENA_SLOTS, SLOT // 4), dtype=np.uint32)
        self._slots = 0
        self._encoder = None
        self._pass = None
        self._staging: dict[int, list] = {}
        self._fence = None
        self.dispatches = 0
        self.submits = 0

    def __repr__(self):
        return f"Device({self.index}: {self.name})"

    # ------------------------------------------------------------------ pipelines
    def pipeline(self, kernel: Kernel):
        p = self._pipelines.get(kernel.key)
        if p is None:
            src = kernel.source()
            try:
                module = self.wgpu.create_shader_module(code=src, label=kernel.family)
                p = self.wgpu.create_compute_pipeline(
                    layout=wgpu.AutoLayoutMode.auto,
                    compute={"module": module, "entry_point": kernel.entry})
            except Exception as e:  # a wgrumus bug: show which kernel and specialisation
                raise KernelError(f"kernel {kernel.family}:{kernel.entry} {dict(kernel.defines)} "
                                  f"failed to build on {self.name}: {e}") from e
            p = (p, p.get_bind_group_layout(0))
            self._pipelines[kernel.key] = p
        return p

    # ------------------------------------------------------------------ recording
    def _open_pass(self):
        if self._encoder is None:
            self._encoder = self.wgpu.create_command_encoder()
        if self._pass is None:
            self._pass = self._encoder.begin_compute_pass()
        return self._pass

    def _close_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._encoder is None:
            self._encoder = self.wgpu.create_command_encoder()
        return self._encoder

    def dispatch(self, kernel: Kernel, buffers, params=(), groups=(1, 1, 1)) -> None:
        """Record one dispatch. buffers: wgpu buffers bound at 1..n; params: up to 64 words
        (ints, or np.float32/float values, stored bit-cast)."""
        gx, gy, gz = groups
        if gx == 0 or gy == 0 or gz == 0:
            return
        if max(gx, gy, gz) > MAX_WG_PER_DIM:
            raise KernelError(f"dispatch {groups} exceeds {MAX_WG_PER_DIM} workgroups per dimension")
        words = _pack(params)
        with self.lock:
            pipe, layout = self.pipeline(kernel)
            if self._slots == ARENA_SLOTS:
                self._flush_locked()
            slot = self._slots
            self._slots += 1
            self._params[slot, :len(words)] = words
            entries = [{"binding": 0, "resource": {"buffer": self._arena, "offset": slot * SLOT,
                                                    "size": SLOT}}]
            for i, b in enumerate(buffers):
                entries.append({"binding": i + 1, "resource": {"buffer": b, "offset": 0,
                                                                "size": b.size}})
            bg = self.wgpu.create_bind_group(layout=layout, entries=entries)
            cp = self._open_pass()
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(gx, gy, gz)
            self.dispatches += 1

    def dispatch_1d(self, kernel: Kernel, buffers, params, n: int, wg: int = 256) -> None:
        """Launch ceil(n / wg) workgroups, folded into (x, y) so any n fits the per-dim limit."""
        self.dispatch(kernel, buffers, params, groups_1d(n, wg))

    def copy(self, src, src_off: int, dst, dst_off: int, nbytes: int) -> None:
        with self.lock:
            self._close_pass().copy_buffer_to_buffer(src, src_off, dst, dst_off, nbytes)

    def _flush_locked(self):
        if self._encoder is None:
            return
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._slots:
            self.queue.write_buffer(self._arena, 0, self._params[:self._slots])
            self._slots = 0
        cb = self._encoder.finish()
        self._encoder = None
        self.queue.submit([cb])
        self.submits += 1

    def flush(self) -> None:
        """Submit the recorded batch without waiting for it."""
        with self.lock:
            self._flush_locked()

    def synchronize(self) -> None:
        """Submit the batch and wait until the GPU has finished all work of this device."""
        # Queue work runs in order: once a copy recorded after everything else is mapped, the GPU
        # is done with all earlier work of this device.
        with self.lock:
            if self._fence is None:
                self._fence = self.wgpu.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST
                                                      | wgpu.BufferUsage.COPY_SRC)
        self.read(self._fence, 0, 4)

    # ------------------------------------------------------------------ memory
    def alloc(self, nbytes: int):
        if nbytes > self.max_binding:
            raise AdapterLimitError(
                f"a tensor of {nbytes:,} bytes exceeds this adapter's largest storage buffer "
                f"({self.max_binding:,} bytes, limit max-storage-buffer-binding-size on "
                f"{self.name}); split the tensor or use an adapter with a higher limit")
        return self.pool.acquire(max(nbytes, 4))

    def write(self, buf, data: np.ndarray, offset: int = 0) -> None:
        """Host -> device. Recorded commands that read `buf`'s old contents are submitted first,
        because queue writes run before the pending batch."""
        data = np.ascontiguousarray(data)
        nbytes = data.nbytes
        if nbytes == 0:
            return
        with self.lock:
            self._flush_locked()
            if nbytes % 4:
                pad = np.zeros(((nbytes + 3) // 4) * 4, dtype=np.uint8)
                pad[:nbytes] = data.view(np.uint8).reshape(-1)
                data = pad
            self.queue.write_buffer(buf, offset, data)

    def _staging_buffer(self, size: int):
        size = max(256, 1 << (size - 1).bit_length())
        with self.lock:
            free = self._staging.setdefault(size, [])
            if free:
                return free.pop()
        return self.wgpu.create_buffer(
            size=size, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def read_start(self, buf, offset: int, nbytes: int) -> "Download":
        """Device -> host, asynchronous: records the copy, submits, and starts mapping.
        Call ``.result()`` on the returned object (from any thread) to get the bytes."""
        start = offset & ~3
        end = (offset + nbytes + 3) & ~3
        size = max(end - start, 4)
        staging = self._staging_buffer(size)
        with self.lock:
            self._close_pass().copy_buffer_to_buffer(buf, start, staging, 0, size)
            self._flush_locked()
        promise = staging.map_async("READ_NOSYNC", 0, size)
        return Download(self, staging, promise, offset - start, nbytes, size)

    def read(self, buf, offset: int, nbytes: int) -> bytes:
        if nbytes == 0:
            return b""
        return self.read_start(buf, offset, nbytes).result()

    def read_array(self, buf, offset: int, count: int, dtype) -> np.ndarray:
        """Device -> host straight into a fresh numpy array (one memcpy out of the mapping)."""
        dtype = np.dtype(dtype)
        if count == 0:
            return np.empty(0, dtype)
        return self.read_start(buf, offset, count * dtype.itemsize).array(dtype)

    def _return_staging(self, staging) -> None:
        with self.lock:
            self._staging.setdefault(staging.size, []).append(staging)


class Download:
    def __init__(self, device, staging, promise, skip, nbytes, size):
        self._d, self._s, self._p = device, staging, promise
        self._skip, self._n, self._size = skip, nbytes, size

    def _take(self, convert):
        self._p.sync_wait()
        mv = self._s.read_mapped(0, self._size, copy=False)
        try:
            view = np.frombuffer(mv, dtype=np.uint8)[self._skip:self._skip + self._n]
            return convert(view)
        finally:
            del mv
            self._s.unmap()
            self._d._return_staging(self._s)

    def result(self) -> bytes:
        return self._take(lambda v: v.tobytes())

    def array(self, dtype) -> np.ndarray:
        return self._take(lambda v: v.view(dtype).copy())


def groups_1d(n: int, wg: int = 256) -> tuple:
    g = (n + wg - 1) // wg
    if g <= MAX_WG_PER_DIM:
        return (g, 1, 1)
    gy = (g + MAX_WG_PER_DIM - 1) // MAX_WG_PER_DIM
    gx = (g + gy - 1) // gy
    return (gx, gy, 1)


def _pack(params) -> np.ndarray:
    out = np.zeros(len(params), dtype=np.uint32)
    for i, v in enumerate(params):
        if isinstance(v, (float, np.floating)):
            out[i] = np.float32(v).view(np.uint32)
        else:
            out[i] = np.int64(v) & 0xFFFFFFFF
    if len(out) > SLOT // 4:
        raise KernelError(f"{len(out)} parameter words exceed the {SLOT // 4}-word slot")
    return out
