"""wr.jit: a step function captured once and replayed without Python per op.

    @wr.jit
    def step(x, y):
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        wr.optim.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

The first call per input signature (shapes, dtypes, devices of the tensors, values of the other
arguments) runs eagerly, compiling kernels and making lazy state (Adam's moments); the second
runs eagerly while the device records its work (runtime/capture.py); later calls copy the new
inputs into the capture's buffers and replay the recording (runtime/replay.py: no Python per op).
Outputs are new tensors without autograd history. On a CPU adapter a call returns once the replay
is queued (runtime/submitter.py); any read of that device waits for the queue.

A replay reproduces device work (in-place parameter and optimizer updates), optimizer step
counts and learning rates (re-read each replay) and ProcessGroup communication
(``capture.host_op``: run again between the replayed segments, async all-reduces started and
waited where the capture did). It refuses at capture, with a ``CaptureError`` naming the call,
what it cannot reproduce: host reads (``.item()``, ``.numpy()``, ``bool(t)``), random ops on the
global generator (pass ``seed=``), scheduler steps, creating parameters or optimizer state. Other
Python side effects run only at capture. Tensor arguments are inputs copied in at each call;
state updated in place must be reached through closures or non-tensor arguments. A replay sets
``.grad`` as the captured call did (adding to the gradient of that moment where the call added
to one made before it), and arms the device's index checks for the next read. What the capture
read and a replay cannot follow (closure variables, train/eval, parameter groups, ...: the
guards of ``capture.guard``) is checked at each call: a change raises a CaptureError naming it.
"""
from __future__ import annotations

import collections
import functools
import warnings

from .autograd.tape import no_grad
from .runtime import capture
from .runtime.context import MultiGpuContext
from .runtime.errors import CaptureError
from .runtime.replay import Replay
from .tensor import Storage, Tensor

CACHE_SIZE = 8  # captures kept per jitted function (one per input signature)


def jit(fn=None, *, warmup: int = 1, cache_size: int = CACHE_SIZE, devices=None):
    """Capture ``fn`` (also ``@wr.jit`` or ``@wr.jit(warmup=...)``): ``warmup`` eager calls per
    input signature, then one capturing call, then replays. ``devices``: record only these
    (default: every device of the process; threads capturing at once, as DataParallel's
    replicas do, each name their own)."""
    if fn is None:
        return lambda f: Jitted(f, warmup, cache_size, devices)
    return Jitted(fn, warmup, cache_size, devices)


class Jitted:
    def __init__(self, fn, warmup: int = 1, cache_size: int = CACHE_SIZE, devices=None):
        if warmup < 0 or cache_size < 1:
            raise ValueError(f"wr.jit: warmup must be >= 0 and cache_size >= 1 (got {warmup}, "
                             f"{cache_size})")
        functools.update_wrapper(self, fn)
        self.fn, self.warmup, self.cache_size = fn, warmup, cache_size
        self.devices = None if devices is None else list(devices)
        self._captures: collections.OrderedDict = collections.OrderedDict()
        self._calls: dict = {}
        self._last = None  # the capture the last call replayed
        self.recaptures = 0  # captures dropped from the cache to make room
        self.replays = 0

    def __call__(self, *args, **kwargs):
        tensors = []
        key = _signature((args, kwargs), tensors)
        cap = self._captures.get(key)
        self._last = cap
        if cap is not None:
            self._captures.move_to_end(key)
            out = cap.replay(tensors)
            self.replays += 1
            return out
        n = self._calls.get(key, 0)
        if n < self.warmup:
            self._calls[key] = n + 1
            return self.fn(*args, **kwargs)
        cap, out = _Capture.record(self.fn, args, kwargs, tensors, self.devices)
        self._calls.pop(key, None)
        self._captures[key] = cap
        if len(self._captures) > self.cache_size:
            _, old = self._captures.popitem(last=False)
            old.free()
            self.recaptures += 1
            if self.recaptures == 1:
                warnings.warn(f"wr.jit({getattr(self.fn, '__name__', 'fn')}): more than "
                              f"{self.cache_size} input signatures, captures are being "
                              "dropped and made again; do the shapes or the non-tensor "
                              "arguments change every call?", RuntimeWarning, stacklevel=2)
        return out

    def __get__(self, obj, objtype=None):
        """As a method decorator: the instance is the first argument (a non-tensor, keyed by
        identity, so each instance gets captures of its own)."""
        return self if obj is None else functools.partial(self, obj)

    @property
    def captures(self) -> int:
        return len(self._captures)

    def stats(self) -> dict:
        """Dispatches per replay of each capture, and replays so far."""
        return {"captures": [c.replay_obj.dispatches for c in self._captures.values()],
                "replays": self.replays}

    @property
    def last_trace(self) -> list | None:
        """What the last call's replay did, in order (``Replay.trace``: submits, host
        operations, asynchronous launches and joins with their times); None when the last call
        ran eagerly."""
        cap = self._last
        return None if cap is None or cap.replay_obj is None else cap.replay_obj.trace

    def free(self) -> None:
        """Release every capture's buffers to the pool (also done when this object dies)."""
        self._last = None
        while self._captures:
            self._captures.popitem()[1].free()

    def __del__(self):
        try:
            self.free()
        except Exception:  # interpreter shutdown
            pass


