"""Adam (L2 weight decay added to the gradient) and AdamW (decoupled weight decay), with
torch.optim's formulas:

    AdamW: p = p * (1 - lr * wd)          Adam: g = g + wd * p
    m = m + (1 - b1) * (g - m);  v = b2 * v + (1 - b2) * g^2
    p = p - lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)

The bias corrections are computed on the host in float64 and passed as kernel words. Each
update dispatch also carries a ``refresh`` callable that steps the counts and recomputes the
words (learning rate from the param group, bias corrections), which a replayed ``wr.jit``
capture calls instead of reusing the captured words.
"""
from __future__ import annotations

import functools
import math

from ..autograd.tape import no_grad
from ..ops.creation import zeros
from ..runtime.adapters import is_cpu_adapter
from ..runtime.capture import refuse
from ..runtime.kernels import Kernel, multi_tensor_decls, multi_tensor_kernel
from .optimizer import Optimizer, launch

MULTI_MAX = 8  # parameters per multi-tensor dispatch (4 bindings each; 64 parameter words)
# CPU adapters (entry `cpu` of shaders/adam_multi.wgsl): elements per invocation (None: per
# adapter type, 1 on GPUs) and invocations per workgroup, from benchmarks/_cpu_sweep.py --adam.
CPU_CHUNK = None
CPU_CHUNK_DEFAULT = 32
CPU_WG = 64


