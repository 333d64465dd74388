"""Device: one wgpu device + queue, with its own pipeline cache, buffer pool and command batch.

Ops record dispatches into the device's open compute pass; the batch is submitted on readback,
when the parameter arena is full, or on ``synchronize()``. Per-op parameters (shapes, strides,
scalars) go into 256-byte slots of one uniform arena buffer that is uploaded right before the
batch's submit, so recording an op never waits on the GPU. Bind groups are cached per
(layout, buffers), the slot being a dynamic offset. Staging: uploads are copied (by several
threads) into persistently mapped MAP_WRITE buffers and recorded as buffer copies in the batch;
large downloads return a view of the mapped MAP_READ buffer itself (zero host copies).
While ``recorder`` is set (a ``wr.jit`` capture, see capture.py) the device also records the
dispatches, copies and writes it runs, and refuses reads back to the host.
"""
from __future__ import annotations

import os
import re
import struct
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import wgpu

from .asserts import FLAG_BYTES, DeviceAsserts, raise_if_set
from .capture import refuse
from .errors import AdapterLimitError, KernelError
from .kernels import Kernel
from .memory import MemoryGuard
from .native import submit
from .pool import BufferPool

SLOT = 256  # bytes of parameters per dispatch
MAPPED_WRITE_MIN = 1 << 16  # uploads from this size go through mapped staging buffers
READ_CHUNK = 64 << 20  # downloads into a given array are split so copy-out overlaps the DMA
READ_INFLIGHT = 2  # chunks of such a download in flight at once
ZERO_COPY_MIN = 1 << 20  # fresh arrays from this size are views of their staging buffer
WRITE_CHUNK = 1 << 30  # uploads above twice this are split (bounds one staging buffer)
COPY_THREADS = min(16, os.cpu_count() or 1)  # threads of one large host copy
PAR_COPY_MIN = 4 << 20  # host copies from this size are split over threads
STAGING_CACHE = 1 << 30  # bytes of idle staging buffers kept per device and direction
# Dispatches per submitted batch (the arena holds one batch's parameters). Small enough that the
# GPU starts on a step while the host still records it (a GPT-mini step is ~200 dispatches),
# large enough that the submit cost stays small.
ARENA_SLOTS = 128
MAX_WG_PER_DIM = 65535
BIND_GROUP_CACHE = 4096  # bind groups kept per device (keyed by layout + buffers)
_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>")
_OPTIONAL_FEATURES = ("shader-f16", "timestamp-query", "subgroup")
# Kernel families whose every access is range-checked by the kernel itself: compiled without
# wgpu's injected bounds clamps and loop-bounding counters, which block loop unrolling and keep
# register tiles out of registers (the 4096 matmul: 24.7 vs 31.7 TFLOP/s on an H100).
TRUSTED_FAMILIES = frozenset({"matmul"})
# Lavapipe (Mesa 22.x) "inlines" uniform values that steer loops and branches: when the first
# dispatch of a pipeline shows that inlining halves the shader, it compiles a specialised copy at
# every later dispatch (the uniform binding moved) and never frees it: +512 KB per matmul
# dispatch at M = 128, +1.1 MB per training step of a small MLP (issue 15, item 9). It inlines
# uniform buffers only, so on CPU adapters these families read their parameters from a
# read-only storage buffer (the same speed for matmul; the other families stay on uniforms,
# which llvmpipe reads faster: a CNN step took 1.37x longer with every family on storage).
PARAMS_IN_STORAGE = frozenset({"matmul", "matmul_cpu"})
_PARAMS_UNIFORM = "var<uniform> PRM"
_PARAMS_STORAGE = "var<storage, read> PRM"


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
        cpu = str(info.get("adapter_type", "")).lower() == "cpu"  # memory is host memory
        feats = [f for f in _OPTIONAL_FEATURES if f in adapter.features]
        limits = {k: v for k, v in adapter.limits.items() if isinstance(v, int) and v > 0}
        self.wgpu = adapter.request_device_sync(required_features=feats, required_limits=limits,
                                                label=f"wgrumus:{index}")
        self.queue = self.wgpu.queue
        self.features = frozenset(self.wgpu.features)
        self.limits = dict(self.wgpu.limits)
        self.max_binding = min(self.limits["max-storage-buffer-binding-size"],
                               self.limits["max-buffer-size"])
        self.memory = MemoryGuard(self.name, cpu, self.synchronize)
        self.pool = BufferPool(self.wgpu, guard=self.memory)
        self.lock = threading.RLock()
        self._pipelines: dict = {}
        self.params_in_storage = PARAMS_IN_STORAGE if cpu else frozenset()
        self._arena = self.wgpu.create_buffer(
            size=SLOT * ARENA_SLOTS, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
            | (wgpu.BufferUsage.STORAGE if cpu else 0))
        self._params = np.zeros((ARENA_SLOTS, SLOT // 4), dtype=np.uint32)
        self._params_bytes = memoryview(self._params).cast("B")
        self._bind_groups: dict = {}
        self._slots = 0
        self._encoder = None
        self._pass = None
        self._staging: dict[int, list] = {}  # MAP_READ buffers, idle, by size
        self._upload: dict[int, list] = {}  # MAP_WRITE buffers, (buffer, map promise), by size
        self._upload_used: list = []  # MAP_WRITE buffers copied from in the open batch
        self._staging_bytes = [0, 0]  # idle bytes cached: [read, write]
        self._fence = None
        self._raw = _RawPass.create()
        self._timer = None  # the GpuTimer timing this device's passes, if any
        self.asserts = DeviceAsserts(self.wgpu)  # device-side index checks, raised on reads
        self.recorder = None  # the capture.Recording of an open wr.jit capture, if any
        self.dispatches = 0
        self.submits = 0
        self.last_submission = None  # index of the latest submit (None: wgpu-py gives none)

    def __repr__(self):
        return f"Device({self.index}: {self.name})"

    # ------------------------------------------------------------------ pipelines
    def pipeline(self, kernel: Kernel, nbuf: int | None = None):
        """(pipeline, bind group layout, dynamic) for a kernel bound with nbuf storage buffers.
        The layout is explicit where the shader's bindings can be read off its source: the
        parameter slot then is a dynamic offset, so one bind group serves every dispatch on
        the same buffers. Otherwise the layout is wgpu's automatic one."""
        key = (kernel.key, nbuf)
        p = self._pipelines.get(key)
        if p is None:
            src = kernel.source()
            storage = kernel.family in self.params_in_storage
            if storage:
                src = src.replace(_PARAMS_UNIFORM, _PARAMS_STORAGE)
            try:
                module = None
                if kernel.family in TRUSTED_FAMILIES:
                    module = _trusted_module(self.wgpu, src, kernel.family)
                if module is None:
                    module = self.wgpu.create_shader_module(code=src, label=kernel.family)
                compute = {"module": module, "entry_point": kernel.entry}
                p = self._explicit_pipeline(src, nbuf, compute, storage)
                if p is None:
                    pipe = self.wgpu.create_compute_pipeline(layout=wgpu.AutoLayoutMode.auto,
                                                             compute=compute)
                    p = (pipe, pipe.get_bind_group_layout(0), False)
            except Exception as e:  # a wgrumus bug: show which kernel and specialisation
                raise KernelError(f"kernel {kernel.family}:{kernel.entry} {dict(kernel.defines)} "
                                  f"failed to build on {self.name}: {e}") from e
            self._pipelines[key] = p
        return p

    def _explicit_pipeline(self, src: str, nbuf, compute, storage_params: bool = False):
        if nbuf is None:
            return None
        decl = {int(b): (space, access) for b, space, access in _BINDING.findall(src)}
        params = ("storage", "read") if storage_params else ("uniform", "")
        if decl.get(0) != params or any(
                decl.get(i, ("",))[0] != "storage" for i in range(1, nbuf + 1)):
            return None
        stage = wgpu.ShaderStage.COMPUTE
        entries = [{"binding": 0, "visibility": stage,
                    "buffer": {"type": wgpu.BufferBindingType.read_only_storage
                               if storage_params else wgpu.BufferBindingType.uniform,
                               "has_dynamic_offset": True}}]
        for i in range(1, nbuf + 1):
            rw = decl[i][1] == "read_write"
            entries.append({"binding": i, "visibility": stage, "buffer": {
                "type": wgpu.BufferBindingType.storage if rw
                else wgpu.BufferBindingType.read_only_storage}})
        try:
            bgl = self.wgpu.create_bind_group_layout(entries=entries)
            layout = self.wgpu.create_pipeline_layout(bind_group_layouts=[bgl])
            return (self.wgpu.create_compute_pipeline(layout=layout, compute=compute), bgl, True)
        except Exception:  # e.g. an entry point that leaves a declared binding unused
            return None

    def _bind_group(self, layout, buffers):
        """Bind group for a dynamic-offset layout, cached by (layout, buffers)."""
        key = (layout, *buffers)
        bg = self._bind_groups.get(key)
        if bg is None:
            if len(self._bind_groups) >= BIND_GROUP_CACHE:
                self._bind_groups.clear()
            entries = [{"binding": 0, "resource": {"buffer": self._arena, "offset": 0,
                                                    "size": SLOT}}]
            for i, b in enumerate(buffers):
                entries.append({"binding": i + 1, "resource": {"buffer": b, "offset": 0,
                                                                "size": b.size}})
            bg = self.wgpu.create_bind_group(layout=layout, entries=entries)
            self._bind_groups[key] = bg
        return bg

    # ------------------------------------------------------------------ recording
    def _open_pass(self):
        if self._encoder is None:
            self._encoder = self.wgpu.create_command_encoder()
        if self._pass is None:
            writes = self._timer._pass_writes() if self._timer is not None else None
            self._pass = (self._encoder.begin_compute_pass(timestamp_writes=writes) if writes
                          else self._encoder.begin_compute_pass())
            if self._raw is not None:
                self._raw.begin(self._pass)
        return self._pass

    def _close_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._encoder is None:
            self._encoder = self.wgpu.create_command_encoder()
        return self._encoder

    def dispatch(self, kernel: Kernel, buffers, params=(), groups=(1, 1, 1),
                 refresh=None) -> None:
        """Record one dispatch. buffers: wgpu buffers bound at 1..n; params: up to 64 words
        (ints, or np.float32/float values, stored bit-cast). refresh: for words that change
        from step to step (an optimizer's bias corrections), a callable giving the params anew;
        a replayed capture calls it instead of reusing the captured words."""
        gx, gy, gz = groups
        if gx == 0 or gy == 0 or gz == 0:
            return
        if max(gx, gy, gz) > MAX_WG_PER_DIM:
            raise KernelError(f"dispatch {groups} exceeds {MAX_WG_PER_DIM} workgroups per "
                              "dimension")
        fmt, vals = _pack(params)
        with self.lock:
            pipe, layout, dynamic = self.pipeline(kernel, len(buffers))
            if self._slots == ARENA_SLOTS:
                self._flush_locked()
            slot = self._slots
            self._slots += 1
            struct.pack_into(fmt, self._params_bytes, slot * SLOT, *vals)
            if self.recorder is not None:
                self.recorder.dispatch(pipe, layout, dynamic, buffers,
                                       bytes(self._params_bytes[slot * SLOT:(slot + 1) * SLOT]),
                                       groups, refresh)
            cp = self._open_pass()
            if dynamic and self._raw is not None:
                self._raw.dispatch(pipe, self._bind_group(layout, buffers), slot * SLOT,
                                   gx, gy, gz)
                self.dispatches += 1
                return
            if self._raw is not None:
                self._raw.begin(cp)  # the pipeline set below is not the one it remembers
            cp.set_pipeline(pipe)
            if dynamic:
                cp.set_bind_group(0, self._bind_group(layout, buffers), [slot * SLOT])
            else:
                entries = [{"binding": 0, "resource": {"buffer": self._arena,
                                                        "offset": slot * SLOT, "size": SLOT}}]
                for i, b in enumerate(buffers):
                    entries.append({"binding": i + 1, "resource": {"buffer": b, "offset": 0,
                                                                    "size": b.size}})
                cp.set_bind_group(0, self.wgpu.create_bind_group(layout=layout,
                                                                 entries=entries))
            cp.dispatch_workgroups(gx, gy, gz)
            self.dispatches += 1

    def dispatch_1d(self, kernel: Kernel, buffers, params, n: int, wg: int = 256,
                    refresh=None) -> None:
        """Launch ceil(n / wg) workgroups, folded into (x, y) so any n fits the per-dim limit."""
        self.dispatch(kernel, buffers, params, groups_1d(n, wg), refresh)

    def copy(self, src, src_off: int, dst, dst_off: int, nbytes: int) -> None:
        with self.lock:
            if self.recorder is not None:
                self.recorder.copy(src, src_off, dst, dst_off, nbytes)
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
        self._submit(cb)
        # The mapping resolves once this batch's copies out of the buffer have run.
        for st in self._upload_used:
            self._return_upload(st, st.map_async("WRITE"))
        self._upload_used = []

    def _submit(self, command_buffer) -> None:
        """Every submit of this device's work (batches and wr.jit replays) goes through here."""
        self.last_submission = submit(self.queue, command_buffer)
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
        """Host -> device. Large data is copied (by several threads) into a persistently mapped
        MAP_WRITE staging buffer, and the copy into `buf` is recorded into the open batch, so
        it runs in order with the recorded ops and needs no flush. Small data goes through
        queue.write_buffer, which runs before the open batch: that batch is submitted first."""
        data = np.ascontiguousarray(data)
        nbytes = data.nbytes
        if nbytes == 0:
            return
        raw = data.reshape(-1).view(np.uint8)
        if nbytes >= MAPPED_WRITE_MIN and nbytes % 4 == 0 and offset % 4 == 0:
            # Large uploads go in chunks, each submitted at once: filling the next chunk's
            # staging buffer overlaps the DMA of the previous one.
            step = WRITE_CHUNK if nbytes > 2 * WRITE_CHUNK else nbytes
            for lo in range(0, nbytes, step):
                self._write_mapped(buf, raw[lo:lo + step], offset + lo)
            return
        with self.lock:
            self._flush_locked()
            if nbytes % 4:
                pad = np.zeros(((nbytes + 3) // 4) * 4, dtype=np.uint8)
                pad[:nbytes] = raw
                raw = pad
            if self.recorder is not None:
                self.recorder.write(buf, offset, raw)
            self.queue.write_buffer(buf, offset, raw)

    def _write_mapped(self, buf, raw: np.ndarray, offset: int) -> None:
        up = self.write_start(raw.nbytes)
        try:
            par_copy(up.view(np.uint8), raw)
        except BaseException:
            up.cancel()
            raise
        up.commit(buf, offset)

    def write_start(self, nbytes: int) -> "Upload":
        """Host -> device in two steps: fill ``.view(dtype)`` (mapped staging memory; write it,
        do not read it back), then ``.commit(buf, offset)`` records the copy into ``buf``."""
        if nbytes <= 0 or nbytes % 4:
            raise ValueError(f"write_start: {nbytes} bytes; staged uploads move a positive "
                             "multiple of 4 bytes (pad the data, or use write())")
        return Upload(self, self._upload_buffer(nbytes), nbytes)

    def _commit_upload(self, st, buf, offset: int, nbytes: int) -> None:
        with self.lock:
            self._close_pass().copy_buffer_to_buffer(st, 0, buf, offset, nbytes)
            self._upload_used.append(st)
            # Submit at once from 1 MiB: the staging buffer goes back to the pool (re-mapping
            # behind the copy) instead of the batch holding one new buffer per upload.
            if nbytes >= (1 << 20) or len(self._upload_used) >= 64:
                self._flush_locked()

    def _upload_buffer(self, nbytes: int):
        """A MAP_WRITE staging buffer of at least nbytes, mapped and ready to fill."""
        size = staging_size(nbytes)
        with self.lock:
            # Two buffers rotate per size: the older one's copy has had a whole chunk's time
            # to finish, so filling it does not wait on the copy just submitted.
            free = self._upload.get(size)
            item = free.pop(0) if free and len(free) >= 2 else None
            if item is not None:
                self._staging_bytes[1] -= size
        if item is None:
            return self.memory.create(self.wgpu, size, mapped_at_creation=True,
                                      usage=wgpu.BufferUsage.MAP_WRITE | wgpu.BufferUsage.COPY_SRC)
        st, promise = item
        promise.sync_wait()
        return st

    def _return_upload(self, st, promise) -> None:
        if self._staging_bytes[1] + st.size > STAGING_CACHE:
            return  # dropped: wgpu frees it once the pending copy is done
        self._staging_bytes[1] += st.size
        self._upload.setdefault(st.size, []).append((st, promise))

    def _staging_buffer(self, size: int):
        size = staging_size(size)
        with self.lock:
            free = self._staging.setdefault(size, [])
            if free:
                self._staging_bytes[0] -= size
                return free.pop()
        return self.memory.create(self.wgpu, size,
                                  usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST)

    def read_start(self, buf, offset: int, nbytes: int) -> "Download":
        """Device -> host, asynchronous: records the copy, submits, and starts mapping.
        Call ``.result()`` on the returned object (from any thread) to get the bytes."""
        if self.recorder is not None:
            refuse("reading a tensor back to the host (.item(), .numpy(), float(), bool(), "
                   "print, or a device synchronize)",
                   "its value is taken once at capture and would be stale in every replay, as "
                   "would Python control flow on it")
        start = offset & ~3
        end = (offset + nbytes + 3) & ~3
        size = max(end - start, 4)
        with self.lock:
            check = self.asserts.take_armed()  # the device-side assert flag rides along
            mapped = (size + 7) // 8 * 8 + FLAG_BYTES if check else size  # (8-aligned ranges)
            staging = self._staging_buffer(mapped)
            enc = self._close_pass()
            enc.copy_buffer_to_buffer(buf, start, staging, 0, size)
            if check:
                self.asserts.record_copy(enc, staging, mapped - FLAG_BYTES)
            self._flush_locked()
        promise = staging.map_async("READ_NOSYNC", 0, mapped)
        return Download(self, staging, promise, offset - start, nbytes, size, check)

    def read(self, buf, offset: int, nbytes: int) -> bytes:
        if nbytes == 0:
            return b""
        return self.read_start(buf, offset, nbytes).result()

    def read_array(self, buf, offset: int, count: int, dtype, out: np.ndarray | None = None):
        """Device -> host. Without `out`, a large result is the staging buffer itself, kept
        mapped until the array dies (no host copy: the DMA is the whole cost). Into `out`, large
        reads are split into chunks, each submitted on its own, so copying one chunk out of
        its mapping (several threads) overlaps the transfer of the next."""
        dtype = np.dtype(dtype)
        if out is None and count * dtype.itemsize >= ZERO_COPY_MIN:
            return self.read_start(buf, offset, count * dtype.itemsize).mapped_array(dtype)
        if out is None:
            out = np.empty(count, dtype)
        elif out.dtype != dtype or out.size != count or not out.flags.c_contiguous:
            raise ValueError(f"read_array: out must be a contiguous {dtype} array of {count} "
                             f"elements, got {out.dtype} {out.shape}")
        if count == 0:
            return out
        flat = out.reshape(-1).view(np.uint8)
        nbytes = flat.nbytes
        step = READ_CHUNK if nbytes > 2 * READ_CHUNK else nbytes
        pending, nxt = [], 0
        while pending or nxt < nbytes:
            while nxt < nbytes and len(pending) < READ_INFLIGHT:
                pending.append((nxt, self.read_start(buf, offset + nxt, min(step, nbytes - nxt))))
                nxt += step
            lo, d = pending.pop(0)
            d.into(flat[lo:lo + d.nbytes])
        return out

    def _return_staging(self, staging) -> None:
        with self.lock:
            if self._staging_bytes[0] + staging.size > STAGING_CACHE:
                return
            self._staging_bytes[0] += staging.size
            self._staging.setdefault(staging.size, []).append(staging)


class Download:
    """A device -> host copy in flight; take its bytes once (from any thread)."""

    def __init__(self, device, staging, promise, skip, nbytes, size, check=False):
        self._d, self._s, self._p = device, staging, promise
        self._skip, self.nbytes, self._size = skip, nbytes, size
        self._check = check  # the device-side assert flag follows the data (runtime/asserts.py)
        self._flag_at = (size + 7) // 8 * 8

    def _take(self, convert):
        self._p.sync_wait()
        flag = self._s.read_mapped(self._flag_at, FLAG_BYTES) if self._check else None
        mv = self._s.read_mapped(0, self._size, copy=False)
        try:
            view = np.frombuffer(mv, dtype=np.uint8)[self._skip:self._skip + self.nbytes]
            out = convert(view)
        finally:
            del mv
            self._s.unmap()
            self._d._return_staging(self._s)
        if flag is not None:
            raise_if_set(flag)
        return out

    def result(self) -> bytes:
        return self._take(lambda v: v.tobytes())

    def array(self, dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        out = np.empty(self.nbytes // dtype.itemsize, dtype)
        self.into(out.view(np.uint8))
        return out

    def mapped_array(self, dtype) -> np.ndarray:
        """A writable array over the mapped staging memory itself; the buffer is unmapped and
        pooled again when the array and every view of it are garbage."""
        self._p.sync_wait()
        if self._check:
            try:
                raise_if_set(self._s.read_mapped(self._flag_at, FLAG_BYTES))
            except Exception:
                self._s.unmap()
                self._d._return_staging(self._s)
                raise
        return np.asarray(_MappedHost(self._d, self._s, self._size, self._skip, self.nbytes,
                                      dtype))

    def into(self, out: np.ndarray) -> None:
        """Copy the bytes into a contiguous uint8 array of exactly nbytes."""
        self._take(lambda v: par_copy(out, v))


class Upload:
    """A mapped MAP_WRITE staging buffer being filled; ``commit`` or ``cancel`` it once."""

    def __init__(self, device, staging, nbytes: int):
        self._d, self._s, self.nbytes = device, staging, nbytes
        self._mv = staging._experimental_get_mapped_range(0, nbytes)

    def view(self, dtype) -> np.ndarray:
        return np.frombuffer(self._mv, dtype)

    def _unmap(self) -> None:
        if self._mv is None:
            raise RuntimeError("this upload was already committed or cancelled")
        self._mv = None
        self._s.unmap()

    def commit(self, buf, offset: int = 0) -> None:
        """Record the copy of the filled bytes into ``buf`` at ``offset``; views die here."""
        if self._d.recorder is not None and self._mv is not None:
            self._d.recorder.write(buf, offset, self._mv[:self.nbytes])
        self._unmap()
        self._d._commit_upload(self._s, buf, offset, self.nbytes)

    def cancel(self) -> None:
        """Give the staging buffer up without copying (after a failure)."""
        self._unmap()


class _MappedHost:
    """Owns a mapped staging range. numpy views collapse their base to this object (not to an
    intermediate array), so it lives exactly as long as some view of the data."""

    def __init__(self, device, staging, size: int, skip: int, nbytes: int, dtype):
        self._d, self._s = device, staging
        self._mv = staging._experimental_get_mapped_range(0, size)
        ptr = np.frombuffer(self._mv, np.uint8).ctypes.data + skip
        dtype = np.dtype(dtype)
        self.__array_interface__ = {"shape": (nbytes // dtype.itemsize,), "typestr": dtype.str,
                                    "data": (ptr, False), "version": 3}

    def __del__(self):
        try:
            self._mv = None
            self._s.unmap()
            self._d._return_staging(self._s)
        except Exception:  # interpreter shutdown: the device may be gone already
            pass


_COPY_POOL: list = []


def par_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """dst[:] = src for flat uint8 arrays; large copies are split over a few threads (numpy
    releases the GIL while copying: one core moved ~9 GB/s, eight ~29 GB/s on the H100 host)."""
    n = src.nbytes
    nt = COPY_THREADS
    if n < PAR_COPY_MIN or nt < 2:
        np.copyto(dst, src)
        return
    if not _COPY_POOL or _COPY_POOL[0]._max_workers < nt:
        _COPY_POOL[:] = [ThreadPoolExecutor(nt, thread_name_prefix="wgrumus-copy")]
    step = -(-n // nt)
    step = (step + 4095) & ~4095
    futs = [_COPY_POOL[0].submit(np.copyto, dst[i:i + step], src[i:i + step])
            for i in range(step, n, step)]
    np.copyto(dst[:step], src[:step])
    for f in futs:
        f.result()


def staging_size(nbytes: int) -> int:
    """Staging buffers come in power-of-two sizes (>= 256 B) so they are reused."""
    return max(256, 1 << (max(nbytes, 1) - 1).bit_length())


def _trusted_module(device, code: str, label: str):
    """wgpuDeviceCreateShaderModuleTrusted with no runtime checks, through wgpu-py's own cffi
    handles; None where this wgpu-py build lacks it (then the checked path is used)."""
    try:
        from wgpu.backends.wgpu_native import _api
        ffi, lib, libf = _api.ffi, _api.lib, _api.libf
        fn = libf.wgpuDeviceCreateShaderModuleTrusted
    except (ImportError, AttributeError):
        return None
    src = _api.new_struct_p("WGPUShaderSourceWGSL *", code=_api.to_c_string_view(code))
    src[0].chain.next = ffi.NULL
    src[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
    desc = _api.new_struct_p("WGPUShaderModuleDescriptor *",
                             nextInChain=ffi.cast("WGPUChainedStruct *", src),
                             label=_api.to_c_string_view(label))
    mid = fn(device._internal, desc, 0)
    if mid == ffi.NULL:
        return None
    return _api.GPUShaderModule(label, mid, device)


class _RawPass:
    """Records into the open compute pass through wgpu-native's C functions directly.

    wgpu-py wraps every call in Python error capturing and argument conversion, about a fifth of
    the host time of a small dispatch. Pass commands report no errors of their own (WebGPU
    defers them to ``finish()``, which still goes through wgpu-py), so nothing is lost. A
    pipeline already set in this pass is not set again."""

    def __init__(self, lib, ffi):
        self._set_pipeline = lib.wgpuComputePassEncoderSetPipeline
        self._set_bind_group = lib.wgpuComputePassEncoderSetBindGroup
        self._dispatch = lib.wgpuComputePassEncoderDispatchWorkgroups
        self._offset = ffi.new("uint32_t[1]")
        self._pass = self._pipe = None

    @classmethod
    def create(cls):
        if os.environ.get("WGRUMUS_CHECKED_PASS"):
            return None
        try:
            from wgpu.backends.wgpu_native import _api
            return cls(_api.lib, _api.ffi)
        except (ImportError, AttributeError):  # another wgpu-py layout: use its public API
            return None

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


def groups_1d(n: int, wg: int = 256) -> tuple:
    g = (n + wg - 1) // wg
    if g <= MAX_WG_PER_DIM:
        return (g, 1, 1)
    gy = (g + MAX_WG_PER_DIM - 1) // MAX_WG_PER_DIM
    gx = (g + gy - 1) // gy
    return (gx, gy, 1)


_FMT_CACHE: dict = {}


def _pack(params):
    """(struct format, values) that write the parameter words: floats as f32 bits, ints
    (also negative ones) as their low 32 bits."""
    n = len(params)
    if n > SLOT // 4:
        raise KernelError(f"{n} parameter words exceed the {SLOT // 4}-word slot")
    try:  # all ints: the common case, one pass
        return _FMT_CACHE[n], [v & 0xFFFFFFFF for v in params]
    except TypeError:
        pass
    except KeyError:
        _FMT_CACHE[n] = "<" + "I" * n
        return _pack(params)
    kinds = tuple(isinstance(v, (float, np.floating)) for v in params)
    fmt = _FMT_CACHE.get(kinds)
    if fmt is None:
        fmt = _FMT_CACHE[kinds] = "<" + "".join("f" if k else "I" for k in kinds)
    return fmt, [float(v) if k else int(v) & 0xFFFFFFFF for v, k in zip(params, kinds)]
