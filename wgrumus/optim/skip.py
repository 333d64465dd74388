"""Optimizer steps that a device flag may skip (the inf/NaN check of a GradScaler, wgrumus/amp.py).

``optimizer.step(grads, found_inf=flag)``: the kernels leave parameters and state untouched
where the flag is set, and Adam's step counts live on the device (torch's ``capturable=True``),
so a wr.jit capture replays the whole mixed-precision step. ``state["step"]`` is then an int32
device view (``state_dict`` reports an int). One difference from a host-side skip: SGD momentum
made at a skipped first step starts from zeros (matters only with dampening > 0).
"""
from __future__ import annotations

import math

import numpy as np

from ..runtime.capture import refuse
from ..runtime.errors import WgrumusError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, int32

# What shaders/optim.wgsl's entries read in place of {{AMP}}: nothing (host words), or the flag
# (sgd, binding 4, offset in word 10) and Adam's counts (binding 5, its slot in word 10).
HOST_OPTIM = """fn sgd_skip_() -> bool { return false; }
fn adam_skip_() -> bool { return false; }
fn adam_coef_() -> vec2<f32> { return vec2<f32>(pf(10u), pf(11u)); }"""
FLAG_OPTIM = """@group(0) @binding(4) var<storage, read_write> DS: array<u32>;
@group(0) @binding(5) var<storage, read_write> DA: array<u32>;
fn sgd_skip_() -> bool { return DS[pu(10u)] != 0u; }
fn adam_skip_() -> bool { return DA[0] != 0u; }
fn adam_coef_() -> vec2<f32> {
    let s = 2u + 3u * pu(10u);
    return vec2<f32>(pf(4u) * bitcast<f32>(DA[s]), bitcast<f32>(DA[s + 1u]));
}"""
HOST_MULTI = """fn skip_() -> bool { return false; }
fn coef_(w: u32) -> vec2<f32> { return vec2<f32>(pf(w + 5u), pf(w + 6u)); }"""
FLAG_MULTI = """@group(0) @binding({b}) var<storage, read_write> D: array<u32>;
fn skip_() -> bool {{ return D[0] != 0u; }}
fn coef_(w: u32) -> vec2<f32> {{
    let s = 2u + 3u * pu(w + 5u);
    return vec2<f32>(pf(0u) * bitcast<f32>(D[s]), bitcast<f32>(D[s + 1u]));
}}"""


def device_flags(found_inf) -> dict | None:
    """``found_inf`` (a flag tensor or a dict of them) as a dict device -> flag, or None."""
    if found_inf is None:
        return None
    flags = {found_inf.device: found_inf} if isinstance(found_inf, Tensor) else dict(found_inf)
    for t in flags.values():
        if not isinstance(t, Tensor) or t.dtype != int32 or t.numel() != 1:
            raise WgrumusError("found_inf must be one-element int32 device tensors (a "
                               "GradScaler's inf/NaN flags)")
    return flags


def flag_for(flags: dict, dev) -> Tensor:
    f = flags.get(dev)
    if f is None:
        raise WgrumusError(f"optimizer step with found_inf: no flag on {dev}, where a parameter "
                           "lives; pass one flag per device of the parameters")
    return f


def _ln(b: float) -> float:
    return math.log(b) if b > 0 else float("-inf")


class DeviceSteps:
    """Adam's step counts per device: an int32 buffer of the step's skip flag, then (step,
    1 / (1 - beta1^step), sqrt(1 - beta2^step)) per parameter slot."""

    def __init__(self):
        # device -> (buffer tensor, {param: (slot, step view)}, {param: slot})
        self._by_dev: dict = {}

    def advance(self, opt, group, todo, flags) -> dict:
        """Per device: copy the flag next to the counts and, unless set, advance the counts of
        ``todo``'s parameters. Returns device -> (buffer tensor, {param: slot})."""
        out = {}
        for dev in {id(p.device): p.device for p, _ in todo}.values():
            flag = flag_for(flags, dev)
            buf, slots, index = self._buffer(opt, dev)
            mine = sorted(slots[p][0] for p, _ in todo if p.device is dev)
            for p, _ in todo:
                if p.device is dev:
                    self._sync(opt.state[p], buf, *slots[p])
            lo = 0
            for i in range(1, len(mine) + 1):  # one dispatch per run of consecutive slots
                if i == len(mine) or mine[i] != mine[i - 1] + 1:
                    self._launch(dev, flag, buf, group, mine[lo], i - lo)
                    lo = i
            out[dev] = (buf, index)
        return out

    @staticmethod
    def _launch(dev, flag, buf, group, first: int, n: int) -> None:
        def words():
            b1, b2 = group["betas"]
            return [flag.offset, first, n, _ln(float(b1)), _ln(float(b2))]
        dev.dispatch_1d(Kernel.of("amp", "steps"), [flag.buffer, buf.buffer],
                        words(), n, 64, refresh=words)
        buf.storage.version += 1

    def _buffer(self, opt, dev):
        params = [p for g in opt.param_groups for p in g["params"] if p.device is dev]
        have = self._by_dev.get(dev)
        if have is not None and all(p in have[1] for p in params):
            return have
        refuse("an optimizer step with found_inf placing its step counts on the device",
               "wr.jit's eager warm-up call does it (keep warmup >= 1)")
        if have is not None:  # new parameters: counts move to a larger buffer, via the host
            for p, (_, view) in have[1].items():
                st = opt.state.get(p)
                if st is not None and st.get("step") is view:
                    st["step"] = int(view.item())
        buf = Tensor.empty((1 + 3 * len(params),), dev, int32)
        dev.write(buf.buffer, np.zeros(1 + 3 * len(params), np.int32))
        slots = {p: (k, Tensor(buf.storage, (), (), 1 + 3 * k, int32))
                 for k, p in enumerate(params)}
        have = self._by_dev[dev] = (buf, slots, {p: k for k, p in enumerate(params)})
        return have

    @staticmethod
    def _sync(state, buf, slot: int, view) -> None:
        """A host count (fresh or loaded) is written into its slot once; the state then views it."""
        if state.get("step") is view:
            return
        refuse("an optimizer step with found_inf moving a step count to the device",
               "wr.jit's eager warm-up call does it (keep warmup >= 1; after load_state_dict "
               "call .free() on the jitted function)")
        t = state.get("step", 0)
        t = int(t.item()) if isinstance(t, Tensor) else int(t)
        buf.device.write(buf.buffer, np.array([t], np.int32), (1 + 3 * slot) * 4)
        state["step"] = view


def host_step(state) -> int:
    """The step count of a state as a host int (reads a device count back, eagerly)."""
    t = state["step"]
    if isinstance(t, Tensor):
        t = state["step"] = int(t.item())
    return t