class Adam(Optimizer):
    _decoupled = False

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0):
        b1, b2 = betas
        if lr < 0 or eps < 0 or weight_decay < 0 or not (0 <= b1 < 1 and 0 <= b2 < 1):
            raise ValueError(f"{type(self).__name__}: invalid hyperparameters lr={lr}, "
                             f"betas={betas}, eps={eps}, weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=(float(b1), float(b2)), eps=eps,
                                      weight_decay=weight_decay))

    def step(self, grads=None) -> None:
        """Update every parameter that has a gradient, several parameters per dispatch
        (``multi_kernel``) where the adapter allows 4 storage buffers per parameter."""
        with no_grad():
            for group in self.param_groups:
                todo = []
                for p in group["params"]:
                    g = self._grad(p, grads)
                    if g is not None:
                        todo.append((p, g))
                k = multi_width(todo[0][0].device) if todo else 1
                if k < 2:
                    for p, g in todo:
                        self._update(p, g, self.state.setdefault(p, {}), group)
                    continue
                batch = []
                for p, g in todo:
                    if batch and (len(batch) == k or p.device is not batch[0][0].device or any(
                            p._storage is q._storage for q, _, _ in batch)):
                        self._multi(batch, group)
                        batch = []
                    batch.append((p, g, self._prepare(p, group)))
                if batch:
                    self._multi(batch, group)

    def _prepare(self, p, group) -> dict:
        """The parameter's state, stepped: (step, exp_avg, exp_avg_sq), created at first use."""
        state = self.state.setdefault(p, {})
        if "exp_avg" not in state:
            refuse(f"{type(self).__name__}.step creating its state (exp_avg, exp_avg_sq)",
                   "a replay would zero the moments at every step; wr.jit's eager warm-up "
                   "call creates them (keep warmup >= 1)")
            state["step"] = 0
            state["exp_avg"] = zeros(p.shape, device=p.device)
            state["exp_avg_sq"] = zeros(p.shape, device=p.device)
        state["step"] += 1
        return state

    def _multi(self, batch, group) -> None:
        """One dispatch for the (param, grad, state) triples of ``batch``."""
        dev = batch[0][0].device
        chunk = cpu_chunk(dev)
        bufs, rows, end = [], [], 0
        for p, g, st in batch:
            m, v = st["exp_avg"], st["exp_avg_sq"]
            end = -(-end // chunk) * chunk + p.numel()  # a parameter starts a chunk
            rows.append(([end, p.offset, g.offset, m.offset, v.offset], st, p))
            bufs += [p._storage.buffer, g._storage.buffer, m._storage.buffer, v._storage.buffer]

        def words():
            b1, b2 = group["betas"]
            lr = float(group["lr"])
            out = [lr, float(b1), float(b2), float(group["eps"]),
                   float(group["weight_decay"]), int(self._decoupled), 0, 0]
            for offsets, st, _ in rows:
                t = st["step"]
                out += offsets + [lr / (1.0 - b1 ** t), math.sqrt(1.0 - b2 ** t)]
            return out

        def refresh():
            for _, st, p in rows:
                self._check_replay(p, st)
            for _, st, _ in rows:
                st["step"] += 1
            return words()

        if chunk > 1:
            dev.dispatch_1d(cpu_kernel(len(batch), chunk, CPU_WG), bufs, words(),
                            -(-end // chunk), CPU_WG, refresh=refresh)
        else:
            dev.dispatch_1d(multi_kernel(len(batch)), bufs, words(), end, refresh=refresh)
        for p, _, st in batch:
            for t in (p, st["exp_avg"], st["exp_avg_sq"]):
                t._storage.version += 1

    def _update(self, p, g, state, group):
        state = self._prepare(p, group)

        def words():
            t = state["step"]
            b1, b2 = group["betas"]
            lr = float(group["lr"])
            return [lr, float(b1), float(b2), float(group["eps"]),
                    float(group["weight_decay"]), int(self._decoupled), lr / (1.0 - b1 ** t),
                    math.sqrt(1.0 - b2 ** t)]

        def refresh():
            self._check_replay(p, state)
            state["step"] += 1
            return words()
        launch(p, g, [state["exp_avg"], state["exp_avg_sq"]], "adam", words, refresh)


class AdamW(Adam):
    _decoupled = True

    def __init__(self, params, lr: float = 1e-3, betas=(0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


def multi_width(dev) -> int:
    """Parameters per multi-tensor dispatch on ``dev`` (1: one dispatch per parameter)."""
    lim = int(dev.limits.get("max-storage-buffers-per-shader-stage", 8))
    return max(1, min(MULTI_MAX, lim // 4))


def cpu_chunk(dev) -> int:
    """Elements per invocation of the multi-tensor update on ``dev`` (1: the GPU entry)."""
    if CPU_CHUNK is not None:
        return CPU_CHUNK
    return CPU_CHUNK_DEFAULT if is_cpu_adapter(dev) else 1


_ARRAYS = "P:read_write G:read M:read_write V:read_write"


def multi_kernel(k: int) -> Kernel:
    """shaders/adam_multi.wgsl specialised for k parameters: bindings and one branch each."""
    return multi_tensor_kernel("adam_multi", k, 1, _ARRAYS, _ADAM_BRANCH, CPU_BODY="", CHUNK=1,
                               CPU_WG=1)


_ADAM_BRANCH = """        let s = part_({j}u);
        let r = adam_(P{j}[s.p + e], G{j}[s.g + e], M{j}[s.m + e], V{j}[s.v + e], s.step_size,
                      s.bc2_sqrt);
        P{j}[s.p + e] = r.x;
        M{j}[s.m + e] = r.y;
        V{j}[s.v + e] = r.z;"""


@functools.cache
def cpu_kernel(k: int, chunk: int, wg: int) -> Kernel:
    """Entry `cpu` of shaders/adam_multi.wgsl for k parameters, ``chunk`` elements per
    invocation, ``wg`` invocations per workgroup: a branch per parameter whose loop updates the
    chunk (at most ``chunk`` iterations, far below llvmpipe's 65,535 loop cap)."""
    body = [_CPU_BRANCH.format(j=j, start="0u" if j == 0 else f"start_(end_({j - 1}u))")
            for j in range(k)]
    return Kernel.of("adam_multi", "cpu", DECLS=multi_tensor_decls(k, 1, _ARRAYS), BODY="",
                     CPU_BODY="\n".join(body), CHUNK=chunk, CPU_WG=wg)


_CPU_BRANCH = """    if (c0 < end_({j}u)) {{
        let e0 = c0 - {start};
        let n = min(CHUNK, end_({j}u) - c0);
        let s = part_({j}u);
        for (var t = 0u; t < n; t++) {{
            let e = e0 + t;
            let r = adam_(P{j}[s.p + e], G{j}[s.g + e], M{j}[s.m + e], V{j}[s.v + e],
                          s.step_size, s.bc2_sqrt);
            P{j}[s.p + e] = r.x;
            M{j}[s.m + e] = r.y;
            V{j}[s.v + e] = r.z;
        }}
        return;
    }}"""
