"""Device: one wgpu device + queue, with its own pipeline cache, buffer pool and command batch.

Ops record into the open compute pass; the batch is submitted on readback, a full parameter
arena or ``synchronize()``. Per-op parameters go into 256-byte slots of one uniform arena uploaded
before the submit (recording never waits on the GPU); bind groups are cached per (layout,
buffers) with the slot as dynamic offset. Transfers: staging.HostTransfers. While ``recorder`` is
set (a ``wr.jit`` capture) the device also records what it runs.
"""
from __future__ import annotations

import functools
import re
import struct
import threading

import numpy as np
import wgpu

from . import submitter
from .asserts import DeviceAsserts
from .errors import AdapterLimitError, KernelError
from .kernels import Kernel
from .memory import MemoryGuard
from .native import MAP_WRITE, RawPass, RawTextureCopy, api, trusted_module
from .pool import BufferPool
from .profile import AdapterProfile
from .staging import HostTransfers
from .tuning import TUNING

SLOT = 256  # bytes of parameters per dispatch
# Dispatches per batch: the GPU starts on a step while the host records the rest (a GPT-mini
# step is ~200 dispatches), and the submit cost stays small.
ARENA_SLOTS = 128
MAX_WG_PER_DIM = 65535
BIND_GROUP_CACHE = 4096  # bind groups kept per device (keyed by layout + buffers)
_BINDING = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var<\s*(\w+)\s*(?:,\s*(\w+)\s*)?>")
_TEXTURE = re.compile(r"@group\(0\)\s*@binding\((\d+)\)\s*var\s+\w+\s*:\s*"
                      r"(texture_2d<f32>|texture_storage_2d<rgba32float,\s*read>)")
# Texels a row of the operand textures (operand_texture): 16 KiB rows (a buffer-to-texture copy
# needs rows of a multiple of 256 bytes), quad q of a region at (q % TEX_W, q // TEX_W).
TEX_W = 1024
# Kernels bind the operand textures as read-only storage textures: llvmpipe 22.3 fetches a
# sampled texture's texel through its generic path (a mip level per lane, the level's size and
# offset gathered lane by lane), a storage texture's without it (BENCHMARKS.md, CPU adapters).
# False: sampled textures (texture_2d), as before.
TEX_STORAGE = True


def texture_loader(name: str, binding: int, fn: str) -> str:
    """WGSL of operand texture ``name`` at ``binding`` and ``fn(q)``, its quad q (the texel at
    (q % TEX_W, q / TEX_W))."""
    xy = f"vec2<u32>(q & {TEX_W - 1}u, q >> {TEX_W.bit_length() - 1}u)"
    if TEX_STORAGE:
        return (f"@group(0) @binding({binding}) var {name}: texture_storage_2d<rgba32float, read>;"
                f"\nfn {fn}(q: u32) -> vec4<f32> {{ return textureLoad({name}, {xy}); }}")
    return (f"@group(0) @binding({binding}) var {name}: texture_2d<f32>;\n"
            f"fn {fn}(q: u32) -> vec4<f32> {{ return textureLoad({name}, {xy}, 0); }}")
OPTIONAL_FEATURES = ("shader-f16", "subgroup", "timestamp-query")  # requested where offered
# Families that range-check every access themselves, compiled without wgpu's injected checks
# (which block unrolling: the 4096 matmul ran 24.7 vs 31.7 TFLOP/s on an H100).
TRUSTED_FAMILIES = frozenset({"matmul", "flash_attention2"})
# Lavapipe (Mesa 22.x) inlines uniform values that steer loops into a specialised copy of the
# shader at every dispatch and never frees it (+512 KB per matmul dispatch), so
# on CPU adapters these families read parameters from storage (other families stay on uniforms,
# which llvmpipe reads faster: a CNN step took 1.37x longer with every family on storage).
PARAMS_IN_STORAGE = frozenset({"matmul", "matmul_cpu"})
_PARAMS_UNIFORM = "var<uniform> PRM"
_PARAMS_STORAGE = "var<storage, read> PRM"


