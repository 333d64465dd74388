"""Adam (L2 weight decay) and AdamW (decoupled), with torch.optim's formulas. Bias corrections
are computed on the host in float64 and passed as words, recomputed by each dispatch's
``refresh`` when a ``wr.jit`` capture replays; with ``found_inf`` they live on the device
(optim/skip.py).
"""
from __future__ import annotations

import functools
import math

from ..autograd.tape import no_grad
from ..kernels import texture
from ..ops.creation import zeros
from ..runtime.capture import refuse
from ..runtime.kernels import Kernel, multi_tensor_decls, multi_tensor_kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from .optimizer import Optimizer, launch
from .skip import FLAG_MULTI, HOST_MULTI, DeviceSteps, device_flags, host_step

MULTI_MAX = 8  # parameters per multi-tensor dispatch (4 bindings each; 64 parameter words)
# CPU adapters (entry `cpu` of shaders/adam_multi.wgsl): elements per invocation (the adapter
# profile's update_chunk, 1 on GPUs) and invocations per workgroup, from a sweep on lavapipe
# (BENCHMARKS.md, findings).
CPU_CHUNK_QUAD = 128  # ... a quad at a time (quick GPT: 2.07 ms against 2.43 with 32)
CPU_WG = 16  # quick GPT's 4 dispatches 0.64 -> 0.58 ms: 17-33 workgroups keep both threads busy
# ... smaller parameters read storage: a texture copy costs lavapipe ~5 us whatever its size,
# a storage read ~7 ns an element
CPU_TEX_MIN = 1024