class _Capture:
    """One recording with its input and output buffers (pinned in the pool while it lives)."""

    @classmethod
    def record(cls, fn, args, kwargs, tensors, devices=None):
        devices = list(devices or MultiGpuContext.get().devices)
        with no_grad():
            inputs = [_own_copy(t) for t in tensors]
        it = iter(inputs)
        args2, kwargs2 = _rebuild((args, kwargs), it)
        recs = capture.start(devices)
        try:
            out = fn(*args2, **kwargs2)
        finally:
            guards, grads = capture.stop(devices)
        used = [r for r in recs if r.ops]
        if len(used) > 1:
            raise CaptureError(f"wr.jit: the function ran work on {len(used)} devices; a "
                               "capture replays one device's work (run each device's part "
                               "under its own wr.jit)")
        dev = used[0].device if used else (inputs[0].device if inputs else devices[0])
        outs = []
        spec = _rebuild(out, None, outs)  # the tensors moved to outs
        for t in inputs + outs:
            if t.device is not dev:
                raise CaptureError(f"wr.jit: a tensor argument or result lives on {t.device}, "
                                   f"the captured work on {dev}; keep them on one device")
        self = cls()
        self.device = dev
        self.fn_name = getattr(fn, "__name__", "fn")
        self._guards = guards + _closure_guards(fn)
        self._grads = grads  # (tensor, the .grad a replay leaves it, added to an outside one)
        flag = dev.asserts._flag  # index kernels bind it: a replay arms the next read's check
        self._armed = flag is not None and any(
            op[0] == "d" and any(b is flag for b in op[4]) for op in (used[0].ops if used else ()))
        self.replay_obj = Replay(used[0] if used else capture.Recording(dev))
        self._inputs = [(t.buffer, t.offset * t.dtype.itemsize,
                         t.numel() * t.dtype.itemsize) for t in inputs]
        self._outputs = [(t.buffer, t.storage.nbytes, t.shape, t.strides, t.offset,
                          t.dtype) for t in outs]
        self._spec = spec
        self._buffers = (used[0].buffers() if used else []) + [b for b, *_ in self._inputs] + [
            b for b, *_ in self._outputs]
        dev.pool.pin(self._buffers)
        self._set_grads()  # after the pins: a copy made here stays out of the replays' way
        results, copies = self._fresh_outputs()
        for c in copies:
            dev.copy(*c)
        return self, _rebuild(spec, iter(results))

    def _fresh_outputs(self):
        results, copies = [], []
        for buf, nbytes, shape, strides, offset, dtype in self._outputs:
            st = Storage(self.device, nbytes)
            results.append(Tensor(st, shape, strides, offset, dtype))
            copies.append((buf, 0, st.buffer, 0, (nbytes + 3) & ~3))
        return results, copies

    def replay(self, tensors):
        for what, read, value in self._guards:
            now = read()
            if now != value:
                raise CaptureError(
                    f"wr.jit({self.fn_name}): {what} changed since the capture"
                    f"{_change(value, now)}; a replay would go on with the captured state. "
                    f"Undo the change, or call .free() on the jitted function so that the "
                    f"next call captures again")
        before = []
        for t, (buf, off, nbytes) in zip(tensors, self._inputs):
            if not t.is_contiguous() or (t.offset * t.dtype.itemsize) % 4:
                with no_grad():
                    t = t.clone()
            before.append((t.buffer, t.offset * t.dtype.itemsize, buf, off,
                           (nbytes + 3) & ~3))
        results, after = self._fresh_outputs()
        self.replay_obj.run(before, after)
        self._set_grads()
        if self._armed:  # the replay's index checks surface at the next read, as eager ones
            self.device.asserts.arm()
        return _rebuild(self._spec, iter(results))

    def _set_grads(self) -> None:
        """The .grad assignments of the captured call, after it or a replay."""
        for t, g, outside in self._grads:
            if outside and g is not None:  # a sum the next call adds to: not in a buffer the
                with no_grad():  # replay reuses for its temporaries before it reads the sum
                    g = g.clone()
            t.grad = g

    def free(self) -> None:
        bufs, self._buffers = self._buffers, []
        if bufs:
            self.device.pool.unpin(bufs)
        self.replay_obj = None