class Device(HostTransfers):
    def __init__(self, index: int, adapter, logical: int = 0, adapter_index: int | None = None):
        self.index = index
        self.host_index = index  # its place on the host (pin_local: the rank's adapter's)
        self.adapter = adapter
        self.adapter_index = adapter_index  # its adapter's place in `wgrumus devices`' list
        self.logical = logical  # k-th logical device on the same adapter
        info = adapter.info
        self.name = f"{info.get('device') or 'adapter'} ({info.get('backend_type', '?')})"
        if logical:
            self.name += f" #{logical}"
        self.adapter_info = dict(info)
        feats = [f for f in OPTIONAL_FEATURES if f in adapter.features]
        limits = {k: v for k, v in adapter.limits.items() if isinstance(v, int) and v > 0}
        self.wgpu = adapter.request_device_sync(required_features=feats, required_limits=limits,
                                                label=f"wgrumus:{index}")
        self.queue = self.wgpu.queue
        self.features = frozenset(self.wgpu.features)
        self.profile = AdapterProfile.of(self.adapter_info, self.features)
        cpu = self.profile.cpu  # memory is host memory
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
        self._textures: dict = {}  # (slot, height) -> (texture, view): operand_texture
        self._slots = 0
        self._encoder = None
        self._pass = None
        self._init_staging()
        self._fence = None
        self.raw_pass = RawPass.create()
        self.raw_copy = RawTextureCopy.create()
        self.timer = None  # the GpuTimer timing this device's passes, if any
        self.asserts = DeviceAsserts(self.wgpu)  # device-side index checks, raised on reads
        self.recorder = None  # the capture.Recording of an open wr.jit capture, if any
        self.submitter = None  # CPU adapters: the thread replays are handed to (submitter.py)
        self.dispatches = 0
        self.replays = 0  # wr.jit replays run: they write buffers without storage version bumps
        self.submits = 0
        self.last_submission = None  # index of the latest submit (None: wgpu-py gives none)

    def __repr__(self):
        return f"Device({self.index}: {self.name})"

    def pipeline(self, kernel: Kernel, nbuf: int | None = None):
        """(pipeline, bind group layout, dynamic): an explicit layout (dynamic parameter offset:
        one bind group per buffer set) where the source's bindings parse, else wgpu's auto."""
        key = (kernel, nbuf)
        p = self._pipelines.get(key)
        if p is None:
            src = kernel.source()
            storage = kernel.family in self.params_in_storage
            if storage:
                src = src.replace(_PARAMS_UNIFORM, _PARAMS_STORAGE)
            try:
                module = None
                if kernel.family in TRUSTED_FAMILIES:
                    module = trusted_module(self.wgpu, src, kernel.family)
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
        decl.update((int(b), ("texture", kind)) for b, kind in _TEXTURE.findall(src))
        params = ("storage", "read") if storage_params else ("uniform", "")
        if decl.get(0) != params or any(decl.get(i, ("",))[0] not in ("storage", "texture")
                                        for i in range(1, nbuf + 1)):
            return None
        stage = wgpu.ShaderStage.COMPUTE
        entries = [{"binding": 0, "visibility": stage,
                    "buffer": {"type": wgpu.BufferBindingType.read_only_storage
                               if storage_params else wgpu.BufferBindingType.uniform,
                               "has_dynamic_offset": True}}]
        for i in range(1, nbuf + 1):
            if decl[i][0] == "texture":
                entries.append({"binding": i, "visibility": stage, "texture": {
                    "sample_type": wgpu.TextureSampleType.unfilterable_float}}
                    if decl[i][1].startswith("texture_2d") else
                    {"binding": i, "visibility": stage, "storage_texture": {
                        "access": wgpu.StorageTextureAccess.read_only,
                        "format": wgpu.TextureFormat.rgba32float}})
                continue
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
            bg = self.wgpu.create_bind_group(layout=layout,
                                             entries=bind_entries(self._arena, 0, buffers))
            self._bind_groups[key] = bg
        return bg

    def begin_pass(self, encoder):
        """A compute pass on ``encoder`` (this device's), timed while a GpuTimer is open."""
        writes = self.timer._pass_writes() if self.timer is not None else None
        return (encoder.begin_compute_pass(timestamp_writes=writes) if writes
                else encoder.begin_compute_pass())

    def _open_pass(self):
        if self._encoder is None:
            self._encoder = self.wgpu.create_command_encoder()
        if self._pass is None:
            self._pass = self.begin_pass(self._encoder)
            if self.raw_pass is not None:
                self.raw_pass.begin(self._pass)
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
        """Record one dispatch of ``buffers`` (or texture views) at 1..n and up to 64 parameter
        words. refresh: a callable giving words that change per step (bias corrections) anew,
        which a replay calls instead of reusing the captured words."""
        gx, gy, gz = groups
        if gx == 0 or gy == 0 or gz == 0:
            return
        if max(gx, gy, gz) > MAX_WG_PER_DIM:
            raise KernelError(f"dispatch {groups} exceeds {MAX_WG_PER_DIM} workgroups per "
                              "dimension")
        with self.lock:
            pipe, layout, dynamic = self.pipeline(kernel, len(buffers))
            if self._slots == ARENA_SLOTS:
                self.flush_locked()
            slot = self._slots
            self._slots += 1
            pack_words(self._params_bytes, slot * SLOT, params)
            if self.recorder is not None:
                self.recorder.dispatch(pipe, layout, dynamic, buffers,
                                       bytes(self._params_bytes[slot * SLOT:(slot + 1) * SLOT]),
                                       groups, refresh, written_bindings(kernel))
            cp = self._open_pass()
            if dynamic and self.raw_pass is not None:
                self.raw_pass.dispatch(pipe, self._bind_group(layout, buffers), slot * SLOT,
                                   gx, gy, gz)
                self.dispatches += 1
                return
            if self.raw_pass is not None:
                self.raw_pass.begin(cp)  # the pipeline set below is not the one it remembers
            cp.set_pipeline(pipe)
            if dynamic:
                cp.set_bind_group(0, self._bind_group(layout, buffers), [slot * SLOT])
            else:
                cp.set_bind_group(0, self.wgpu.create_bind_group(
                    layout=layout, entries=bind_entries(self._arena, slot * SLOT, buffers)))
            cp.dispatch_workgroups(gx, gy, gz)
            self.dispatches += 1

    def operand_textures(self):
        """(texture, view) of every operand texture made so far (replays map views back)."""
        return list(self._textures.values())

    def operand_texture(self, slot: int, buffer, start: int, texels: int):
        """A view of operand texture ``slot`` holding ``texels`` texels of ``buffer`` from byte
        ``start``. The copy is recorded into the batch after earlier dispatches (wgpu orders
        their reads first), so one texture per (slot, height) serves every kernel."""
        rows = -(-texels // TEX_W)
        height = 1 << (rows - 1).bit_length()  # few distinct textures
        with self.lock:
            key = (slot, height)
            tv = self._textures.get(key)
            if tv is None:
                tv = self._textures[key] = self.new_operand_texture(height)
            enc = self._close_pass()
            full, rest = divmod(texels, TEX_W)
            for y, n, w in ((0, full, TEX_W), (full, 1 if rest else 0, rest)):
                if not n:
                    continue
                region = (buffer, start + y * TEX_W * 16, TEX_W * 16, tv[0], y, w, n)
                if self.recorder is not None:
                    self.recorder.texture_copy(*region)
                (self.raw_copy.copy if self.raw_copy is not None else copy_to_texture)(
                    enc, *region)
        return tv[1]

    def new_operand_texture(self, height: int):
        """(texture, view): an rgba32float TEX_W x ``height`` operand texture."""
        tex = self.wgpu.create_texture(
            size=(TEX_W, height, 1), format=wgpu.TextureFormat.rgba32float,
            usage=wgpu.TextureUsage.TEXTURE_BINDING | wgpu.TextureUsage.STORAGE_BINDING
            | wgpu.TextureUsage.COPY_DST)
        return tex, tex.create_view()

    def dispatch_1d(self, kernel: Kernel, buffers, params, n: int, wg: int = 256,
                    refresh=None) -> None:
        """Launch ceil(n / wg) workgroups, folded into (x, y) so any n fits the per-dim limit."""
        self.dispatch(kernel, buffers, params, groups_1d(n, wg), refresh)

    def copy(self, src, src_off: int, dst, dst_off: int, nbytes: int) -> None:
        with self.lock:
            if self.recorder is not None:
                self.recorder.copy(src, src_off, dst, dst_off, nbytes)
            self._close_pass().copy_buffer_to_buffer(src, src_off, dst, dst_off, nbytes)

    def replay_submitter(self):
        """The submission thread for replays (CPU adapters; made on first use), else None."""
        on = self.profile.cpu if TUNING.submitter is None else TUNING.submitter
        if on and self.submitter is None:
            with self.lock:
                if self.submitter is None:
                    self.submitter = submitter.Submitter(self.name)
        return self.submitter if on else None

    def drain(self) -> None:
        """Wait until queued replays are submitted; raises a failure of theirs."""
        if self.submitter is not None:
            self.submitter.drain()

    def flush_locked(self):
        """Submit the recorded batch (the caller holds ``lock``; replays and timers call it)."""
        if self._encoder is None:
            return
        self.drain()  # eager work goes behind the queued replays
        if self._pass is not None:
            self._pass.end()
            self._pass = None
        if self._slots:
            self.queue.write_buffer(self._arena, 0, self._params[:self._slots])
            self._slots = 0
        cb = self._encoder.finish()
        self._encoder = None
        self.submit(cb)
        # The mapping resolves once this batch's copies out of the buffer have run.
        for st in self._upload_used:
            self._return_upload(st, api().map_async(st, MAP_WRITE, st.size,
                                                    self.last_submission))
        self._upload_used = []

    def submit(self, command_buffer) -> None:
        """Every submit of this device's work goes through here (records its index)."""
        self.last_submission = api().submit(self.queue, command_buffer)
        self.submits += 1

    def flush(self) -> None:
        """Submit the recorded batch without waiting for it."""
        with self.lock:
            self.flush_locked()

    @property
    def blocking_waits(self) -> bool:
        """Whether waits for this device's GPU block (runtime/tuning.py ``blocking_waits``)."""
        b = TUNING.blocking_waits
        return self.profile.cpu if b is None else b

    def synchronize(self) -> None:
        """Submit the batch and wait until the GPU has finished all work of this device."""
        # Queue work runs in order: once a copy recorded after everything else is mapped, the GPU
        # is done with all earlier work of this device.
        with self.lock:
            if self._fence is None:
                self._fence = self.wgpu.create_buffer(size=4, usage=wgpu.BufferUsage.COPY_DST
                                                      | wgpu.BufferUsage.COPY_SRC)
        self.read(self._fence, 0, 4)

    def alloc(self, nbytes: int):
        if nbytes > self.max_binding:
            raise AdapterLimitError(
                f"a tensor of {nbytes:,} bytes exceeds this adapter's largest storage buffer "
                f"({self.max_binding:,} bytes, limit max-storage-buffer-binding-size on "
                f"{self.name}); split the tensor or use an adapter with a higher limit")
        return self.pool.acquire(max(nbytes, 4))


@functools.cache
def written_bindings(kernel: Kernel):
    """The bindings ``kernel`` declares read_write (None: unparsed, all count as written)."""
    decl = _BINDING.findall(kernel.source())
    return frozenset(int(b) for b, _, access in decl if access == "read_write") if decl else None


def bind_entries(arena, offset: int, buffers) -> list:
    """Bind group entries: the parameter slot of ``arena`` at 0, buffers or views at 1..n."""
    return [{"binding": 0, "resource": {"buffer": arena, "offset": offset, "size": SLOT}}] + [
        {"binding": i, "resource": b} if isinstance(b, wgpu.GPUTextureView) else
        {"binding": i, "resource": {"buffer": b, "offset": 0, "size": b.size}}
        for i, b in enumerate(buffers, 1)]


def copy_to_texture(enc, buffer, offset: int, bytes_per_row: int, texture, y: int, width: int,
                    rows: int) -> None:
    """A buffer-to-texture copy through wgpu-py's API (native.RawTextureCopy: the C call)."""
    enc.copy_buffer_to_texture(
        {"buffer": buffer, "offset": offset, "bytes_per_row": bytes_per_row,
         "rows_per_image": rows}, {"texture": texture, "origin": (0, y, 0)}, (width, rows, 1))


def groups_1d(n: int, wg: int = 256) -> tuple:
    g = (n + wg - 1) // wg
    if g <= MAX_WG_PER_DIM:
        return (g, 1, 1)
    gy = (g + MAX_WG_PER_DIM - 1) // MAX_WG_PER_DIM
    gx = (g + gy - 1) // gy
    return (gx, gy, 1)


_FORMATS: dict = {}  # the value types of a parameter list -> its struct format


def pack_words(buf, offset: int, params) -> None:
    """Floats as f32 bits, ints as their low 32 bits, into ``buf`` at ``offset`` (the struct
    format is cached per list of value types)."""
    types = tuple(map(type, params))
    fmt = _FORMATS.get(types)
    if fmt is None:
        if len(params) > SLOT // 4:
            raise KernelError(f"{len(params)} parameter words exceed the {SLOT // 4}-word slot")
        fmt = _FORMATS[types] = "<" + "".join(
            "f" if issubclass(t, (float, np.floating)) else "I" for t in types)
    try:
        struct.pack_into(fmt, buf, offset, *params)
    except struct.error:  # a negative (or wider) int: its low 32 bits
        struct.pack_into(fmt, buf, offset, *[
            v if isinstance(v, (float, np.floating)) else int(v) & 0xFFFFFFFF for v in params])
