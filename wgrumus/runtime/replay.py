"""Replay of a capture.Recording with no Python per op beyond three C calls per dispatch.

Parameter words go once into a uniform buffer of the replay's own and bind groups are built once
against it; only slots with a ``refresh`` callable are rewritten per replay. Host writes become
copies out of constant buffers; operand-texture copies are grouped (texplan.py). Command buffers
are single-use in WebGPU, so each replay encodes anew. Host operations (``capture.host_op``) split
the replay into parts submitted around them; an async launch runs on while later parts are
submitted and only its join waits. On a CPU adapter a replay without host operations goes to the
submission thread (submitter.py). ``trace``: what the last run did, in order.
"""
from __future__ import annotations

import contextlib
import os
import threading
import time

import numpy as np
import wgpu

from . import texplan
from .device import SLOT, bind_entries, copy_to_texture, pack_words
from .errors import CaptureError
from .native import RawReplay, c_api

_PASS, _COPY, _TEX = RawReplay.PASS, RawReplay.COPY, RawReplay.TEXTURE
# One thread at a time encodes and submits a replay part: replica threads otherwise hand the
# interpreter lock over at every C call (two GPT-mini replicas on one H100: 10.4 ms a step pair
# against 8.1 with this lock). Never held across host operations (all-reduces wait for peers).
# With it, K replicas as threads encode one after another: K x the encode time of a step must fit
# in one step, and without it the encode loops still take turns on the interpreter lock, so
# threads stop scaling where that host time reaches the device time (processes do not share
# either). WGRUMUS_ENCODE_LOCK=0 drops the lock, to measure that on a GPU host.
_ENCODE = threading.Lock() if os.environ.get("WGRUMUS_ENCODE_LOCK", "1") != "0" \
    else contextlib.nullcontext()
# Texture copies grouped into blocks before few passes, each operand in a texture of the
# replay's own (texplan.py); False: where the capture made them, in the device's textures.
GROUP_TEXTURES = True