def _change(old, new) -> str:
    """' (old -> new)' where both are short values, else ''."""
    if all(isinstance(v, (bool, int, float, str, type(None))) for v in (old, new)):
        return f" ({old!r} -> {new!r})"
    return ""


def _closure_guards(fn) -> list:
    """Guards on the tensors, modules and optimizers ``fn`` reaches through its closure cells
    and global names: a replay uses the captured objects, so rebinding such a name (``w =
    new_tensor``) must not go unnoticed."""
    from .nn.module import Module
    from .optim.optimizer import Optimizer
    kinds = (Tensor, Module, Optimizer)
    fn = getattr(fn, "__func__", fn)
    code = getattr(fn, "__code__", None)
    if code is None:
        return []
    guards = []
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            obj = cell.cell_contents
        except ValueError:  # not bound yet
            continue
        if isinstance(obj, kinds):
            guards.append((f"the closure variable '{name}'",
                           lambda c=cell, o=obj: _SAME if c.cell_contents is o else _OTHER,
                           _SAME))
    names, stack = set(), [code]
    while stack:
        c = stack.pop()
        names.update(c.co_names)
        stack.extend(k for k in c.co_consts if hasattr(k, "co_names"))
    glb = getattr(fn, "__globals__", {})
    for name in sorted(names):
        obj = glb.get(name)
        if isinstance(obj, kinds):
            guards.append((f"the global '{name}'",
                           lambda d=glb, n=name, o=obj: _SAME if d.get(n) is o else _OTHER,
                           _SAME))
    return guards


_SAME, _OTHER = "the captured object", "another object"


def _own_copy(t: Tensor) -> Tensor:
    """A contiguous copy of an input in a buffer of the capture's own, so a replay writing the
    next call's data there never touches the caller's tensor."""
    c = t.clone()
    return c.requires_grad_(True) if t.requires_grad else c


def _signature(obj, tensors: list):
    """A hashable key of the argument structure; tensors are appended to ``tensors``."""
    if isinstance(obj, Tensor):
        tensors.append(obj)
        return ("T", obj.shape, obj.dtype.str, obj.device, obj.requires_grad)
    if isinstance(obj, (list, tuple)):
        return (type(obj), tuple(_signature(o, tensors) for o in obj))
    if isinstance(obj, dict):
        return (dict, tuple((k, _signature(v, tensors)) for k, v in obj.items()))
    try:
        hash(obj)
    except TypeError:
        raise CaptureError(f"wr.jit: an argument of type {type(obj).__name__} is neither a "
                           "tensor nor hashable; pass data as wr.tensor(...) (copied into the "
                           "capture at every call) or reach it through a closure") from None
    return (type(obj), obj)


def _rebuild(obj, it, moved=None):
    """``obj`` (nested lists, tuples, dicts) with its tensors (or placeholders), in order,
    replaced by those of ``it`` (or, with ``moved``, appended there and replaced by _TENSOR)."""
    if isinstance(obj, Tensor) or obj is _TENSOR:
        return next(it) if moved is None else moved.append(obj) or _TENSOR
    if isinstance(obj, (list, tuple)):
        return type(obj)(_rebuild(o, it, moved) for o in obj)
    if isinstance(obj, dict):
        return {k: _rebuild(v, it, moved) for k, v in obj.items()}
    return obj


_TENSOR = object()
