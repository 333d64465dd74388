"""Row kernels (softmax, layer_norm, cross_entropy over a contiguous [R, L] block): a workgroup
per row on GPUs, an invocation per row on CPU adapters (``row_mode``) within the loop budget,
rows of up to ROWC read once on CPU adapters (the *_cpu.wgsl entries, inputs through
textures); rows_gpu.py holds the GPU variants its table picks. The caller passes the outputs
(contiguous f32; from offset 0 where an op says so); each op returns them, None (nothing run)
where a row is longer than the kernels bound (the op composes such rows of other ops). Row
statistics only a backward reads (layer_norm's mean and rstd, cross_entropy's log-sum-exp)
come back as scratch views."""
from __future__ import annotations

import math

from ..runtime.asserts import CODES
from ..runtime.buffer_view import BufferView, View, float32
from ..runtime.device import groups_1d
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from . import rows_gpu, texture
from .bounds import LOOP_BUDGET, chunk_rows
from .matmul_cpu import cpu_subgroup


def row_wg(L: int) -> int:
    """Workgroup size for a row of L elements: about 4 elements per invocation, 32..256."""
    wg = 32
    while wg < 256 and wg * 4 < L:
        wg *= 2
    return wg


def row_mode(dev) -> str:
    """'wg' (a workgroup per row) on GPUs; 'thread' (an invocation per row, no barriers) on
    CPU adapters, where each barrier costs microseconds and there are few cores anyway
    (the adapter profile's choice; TUNING.row_mode forces one)."""
    mode = TUNING.row_mode
    return profile(dev).row_mode if mode is None else mode


# longest row of the cached row kernels (entries *_rowc, CPU adapters: the length of their
# private arrays: const ROWC in common.wgsl)
ROWC = 256