class Replay:
    def __init__(self, recording):
        dev = self.device = recording.device
        ops = recording.ops
        if GROUP_TEXTURES and any(op[0] == "t" for op in ops):
            ops = texplan.plan(ops, {id(v): t for t, v in dev.operand_textures()},
                               dev.new_operand_texture)
        n = sum(op[0] == "d" for op in ops)
        self.dispatches = n
        self._arena = dev.wgpu.create_buffer(  # bound as the device's own arena is
            size=max(n, 1) * SLOT, usage=wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
            | (wgpu.BufferUsage.STORAGE if dev.params_in_storage else 0))
        self._words = np.zeros((max(n, 1), SLOT // 4), np.uint32)
        self._bytes = memoryview(self._words).cast("B")
        self._refresh = []  # (slot, callable)
        self._keep = []  # wgpu objects the encoded commands use
        bind_groups, segs, cur, slot = {}, [], None, 0
        self._parts = [segs]  # lists of segments, with host operations between them
        for op in ops:
            if op[0] == "d":
                _, pipe, layout, dynamic, bufs, words, groups, refresh, _ = op
                self._words[slot] = np.frombuffer(words, np.uint32)
                if refresh is not None:
                    self._refresh.append((slot, refresh))
                if dynamic:
                    bg = bind_groups.get((layout, *bufs))
                    if bg is None:
                        bg = bind_groups[(layout, *bufs)] = self._bind_group(layout, bufs, 0)
                    offs = [slot * SLOT]
                else:
                    bg, offs = self._bind_group(layout, bufs, slot * SLOT), []
                if cur is None:
                    cur = []
                    segs.append((_PASS, cur))
                cur.append((pipe, bg, offs, *groups))
                slot += 1
                continue
            cur = None
            if op[0] in ("c", "t"):  # the copies sit where they were: between passes
                segs.append((_COPY if op[0] == "c" else _TEX, op[1:]))
            elif op[0] in ("h", "a", "j"):
                segs = []
                self._parts += [op, segs]
            else:
                _, dst, offset, data = op
                src = dev.wgpu.create_buffer_with_data(data=data, usage=wgpu.BufferUsage.COPY_SRC)
                self._keep.append(src)
                segs.append((_COPY, (src, 0, dst, offset, len(data))))
        joined = {op[1] for op in ops if op[0] == "j"}
        if any(op[0] == "a" and op[3] not in joined for op in ops):
            raise CaptureError("an asynchronous communication started inside a wr.jit function "
                               "was not waited for inside it; wait for its Work before the "
                               "function returns")
        self._dispatches_of = [sum(len(b) for k, b in p if k == _PASS)
                               for p in self._parts[::2]]
        self.trace: list = []
        self._keep += [bind_groups, self._parts]
        dev.queue.write_buffer(self._arena, 0, self._words)
        # The C calls where the device records through them too (not under WGRUMUS_CHECKED_PASS)
        raw = dev.raw_pass is not None and (dev.raw_copy is not None
                                        or not any(op[0] == "t" for op in ops))
        self._raw = None if not raw else [
            RawReplay(c_api(), p, k) for p, k in zip(self._parts[::2], self._dispatches_of)]

    def _bind_group(self, layout, bufs, offset):
        return self.device.wgpu.create_bind_group(
            layout=layout, entries=bind_entries(self._arena, offset, bufs))

    def run(self, before=(), after=()) -> None:
        """Submit one replay; ``before``/``after``: copies (inputs in, outputs out) around it."""
        dev = self.device
        last = len(self._parts) - 1
        trace, pending = [], {}  # pending: slot -> the handle of a launched host operation
        self.trace = trace
        sub = dev.replay_submitter() if last == 0 and dev.timer is None else None
        for i in range(0, last + 1, 2):
            if i:
                self._host(self._parts[i - 1], pending, trace)
                if not self._parts[i] and i != last:
                    continue  # nothing to submit between two host operations
            with dev.lock:
                if sub is None:
                    dev.drain()  # replays of other captures queued on this device go first
                dev.flush_locked()  # eager work recorded so far runs first
                words = None
                if i == 0 and self._refresh:
                    for slot, fn in self._refresh:
                        pack_words(self._bytes, slot * SLOT, fn())
                    lo, hi = self._refresh[0][0], self._refresh[-1][0] + 1
                    rows = self._words[lo:hi]
                    words = (lo * SLOT, rows if sub is None else rows.copy())  # as queued
                pre, post = before if i == 0 else (), after if i == last else ()
                if sub is not None:  # encoded here, meanwhile the thread runs earlier steps
                    sub.put(self._submit, i, words, self._encode(i, pre, post))
                else:
                    with _ENCODE:
                        self._submit(i, words, self._encode(i, pre, post))
            trace.append(("submit", i // 2, self._dispatches_of[i // 2]))
        dev.dispatches += self.dispatches
        dev.replays += 1

    def _encode(self, i: int, before, after):
        """Part ``i``'s command buffer (None where it has no commands)."""
        dev = self.device
        if not (self._parts[i] or before or after):
            return None
        enc = dev.wgpu.create_command_encoder()
        if self._raw is not None:
            self._raw[i // 2].encode(enc, dev.begin_pass if dev.timer is not None else None,
                                     before, after)
        else:
            self._encode_api(enc, self._parts[i], before, after)
        return enc.finish()

    def _submit(self, i: int, words, commands) -> None:
        """Part ``i``'s rewritten parameter words ((offset, rows) or None), then its commands."""
        dev = self.device
        if words is not None:
            dev.queue.write_buffer(self._arena, *words)
        if commands is not None:
            dev.submit(commands)

    def _host(self, op, pending: dict, trace: list) -> None:
        """A recorded host operation again: a launch is left running; a plain one's or a join's
        result is copied into the captured buffer. Failures propagate (the group's owner aborts
        launched ones, as after a failed eager step)."""
        t = time.perf_counter()
        if op[0] == "a":
            _, launch, args, slot = op
            pending[slot] = launch(*args)
            trace.append(("launch", slot, t))
            return
        if op[0] == "j":
            _, slot, out, timeout = op
            res = pending.pop(slot).wait(timeout)
            trace.append(("join", slot, t, time.perf_counter()))
        else:
            _, fn, args, out = op
            res = fn(*args)
            trace.append(("host", t, time.perf_counter()))
        if out is None:
            return
        if res is None or res.shape != out.shape or res.dtype != out.dtype:
            raise CaptureError(f"a replayed communication returned {res!r}, the capture "
                               f"{out.dtype} {out.shape}")
        nbytes = (out.numel() * out.dtype.itemsize + 3) & ~3
        if nbytes:
            self.device.copy(res.buffer, res.offset * res.dtype.itemsize,
                             out.buffer, out.offset * out.dtype.itemsize, nbytes)

    def _encode_api(self, enc, segs, before, after) -> None:
        for c in before:
            enc.copy_buffer_to_buffer(*c)
        for kind, body in segs:
            if kind == _COPY:
                enc.copy_buffer_to_buffer(*body)
                continue
            if kind == _TEX:
                copy_to_texture(enc, *body)
                continue
            cp = self.device.begin_pass(enc)
            for pipe, bg, offs, gx, gy, gz in body:
                cp.set_pipeline(pipe)
                cp.set_bind_group(0, bg, offs)
                cp.dispatch_workgroups(gx, gy, gz)
            cp.end()
        for c in after:
            enc.copy_buffer_to_buffer(*c)