class Adam(Optimizer):
    _decoupled = False
    _step_supports_amp_scaling = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        b1, b2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: invalid hyperparameters lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=(float(b1), float(b2)), eps=eps,
                                      weight_decay=weight_decay))
        self._device_steps = DeviceSteps()

    def step(self, grads=None, found_inf=None) -> None:
        """As Optimizer.step, several parameters per dispatch where the binding limit allows."""
        flags = device_flags(found_inf)
        self._guard_capture()
        with no_grad():
            for group in self.param_groups:
                todo = []
                for p in group["params"]:
                    g = self._grad(p, grads)
                    if g is not None:
                        todo.append((p, g))
                steps = None
                if flags is not None and todo:
                    for p, _ in todo:
                        self._moments(p)
                    steps = self._device_steps.advance(self, group, todo, flags)
                k = multi_width(todo[0][0].device, steps is not None) if todo else 1
                if k < 2:
                    for p, g in todo:
                        self._update(p, g, self.state.setdefault(p, {}), group, steps)
                    continue
                batch = []
                for p, g in todo:
                    if batch and (len(batch) == k or p.device is not batch[0][0].device or any(
                            p.storage is q.storage for q, _, _ in batch)):
                        self._multi(batch, group, steps)
                        batch = []
                    batch.append((p, g, self._prepare(p, group, steps)))
                if batch:
                    self._multi(batch, group, steps)

    def _moments(self, p) -> dict:
        """The parameter's state (step, exp_avg, exp_avg_sq), created at first use."""
        state = self.state.setdefault(p, {})
        if "exp_avg" not in state:
            refuse(f"{type(self).__name__}.step creating its state (exp_avg, exp_avg_sq)",
                   "a replay would zero the moments at every step; wr.jit's eager warm-up "
                   "call creates them (keep warmup >= 1)")
            state["step"] = 0
            state["exp_avg"] = zeros(p.shape, device=p.device)
            state["exp_avg_sq"] = zeros(p.shape, device=p.device)
        return state

    def _prepare(self, p, group, steps=None) -> dict:
        """The parameter's state, its host step count advanced (unless on the device)."""
        state = self._moments(p)
        if steps is None:
            state["step"] = host_step(state) + 1
        return state

    def _coefs(self, p, st, group, steps) -> list:
        """Bias-corrected step size and sqrt(1 - beta2^t), or the device counts' slot."""
        if steps is not None:
            return [steps[p.device][1][p], 0]
        b1, b2 = group["betas"]
        t = st["step"]
        return [float(group["lr"]) / (1.0 - b1 ** t), math.sqrt(1.0 - b2 ** t)]

    def _head(self, group) -> list:
        b1, b2 = group["betas"]
        return [float(group["lr"]), float(b1), float(b2), float(group["eps"]),
                float(group["weight_decay"]), int(self._decoupled)]

    def _refresh(self, pairs, words, steps):
        """Per replayed dispatch: the host counts advanced (unless on the device), words anew."""
        def refresh():
            for p, st in pairs:
                self._check_replay(p, st)
            if steps is None:
                for _, st in pairs:
                    st["step"] += 1
            return words()
        return refresh

    def _multi(self, batch, group, steps=None) -> None:
        """One dispatch for the (param, grad, state) triples of ``batch``."""
        dev = batch[0][0].device
        chunk = cpu_chunk(dev)
        # CPU adapters: quads where every size and offset allows (ends and offsets in quads)
        q = 4 if chunk > 1 and chunk % 4 == 0 and all(
            x % 4 == 0 for p, g, st in batch for x in (
                p.numel(), p.offset, g.offset, st["exp_avg"].offset,
                st["exp_avg_sq"].offset)) else 1
        chunk = (CPU_CHUNK_QUAD if q == 4 and TUNING.update_chunk is None else chunk) // q
        bufs, rows, end = [], [], 0
        for p, g, st in batch:
            m, v = st["exp_avg"], st["exp_avg_sq"]
            end = -(-end // chunk) * chunk + p.numel() // q  # a parameter starts a chunk
            rows.append(([end] + [t.offset // q for t in (p, g, m, v)], st, p))
            bufs += [p.buffer, g.buffer, m.buffer, v.buffer]
        if steps is not None:
            bufs.append(steps[dev][0].storage.buffer)

        def words():
            out = self._head(group) + [0, 0]
            for offsets, st, p in rows:
                out += offsets + self._coefs(p, st, group, steps)
            return out

        refresh = self._refresh([(p, st) for _, st, p in rows], words, steps)
        amp = steps is not None
        if chunk > 1 or q == 4:
            with dev.lock:  # (the operand textures hold p, g, m, v until the dispatch)
                on = q == 4 and texture.enabled(dev)
                views = [[texture.operand(t, 4 * j + i, p.numel()) for i, t in enumerate(
                    (g, p, st["exp_avg"], st["exp_avg_sq"]))] if on and p.numel() >= CPU_TEX_MIN
                    else [None] for j, (p, g, st) in enumerate(batch)]
                tex = tuple(None not in vs for vs in views)
                for j, vs in enumerate(views):  # g's view in g's binding, p's, m's and v's
                    if tex[j]:  # after the rest
                        bufs[4 * j + 1] = vs[0]
                        bufs += vs[1:]
                tex = tex[0] if len(set(tex)) == 1 else tex  # one bool where all agree
                dev.dispatch_1d(cpu_kernel(len(batch), chunk, CPU_WG, amp, q == 4, tex), bufs,
                                words(), -(-end // chunk), CPU_WG, refresh=refresh)
        else:
            dev.dispatch_1d(multi_kernel(len(batch), amp), bufs, words(), end, refresh=refresh)
        for p, _, st in batch:
            for t in (p, st["exp_avg"], st["exp_avg_sq"]):
                t.storage.version += 1

    def _update(self, p, g, state, group, steps=None):
        state = self._prepare(p, group, steps)

        def words():
            return self._head(group) + self._coefs(p, state, group, steps)
        launch(p, g, [state["exp_avg"], state["exp_avg_sq"]], "adam", words,
               self._refresh([(p, state)], words, steps),
               None if steps is None else steps[p.device][0])


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


def multi_width(dev, amp: bool = False) -> int:
    """Parameters per multi-tensor dispatch (amp: the device counts take a binding too)."""
    lim = int(dev.limits.get("max-storage-buffers-per-shader-stage", 8))
    return max(1, min(MULTI_MAX, (lim - int(amp)) // 4))


def cpu_chunk(dev) -> int:
    """Elements per invocation of the multi-tensor update on ``dev`` (1: the GPU entry)."""
    chunk = TUNING.update_chunk
    return profile(dev).update_chunk if chunk is None else chunk


_ARRAYS = "P:read_write G:read M:read_write V:read_write"


def multi_kernel(k: int, amp: bool = False) -> Kernel:
    """shaders/adam_multi.wgsl for k parameters (amp: device step counts bound after them)."""
    return multi_tensor_kernel("adam_multi", k, 1, _ARRAYS, _ADAM_BRANCH, CPU_BODY="", CHUNK=1,
                               CPU_WG=1, AMP=_amp(k, amp), AT="f32")


def _amp(k: int, amp: bool) -> str:
    return FLAG_MULTI.format(b=4 * k + 1) if amp else HOST_MULTI


_ADAM_BRANCH = """        let s = part_({j}u);
        let r = adam_(P{j}[s.p + e], G{j}[s.g + e], M{j}[s.m + e], V{j}[s.v + e], s.step_size,
                      s.bc2_sqrt);
        P{j}[s.p + e] = r.p;
        M{j}[s.m + e] = r.m;
        V{j}[s.v + e] = r.v;"""


@functools.cache
def cpu_kernel(k: int, chunk: int, wg: int, amp: bool = False, quad: bool = False,
               tex=False) -> Kernel:
    """Entry `cpu` of shaders/adam_multi.wgsl: a branch per parameter looping over ``chunk``
    elements (``quad``: vec4s). ``tex`` (one bool or one per parameter): p, g, m, v read
    through textures (g's in its binding, the others after all bindings), stored as before."""
    tex = (tex,) * k if isinstance(tex, bool) else tex
    reads = ("{x}{j}[s.{xl} + e]", "ld_{x}T{j}(e)")
    body = [_CPU_BRANCH.format(j=j, start="0u" if j == 0 else f"start_(end_({j - 1}u))",
                               **{x: reads[tex[j]].format(x=x, j=j, xl=x.lower())
                                  for x in "PGMV"}) for j in range(k)]
    decls = multi_tensor_decls(k, 1, _ARRAYS)
    if quad:
        decls = decls.replace("array<f32>", "array<vec4<f32>>")
    on = [j for j in range(k) if tex[j]]
    if on:
        base = 4 * k + 1 + int(amp)
        decls = "\n".join(line for line in decls.split("\n")
                          if not any(f"> G{j}:" in line for j in on))
        decls += "\n" + texture.decls({f"{x}T{j}": b for i, j in enumerate(on) for x, b in (
            ("G", 4 * j + 2), ("P", base + 3 * i), ("M", base + 3 * i + 1),
            ("V", base + 3 * i + 2))}, True)
    return Kernel.of("adam_multi", "cpu", BODY="", CPU_BODY="\n".join(body), CHUNK=chunk,
                     CPU_WG=wg, AMP=_amp(k, amp), AT="vec4<f32>" if quad else "f32",
                     DECLS=decls)


_CPU_BRANCH = """    if (c0 < end_({j}u)) {{
        let e0 = c0 - {start};
        let n = min(CHUNK, end_({j}u) - c0);
        let s = part_({j}u);
        for (var t = 0u; t < n; t++) {{
            let e = e0 + t;
            let r = adam_({P}, {G}, {M}, {V}, s.step_size, s.bc2_sqrt);
            P{j}[s.p + e] = r.p;
            M{j}[s.m + e] = r.m;
            V{j}[s.v + e] = r.v;
        }}
        return;
    }}"""