def row_kernel(dev, family: str, entry: str, L: int, R: int, loops: int, cached: bool = False,
               **defines):
    """(kernel, workgroups) of a row op in the device's row mode, or None when a row is too
    long for a workgroup (the caller composes reductions). ``loops``: passes over a row;
    ``cached``: use ``<entry>_rowc`` (a row of <= ROWC read once) in thread mode."""
    if row_mode(dev) == "thread" and loops * L <= LOOP_BUDGET:
        rows = "_rowc" if cached and L <= ROWC else "_rows"
        return Kernel.of(family, entry + rows, WG=32, **defines), groups_1d(R, 64)
    if loops * -(-L // 256) > LOOP_BUDGET - 64:
        return None
    return Kernel.of(family, entry, WG=row_wg(L), **defines), groups_1d(R, 1)


# ---------------------------------------------------------------------------- softmax


def softmax(xc: BufferView, log: bool, scale: float, tq: int, out: BufferView):
    """``out``: (log_)softmax of the rows of contiguous f32 ``xc`` (last axis), ``scale``
    applied first and keys past ``tq`` queries' diagonals masked (0: no mask); None (nothing
    run) where a row is longer than one workgroup reduces."""
    L = xc.shape[-1]
    R = math.prod(xc.shape) // L if L else 0
    dev = xc.device
    plan = row_kernel(dev, "softmax", "fwd", L, R, 2, cached=True, LOG=str(log).lower())
    if plan is None:
        return None
    if R:
        xb, ob = xc.buffer, out.buffer
        fast = rows_gpu.plan(dev, "sm_fwd", L, R, (xc.offset, out.offset), log)
        k, groups = fast or plan
        words = [R, L, xc.offset, out.offset, scale, tq]
        if fast or not _cached_softmax(k, {"X": xc}, [ob], words, R * L):
            dev.dispatch(k, [xb, xb, xb, ob] if fast else [xb, ob], words, groups)
    return out


def softmax_backward(out: BufferView, g: BufferView, dx: BufferView, log: bool = False,
                     scale: float = 1.0, tq: int = 0) -> BufferView:
    """``dx``: d(input) of a last-axis (log_)softmax from its output and contiguous ``g``, with
    the forward's ``scale`` and causal query count ``tq`` (0: no mask). One kernel."""
    L = out.shape[-1]
    R = math.prod(out.shape) // L if L else 0
    dev = out.device
    if R:
        words = [R, L, out.offset, g.offset, dx.offset, float(scale), tq]
        yb, gb, db = out.buffer, g.buffer, dx.buffer
        fast = rows_gpu.plan(dev, "sm_bwd", L, R, (out.offset, g.offset, dx.offset), log)
        if fast:
            dev.dispatch(fast[0], [yb, gb, gb, db], words, fast[1])
            return dx
        plan = row_kernel(dev, "softmax", "bwd", L, R, 2, cached=True, LOG=str(log).lower())
        if plan is None:
            raise ShapeError(f"softmax_backward: rows of {L} elements are longer than one "
                             f"workgroup can reduce; use softmax() (it splits such rows)")
        if not _cached_softmax(plan[0], {"YS": out, "G": g}, [db], words, R * L):
            dev.dispatch(plan[0], [yb, db, gb], words, plan[1])
    return dx


def _cached_softmax(k: Kernel, ins: dict, outs, words, n: int) -> bool:
    """Run a cached row entry (*_rowc) from softmax_cpu.wgsl, inputs through textures where
    they fit; False where row_kernel picked another entry."""
    if not k.entry.endswith("_rowc"):
        return False
    dev = next(iter(ins.values())).device
    with dev.lock:  # (the operand textures hold the inputs until this dispatch has read them)
        got = [texture.elements(t, slot, n) for slot, t in enumerate(ins.values())] \
            if texture.enabled(dev) else [None]
        tex = None not in got
        bufs = [g[0] for g in got] if tex else [t.buffer for t in ins.values()]
        if tex:
            words = words[:2] + [g[1] for g in got] + words[2 + len(got):]
        kc = Kernel.of("softmax_cpu", k.entry, LOG=dict(k.defines)["LOG"],
                       IN_DECLS=texture.decls({"X": 1, "YS": 1, "G": 3}, tex, "f32",
                                              elements=True))  # (the output at 2)
        dev.dispatch(kc, bufs[:1] + outs + bufs[1:], words, groups_1d(words[0], 64))
    return True


# ---------------------------------------------------------------------------- layer_norm


def layer_norm(xc: BufferView, wc, bc, L: int, eps: float, out: BufferView):
    """(out, mean, rstd): ``out`` = layer_norm over rows of L of contiguous f32 ``xc`` with
    contiguous weight ``wc`` and bias ``bc`` (either None), and the rows' statistics (scratch
    views for the backward); None (nothing run) where a row is longer than one workgroup
    reduces."""
    R = math.prod(xc.shape) // L if L else 0
    dev = xc.device
    plan = row_kernel(dev, "layernorm", "fwd", L, R, 3, cached=True)
    if plan is None:
        return None
    mean = View.empty((R,), dev, float32)
    rstd = View.empty((R,), dev, float32)
    if R and L:
        offs = (xc.offset, wc.offset if wc is not None else 0,
                bc.offset if bc is not None else 0, out.offset)
        words = [R, L, *offs, float(eps), int(wc is not None), int(bc is not None)]
        outs = [out.buffer, mean.buffer, rstd.buffer]
        if not _ln_cpu(dev, "fwd_rowc", L, R, [xc, wc, bc], outs, words):
            k, groups = rows_gpu.plan(dev, "ln_fwd", L, R, offs) or plan
            dev.dispatch(k, [(t if t is not None else xc).buffer for t in (xc, wc, bc)] + outs,
                         words, groups)
    return out, mean, rstd


def layer_norm_backward(xc: BufferView, g: BufferView, wc, mean: BufferView,
                        rstd: BufferView, dx: BufferView) -> BufferView:
    """``dx``: d(input) of layer_norm from contiguous d(output) ``g``, the weight (or None) and
    the row statistics."""
    dev = xc.device
    R = math.prod(mean.shape)
    L = math.prod(xc.shape) // R if R else 0
    if R and L:
        woff = wc.offset if wc is not None else 0
        k, groups = (rows_gpu.plan(dev, "ln_bwd", L, R, (xc.offset, g.offset, woff, dx.offset))
                     or row_kernel(dev, "layernorm", "bwd", L, R, 2, cached=True))
        dev.dispatch(k, [xc.buffer, g.buffer, (wc if wc is not None else xc).buffer,
                         dx.buffer, mean.buffer, rstd.buffer],
                     [R, L, xc.offset, g.offset, woff, int(wc is not None), dx.offset], groups)
    return dx


def layer_norm_backward_with_wb(xc, g, wc, mean, rstd, dx, dwb):
    """(dx, dwb): d(input) and [d(weight), d(bias)] ([2, L]) in two kernels where the CPU
    adapters' cached rows run (_ln_cpu); else None (nothing run)."""
    dev = xc.device
    R = math.prod(mean.shape)
    L = math.prod(xc.shape) // R if R else 0
    sg = cpu_subgroup(dev)
    chunks = -(-R // sg) if sg else 0  # (colsum loops over the chunks)
    if not sg or chunks > LOOP_BUDGET:
        return None
    part = View.empty((2, chunks, L), dev, float32)
    words = [R, L, xc.offset, g.offset, wc.offset if wc is not None else 0, int(wc is not None),
             dx.offset, part.offset]
    if not _ln_cpu(dev, "bwd_wb_rowc", L, R, [xc, g, wc],
                   [dx.buffer, mean.buffer, rstd.buffer, part.buffer], words):
        return None
    return dx, _sum_parts(part, L, chunks, dwb)


def layer_norm_weight_bias_grads(xc, g, mean, rstd, R, L, dwb):
    """``dwb`` [2, L]: d(weight) and d(bias), column sums of g * xhat and g in two
    deterministic passes."""
    dev = xc.device
    # enough chunks to fill a GPU, few enough that the second pass's loop stays short
    rows = chunk_rows(R, 32)
    chunks = -(-R // rows)
    part = View.empty((2, chunks, L), dev, float32)
    dev.dispatch(Kernel.of("layernorm", "wb", WG=32),
                 [xc.buffer, g.buffer, xc.buffer, part.buffer, mean.buffer, rstd.buffer],
                 [R, L, xc.offset, g.offset, rows, chunks], (-(-L // 64), chunks, 1))
    return _sum_parts(part, L, chunks, dwb)


def _sum_parts(part, L, chunks, both):
    """``both`` [2, L]: sums over the chunks of partials [2, chunks, L]."""
    part.device.dispatch(Kernel.of("colsum"), [part.buffer, both.buffer],
                         [L, chunks, part.offset, both.offset], (-(-L // 64), 2, 1))
    return both


def _ln_cpu(dev, entry: str, L: int, R: int, ins, outs, words) -> bool:
    """Run ``entry`` of layernorm_cpu.wgsl on ``ins`` (bindings 1-3; None: unread) and
    ``outs``, vec4 and through textures where aligned. False (nothing run): not a CPU adapter
    with known subgroups in thread row mode, or rows longer than ROWC."""
    if row_mode(dev) != "thread" or not (R and L and cpu_subgroup(dev)) or L > ROWC:
        return False
    v = 4 if L % 4 == 0 and all(t.offset % 4 == 0 for t in ins if t is not None) else 1
    vt = "vec4<f32>" if v == 4 else "f32"
    sizes = (R * L, R * L if entry == "bwd_wb_rowc" else L, L)
    with dev.lock:  # (the operand textures hold the inputs until this dispatch has read them)
        src = [None if t is None else t.buffer for t in ins]
        views = [None if t is None else texture.operand(t, slot, n) for slot, (t, n) in
                 enumerate(zip(ins, sizes))] if v == 4 and texture.enabled(dev) else [None]
        tex = all(w is not None for w, t in zip(views, ins) if t is not None)
        if tex:
            src, words = views, words[:2] + [0, 0, 0] + words[5:]
        k = Kernel.of("layernorm_cpu", entry, V=v, VT=vt, RN=1 << (-(-L // v) - 1).bit_length(),
                      HSUM="dot(v, vec4<f32>(1.0))" if v == 4 else "v",
                      IN_DECLS=texture.decls({"X": 1, "W": 2, "G": 2, "B": 3, "WB": 3}, tex, vt))
        dev.dispatch(k, [b if b is not None else src[0] for b in src] + outs, words,
                     groups_1d(R, 64))
    return True


# ---------------------------------------------------------------------------- cross_entropy


def cross_entropy_rows(lg: BufferView, tt: BufferView, ignore: int, eps: float, checked: bool,
                       rows: BufferView):
    """(rows, lse): ``rows`` [N] (f32 from its offset 0) = the loss per row, and a scratch view
    of the rows' log-sum-exp as 2N words (N maxima, then N log(sum exp(x - max)), exact at
    large logit offsets) of contiguous f32 logits [N, C] and int32 targets ``tt`` [N]; a
    target out of range raises at the next host read unless ``checked`` (the caller did).
    None (nothing run) past what the kernels bound."""
    N, C = lg.shape
    dev = lg.device
    plan = row_kernel(dev, "xent", "fwd", C, N, 1)
    if plan is None or N > 256 * (LOOP_BUDGET - 64):
        return None
    lse = View.empty((2 * N,), dev, float32)  # rows' max, then their log(sum exp(x - max))
    if N:
        k, groups = plan
        lb, rb, sb = lg.buffer, rows.buffer, lse.buffer
        fast = rows_gpu.plan(dev, "xe_stats", C, N, (lg.offset,))
        if fast:  # row statistics by a GPU row variant, then the losses per row
            dev.dispatch(fast[0], [lb, lb, lb, dev.asserts.buffer, sb, rb],
                         [N, C, lg.offset], fast[1])
            k, groups = Kernel.of("xent", "loss_rows", WG=32), groups_1d(N, 64)
        dev.dispatch(k, [lb, tt.buffer, rb, sb, dev.asserts.buffer],
                     [N, C, lg.offset, tt.offset, int(ignore), eps,
                      CODES["cross_entropy target"]], groups)
        if not checked:  # targets held on the device: the kernel checks them
            dev.asserts.arm()
    return rows, lse


def cross_entropy_reduce(rows: BufferView, tt: BufferView, ignore: int, mean: bool,
                         red: BufferView) -> BufferView:
    """``red`` [2] (f32 from its offset 0) = (the sum or mean of the losses ``rows`` over
    targets not ``ignore``, their count)."""
    rows.device.dispatch(Kernel.of("xent", "finish", WG=256),
                         [rows.buffer, tt.buffer, red.buffer],
                         [rows.shape[0], tt.offset, int(ignore), int(mean)], (1, 1, 1))
    return red


def cross_entropy_backward(lg, tt, lse, g, count, ignore: int, eps: float, mode: int,
                           dx: BufferView) -> BufferView:
    """``dx`` [N, C] (contiguous f32 from its offset 0): d(logits) given the loss gradient
    ``g`` (contiguous) and the kept-target ``count`` (``mode``: 0 mean, 1 sum, 2 none)."""
    N, C = lg.shape
    dev = lg.device
    if N * C:  # CPU adapters: a row an invocation (xent.wgsl bwd_rows)
        per_row = row_mode(dev) == "thread" and C <= LOOP_BUDGET
        dev.dispatch(Kernel.of("xent", "bwd_rows" if per_row else "bwd", WG=32),
                     [lg.buffer, tt.buffer, dx.buffer, lse.buffer, dev.asserts.buffer,
                      g.buffer, count.buffer],
                     [N, C, lg.offset, tt.offset, int(ignore), eps, mode, g.offset,
                      count.offset], groups_1d(N, 64) if per_row else groups_1d(N * C))
    return dx
