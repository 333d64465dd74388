"""Neural-network ops: softmax, log_softmax, layer_norm, dropout, cross_entropy, mse_loss.

Each op is a fused kernel with a fused backward. Row ops work on a contiguous [R, L] block: a
workgroup per row on GPUs, an invocation per row on CPU adapters (``row_mode``) within the loop
budget; rows too long for a workgroup are composed of chunked reductions; ops/rowops.py's GPU
variants take the passes its table names. Nothing here reads device data back to the host.
"""
from __future__ import annotations

import math

import numpy as np

from ..autograd.tape import record
from ..runtime.adapters import is_cpu_adapter
from ..runtime.asserts import CODES
from ..runtime.device import groups_1d
from ..runtime.errors import ShapeError, WgrumusError
from ..runtime.kernels import Kernel
from ..tensor import Storage, Tensor, check_same_device, float32, int32
from . import rowops, texread
from .bounds import LOOP_BUDGET, chunk_rows
from .elementwise import _f32, contiguous, map_op, saved_output, unbroadcast
from .random import next_seed
from .shape import permute, reshape

DROPOUT_STREAM = 0x0D0D  # RNG stream of dropout masks (rand/randn use streams 0 and 1)


def row_wg(L: int) -> int:
    """Workgroup size for a row of L elements: about 4 elements per invocation, 32..256."""
    wg = 32
    while wg < 256 and wg * 4 < L:
        wg *= 2
    return wg


ROW_MODE = None  # None: pick per adapter; "wg" or "thread" forces one (tests cover both)


def row_mode(dev) -> str:
    """'wg' (a workgroup per row) on GPUs; 'thread' (an invocation per row, no barriers) on
    CPU adapters, where each barrier costs microseconds and there are few cores anyway."""
    if ROW_MODE is not None:
        return ROW_MODE
    mode = getattr(dev, "_nn_row_mode", None)
    if mode is None:
        mode = dev._nn_row_mode = "thread" if is_cpu_adapter(dev) else "wg"
    return mode


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


def _along_last(x: Tensor, axis: int, fn):
    """Apply the last-axis row op ``fn`` along ``axis`` (a permute view on each side)."""
    nd = x.ndim
    if nd == 0:
        return reshape(fn(reshape(x, (1,))), ())
    if not -nd <= axis < nd:
        raise ShapeError(f"axis {axis} is out of range for a tensor with {nd} dimensions")
    axis %= nd
    if axis == nd - 1:
        return fn(x)
    perm = [a for a in range(nd) if a != axis] + [axis]
    inv = tuple(int(i) for i in np.argsort(perm))
    return permute(fn(permute(x, perm)), inv)


def _softmax_last(x: Tensor, log: bool, scale: float = 1.0, causal: bool = False) -> Tensor:
    xc = contiguous(_f32(x))
    L = xc.shape[-1]
    R = xc.numel() // L if L else 0
    if causal and xc.ndim < 2:
        raise ShapeError(f"causal softmax needs [..., queries, keys], got shape {xc.shape}")
    tq = xc.shape[-2] if causal else 0
    scale = float(scale)
    dev, lg = xc.device, str(log).lower()
    plan = row_kernel(dev, "softmax", "fwd", L, R, 2, cached=True, LOG=lg)
    if plan is None:
        return _softmax_long(xc, log, scale, causal)
    out = Tensor.empty(xc.shape, xc.device, float32)
    if R:
        xb, ob = xc._storage.buffer, out._storage.buffer
        fast = rowops.plan(dev, "sm_fwd", L, R, (xc.offset, out.offset), log)
        k, groups = fast or plan
        words = [R, L, xc.offset, out.offset, scale, tq]
        if fast or not _cached_softmax(k, {"X": xc}, [ob], words, R * L):
            dev.dispatch(k, [xb, xb, xb, ob] if fast else [xb, ob], words, groups)

    o = saved_output(out)  # no cycle out -> node -> closure -> out
    record("log_softmax" if log else "softmax", out, [xc],
           lambda g: (softmax_backward(o, g, log, scale, tq),), saved=[o])
    return out


def softmax_backward(out: Tensor, g: Tensor, log: bool = False, scale: float = 1.0,
                     tq: int = 0) -> Tensor:
    """d(input) of a last-axis (log_)softmax from its output, with the forward's ``scale`` and
    causal query count ``tq`` (0: no mask). One kernel."""
    g = contiguous(g)
    L = out.shape[-1]
    R = out.numel() // L if L else 0
    dev = out.device
    dx = Tensor.empty(out.shape, dev, float32)
    if R:
        words = [R, L, out.offset, g.offset, dx.offset, float(scale), tq]
        yb, gb, db = out._storage.buffer, g._storage.buffer, dx._storage.buffer
        fast = rowops.plan(dev, "sm_bwd", L, R, (out.offset, g.offset, dx.offset), log)
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
        got = [texread.elements(t, slot, n) for slot, t in enumerate(ins.values())] \
            if texread.enabled(dev) else [None]
        tex = None not in got
        bufs = [g[0] for g in got] if tex else [t._storage.buffer for t in ins.values()]
        if tex:
            words = words[:2] + [g[1] for g in got] + words[2 + len(got):]
        kc = Kernel.of("softmax_cpu", k.entry, LOG=dict(k.defines)["LOG"],
                       IN_DECLS=texread.decls({"X": 1, "YS": 1, "G": 3}, tex, "f32",
                                              elements=True))  # (the output at 2)
        dev.dispatch(kc, bufs[:1] + outs + bufs[1:], words, groups_1d(words[0], 64))
    return True


def _softmax_long(x: Tensor, log: bool, scale: float, causal: bool) -> Tensor:
    """(log_)softmax of rows too long for a workgroup, composed of autograd ops."""
    from ..autograd.tape import no_grad
    from .elementwise import div, exp, mul, sub
    from .elementwise import log as log_
    from .reduce import max as max_
    from .reduce import sum as sum_
    if causal:
        raise ShapeError(f"causal softmax over {x.shape[-1]} keys: rows this long are not "
                         f"supported with a causal mask; apply the mask to the scores instead")
    xs = mul(x, scale) if scale != 1.0 else x
    with no_grad():  # the shift cancels in the result
        m = max_(xs, axis=-1, keepdims=True)  # (positional dim: values and indices)
    z = sub(xs, m)
    e = exp(z)
    s = sum_(e, -1, keepdims=True)
    return sub(z, log_(s)) if log else div(e, s)


def _check_causal(axis, x, causal):
    if causal and axis not in (-1, x.ndim - 1):
        raise ShapeError(f"causal softmax works along the last axis (keys), not axis {axis}")


def softmax(x: Tensor, axis: int = -1, *, scale: float = 1.0, causal: bool = False) -> Tensor:
    """Softmax along ``axis`` (all -inf rows give NaN). For attention: ``scale`` multiplies x
    first; ``causal`` masks key j of query i where j > i + keys - queries ([..., q, k])."""
    _check_causal(axis, x, causal)
    return _along_last(x, axis, lambda t: _softmax_last(t, False, scale, causal))


def log_softmax(x: Tensor, axis: int = -1, *, scale: float = 1.0,
                causal: bool = False) -> Tensor:
    """x - logsumexp(x) along ``axis`` (stable); ``scale``, ``causal`` as in softmax."""
    _check_causal(axis, x, causal)
    return _along_last(x, axis, lambda t: _softmax_last(t, True, scale, causal))


def layer_norm(x: Tensor, normalized_shape, weight=None, bias=None, eps: float = 1e-5) -> Tensor:
    """PyTorch's layer_norm over the trailing ``normalized_shape`` dims (biased variance)."""
    ns = (int(normalized_shape),) if isinstance(normalized_shape, (int, np.integer)) \
        else tuple(int(s) for s in normalized_shape)
    if len(ns) > x.ndim or x.shape[x.ndim - len(ns):] != ns:
        raise ShapeError(f"layer_norm: normalized_shape {ns} does not match the trailing "
                         f"dimensions of the input shape {x.shape}")
    for name, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.shape) != ns:
            raise ShapeError(f"layer_norm: {name} shape {tuple(p.shape)} != normalized_shape {ns}")
    check_same_device(x, *(p for p in (weight, bias) if p is not None), op="layer_norm")
    xc = contiguous(_f32(x))
    wc = contiguous(_f32(weight)) if weight is not None else None
    bc = contiguous(_f32(bias)) if bias is not None else None
    L = math.prod(ns)
    R = xc.numel() // L if L else 0
    dev = xc.device
    plan = row_kernel(dev, "layernorm", "fwd", L, R, 3, cached=True)
    if plan is None:
        return _layer_norm_long(xc, wc, bc, R, L, eps)
    out = Tensor.empty(xc.shape, dev, float32)
    mean = Tensor.empty((R,), dev, float32)
    rstd = Tensor.empty((R,), dev, float32)
    if R and L:
        xb = xc._storage.buffer
        offs = (xc.offset, wc.offset if wc is not None else 0,
                bc.offset if bc is not None else 0, out.offset)
        words = [R, L, *offs, float(eps), int(wc is not None), int(bc is not None)]
        outs = [out._storage.buffer, mean._storage.buffer, rstd._storage.buffer]
        if not _ln_cpu(dev, "fwd_rowc", L, R, [xc, wc, bc], outs, words):
            k, groups = rowops.plan(dev, "ln_fwd", L, R, offs) or plan
            dev.dispatch(k,
                         [xb, wc._storage.buffer if wc is not None else xb,
                          bc._storage.buffer if bc is not None else xb] + outs, words, groups)

    def bw(g):
        g = contiguous(g)
        gw = gbias = None
        want = (wc is not None and wc.requires_grad) or (bc is not None and bc.requires_grad)
        got = _backward_with_wb(xc, g, wc, mean, rstd) if want and xc.requires_grad else None
        if got is not None:
            dx, both = got
        else:
            dx = layer_norm_backward(xc, g, wc, mean, rstd) if xc.requires_grad else None
            both = _weight_bias_grads(xc, g, mean, rstd, R, L) if want else None
        if want:
            gw = reshape(both[0], ns) if wc is not None else None
            gbias = reshape(both[1], ns) if bc is not None else None
        return dx, gw, gbias
    record("layer_norm", out, [xc, wc, bc], bw, saved=[xc] + ([wc] if wc is not None else []))
    return out


def layer_norm_backward(xc: Tensor, g: Tensor, wc, mean: Tensor, rstd: Tensor) -> Tensor:
    """d(input) of layer_norm from d(output), the weight (or None) and the row statistics."""
    dev = xc.device
    R = mean.numel()
    L = xc.numel() // R if R else 0
    dx = Tensor.empty(xc.shape, dev, float32)
    if R and L:
        xb = xc._storage.buffer
        woff = wc.offset if wc is not None else 0
        k, groups = (rowops.plan(dev, "ln_bwd", L, R, (xc.offset, g.offset, woff, dx.offset))
                     or row_kernel(dev, "layernorm", "bwd", L, R, 2, cached=True))
        dev.dispatch(k, [xb, g._storage.buffer, wc._storage.buffer if wc is not None else xb,
                         dx._storage.buffer, mean._storage.buffer, rstd._storage.buffer],
                     [R, L, xc.offset, g.offset, woff, int(wc is not None), dx.offset], groups)
    return dx


def _ln_cpu(dev, entry: str, L: int, R: int, ins, outs, words) -> bool:
    """Run ``entry`` of layernorm_cpu.wgsl on ``ins`` (bindings 1-3; None: unread) and
    ``outs``, vec4 and through textures where aligned. False (nothing run): not a CPU adapter
    with known subgroups in thread row mode, or rows longer than ROWC."""
    from .matmul import cpu_subgroup
    if row_mode(dev) != "thread" or not (R and L and cpu_subgroup(dev)) or L > ROWC:
        return False
    v = 4 if L % 4 == 0 and all(t.offset % 4 == 0 for t in ins if t is not None) else 1
    vt = "vec4<f32>" if v == 4 else "f32"
    sizes = (R * L, R * L if entry == "bwd_wb_rowc" else L, L)
    with dev.lock:  # (the operand textures hold the inputs until this dispatch has read them)
        src = [None if t is None else t._storage.buffer for t in ins]
        views = [None if t is None else texread.operand(t, slot, n) for slot, (t, n) in
                 enumerate(zip(ins, sizes))] if v == 4 and texread.enabled(dev) else [None]
        tex = all(w is not None for w, t in zip(views, ins) if t is not None)
        if tex:
            src, words = views, words[:2] + [0, 0, 0] + words[5:]
        k = Kernel.of("layernorm_cpu", entry, V=v, VT=vt, RN=1 << (-(-L // v) - 1).bit_length(),
                      HSUM="dot(v, vec4<f32>(1.0))" if v == 4 else "v",
                      IN_DECLS=texread.decls({"X": 1, "W": 2, "G": 2, "B": 3, "WB": 3}, tex, vt))
        dev.dispatch(k, [b if b is not None else src[0] for b in src] + outs, words,
                     groups_1d(R, 64))
    return True


def _backward_with_wb(xc, g, wc, mean, rstd):
    """(d(input), weight and bias gradients) in two kernels where _ln_cpu runs; else None."""
    from .matmul import cpu_subgroup
    dev = xc.device
    R = mean.numel()
    L = xc.numel() // R if R else 0
    sg = cpu_subgroup(dev)
    chunks = -(-R // sg) if sg else 0  # (colsum loops over the chunks)
    if not sg or chunks > LOOP_BUDGET:
        return None
    dx = Tensor.empty(xc.shape, dev, float32)
    part = Tensor.empty((2, chunks, L), dev, float32)
    words = [R, L, xc.offset, g.offset, wc.offset if wc is not None else 0, int(wc is not None),
             dx.offset, part.offset]
    if not _ln_cpu(dev, "bwd_wb_rowc", L, R, [xc, g, wc],
                   [dx._storage.buffer, mean._storage.buffer, rstd._storage.buffer,
                    part._storage.buffer], words):
        return None
    return dx, _sum_parts(part, L, chunks)


def _layer_norm_long(xc, wc, bc, R, L, eps):
    """layer_norm of rows too long for a workgroup, composed of autograd ops."""
    from .elementwise import add, mul, rsqrt, square, sub
    from .reduce import mean as mean_
    x2 = reshape(xc, (R, L))
    d = sub(x2, mean_(x2, 1, keepdims=True))
    y = reshape(mul(d, rsqrt(add(mean_(square(d), 1, keepdims=True), float(eps)))), xc.shape)
    y = mul(y, wc) if wc is not None else y
    return add(y, bc) if bc is not None else y


def _weight_bias_grads(xc, g, mean, rstd, R, L):
    """dweight, dbias: column sums of g * xhat and g in two deterministic passes."""
    dev = xc.device
    # enough chunks to fill a GPU, few enough that the second pass's loop stays short
    rows = chunk_rows(R, 32)
    chunks = -(-R // rows)
    part = Tensor.empty((2, chunks, L), dev, float32)
    dev.dispatch(Kernel.of("layernorm", "wb", WG=32),
                 [xc._storage.buffer, g._storage.buffer, xc._storage.buffer,
                  part._storage.buffer, mean._storage.buffer, rstd._storage.buffer],
                 [R, L, xc.offset, g.offset, rows, chunks], (-(-L // 64), chunks, 1))
    return _sum_parts(part, L, chunks)


def _sum_parts(part, L, chunks):
    """(dweight, dbias): sums over the chunks of partials [2, chunks, L]."""
    both = Tensor.empty((2, L), part.device, float32)
    part.device.dispatch(Kernel.of("colsum"), [part._storage.buffer, both._storage.buffer],
                         [L, chunks, part.offset, both.offset], (-(-L // 64), 2, 1))
    return both[0], both[1]


def dropout(x: Tensor, p: float = 0.5, training: bool = True, seed=None) -> Tensor:
    """Inverted dropout; the mask is a pure function of (seed, index), so backward regenerates
    it instead of storing it (``seed=None``: the global generator)."""
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    x = _f32(x)
    if p == 1.0:
        out = map_op("0.0", [x])
        record("dropout", out, [x], lambda g: (map_op("0.0", [g], shape=x.shape),))
        return out
    s = next_seed(seed)
    expr = f"select(0.0, a * scale, uniform_(seed, i, {DROPOUT_STREAM}u) >= p)"
    scalars = {"seed": np.uint32(s), "scale": 1.0 / (1.0 - p), "p": float(p)}
    out = map_op(expr, [x], scalars=scalars)
    record("dropout", out, [x], lambda g: (map_op(expr, [g], shape=x.shape, scalars=scalars),))
    return out


_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction):
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _targets(targets, like: Tensor):
    """(int32 targets on ``like``'s device, the host array or None: host data is range-checked
    before upload, device data by the kernel)."""
    if isinstance(targets, Tensor):
        if targets.dtype != int32:
            raise WgrumusError(f"cross_entropy targets must be int32 class indices, got "
                               f"{targets.dtype}; convert with .int() (probabilities as targets "
                               f"are not supported)")
        if targets.device is not like.device:
            from ..runtime.errors import DeviceMismatchError
            raise DeviceMismatchError(f"cross_entropy: logits on {like.device}, targets on "
                                      f"{targets.device}; move them with .to(device) first")
        return contiguous(targets), None
    a = np.asarray(targets)
    if a.dtype.kind not in "iu":
        raise WgrumusError(f"cross_entropy targets must be integer class indices, got numpy "
                           f"dtype {a.dtype}")
    return Tensor.from_numpy(a.astype(np.int64), device=like.device, dtype=int32), a


def cross_entropy(logits: Tensor, targets, ignore_index: int = -100,
                  label_smoothing: float = 0.0, reduction: str = "mean") -> Tensor:
    """PyTorch's cross_entropy with integer targets (logits [N, C], [C] or [N, C, d...]). A
    target outside [0, C) raises: host targets at once, device targets at the next host read."""
    _check_reduction(reduction)
    eps = float(label_smoothing)
    if not 0.0 <= eps <= 1.0:
        raise ValueError(f"label_smoothing must be in [0, 1], got {eps}")
    if logits.ndim == 0:
        raise ShapeError("cross_entropy: logits must have a class dimension, got a 0-d tensor")
    lg = _f32(logits)
    if lg.ndim == 1:
        lg = reshape(lg, (1,) + lg.shape)
        tshape = ()
    else:
        tshape = (lg.shape[0],) + lg.shape[2:]
    if lg.ndim > 2:  # [N, C, d...] -> [N * d..., C]
        lg = permute(lg, [0] + list(range(2, lg.ndim)) + [1])
    C = lg.shape[-1]
    lg = contiguous(reshape(lg, (-1, C)) if lg.ndim != 2 else lg)
    N = lg.shape[0]
    tt, host = _targets(targets, lg)
    if host is not None:
        bad = host[(host != ignore_index) & ((host < 0) | (host >= C))]
        if bad.size:
            raise WgrumusError(f"cross_entropy: target {int(bad.flat[0])} is out of range for "
                               f"{C} classes (valid: 0..{C - 1} or ignore_index={ignore_index})")
    if tuple(tt.shape) != tshape:
        raise ShapeError(f"cross_entropy: targets shape {tuple(tt.shape)} does not match logits "
                         f"shape {tuple(logits.shape)} (expected {tshape})")
    tt = reshape(tt, (N,)) if tt.ndim != 1 else tt
    dev = lg.device
    plan = row_kernel(dev, "xent", "fwd", C, N, 1)
    if plan is None or N > 256 * (LOOP_BUDGET - 64):  # past what the kernels bound
        out = _cross_entropy_long(lg, tt, int(ignore_index), eps, reduction)
        return reshape(out, tshape) if reduction == "none" else out
    rows = Tensor.empty((N,), dev, float32)
    lse = Tensor.empty((2 * N,), dev, float32)  # rows' max, then their log(sum exp(x - max))
    tb = tt._storage.buffer
    if N:
        k, groups = plan
        lb, rb, sb = lg._storage.buffer, rows._storage.buffer, lse._storage.buffer
        fast = rowops.plan(dev, "xe_stats", C, N, (lg.offset,))
        if fast:  # row statistics by a GPU row variant, then the losses per row
            dev.dispatch(fast[0], [lb, lb, lb, dev.asserts.buffer, sb, rb],
                         [N, C, lg.offset], fast[1])
            k, groups = Kernel.of("xent", "loss_rows", WG=32), groups_1d(N, 64)
        dev.dispatch(k, [lb, tb, rb, sb, dev.asserts.buffer],
                     [N, C, lg.offset, tt.offset, int(ignore_index), eps,
                      CODES["cross_entropy target"]], groups)
        if host is None:  # targets held on the device: the kernel checks them
            dev.asserts.arm()
    if reduction == "none":
        out, count = rows, None
    else:
        red = Storage(dev, 8)
        dev.dispatch(Kernel.of("xent", "finish", WG=256), [rows._storage.buffer, tb, red.buffer],
                     [N, tt.offset, int(ignore_index), int(reduction == "mean")], (1, 1, 1))
        out = Tensor(red, ())
        count = Tensor(red, (), offset=1)
    mode = {"mean": 0, "sum": 1, "none": 2}[reduction]

    def bw(g):
        g = contiguous(g)
        dx = Tensor.empty((N, C), dev, float32)
        cnt = count if count is not None else g
        if N * C:  # CPU adapters: a row an invocation (xent.wgsl bwd_rows)
            rows = row_mode(dev) == "thread" and C <= LOOP_BUDGET
            dev.dispatch(Kernel.of("xent", "bwd_rows" if rows else "bwd", WG=32),
                         [lg._storage.buffer, tb, dx._storage.buffer, lse._storage.buffer,
                          dev.asserts.buffer, g._storage.buffer, cnt._storage.buffer],
                         [N, C, lg.offset, tt.offset, int(ignore_index), eps, mode,
                          g.offset, cnt.offset], groups_1d(N, 64) if rows else groups_1d(N * C))
        return (dx,)
    record("cross_entropy", out, [lg], bw, saved=[lg, tt])
    return reshape(out, tshape) if reduction == "none" else out


def _cross_entropy_long(lg: Tensor, tt: Tensor, ignore: int, eps: float, reduction: str):
    """cross_entropy past the fused kernels' bounds, composed of autograd ops."""
    from .elementwise import add, div, mul, neg
    from .indexing import gather
    from .reduce import mean as mean_
    from .reduce import sum as sum_
    N = lg.shape[0]
    lsm = _softmax_long(lg, True, 1.0, False)
    safe = map_op("select(a, 0, a == ignore)", [tt], dtype=int32, scalars={"ignore": ignore})
    loss = neg(reshape(gather(lsm, 1, reshape(safe, (N, 1))), (N,)))
    if eps:
        loss = add(mul(loss, 1.0 - eps), mul(reshape(mean_(lsm, 1), (N,)), -eps))
    keep = map_op("select(1.0, 0.0, a == ignore)", [tt], scalars={"ignore": ignore})
    rows = mul(loss, keep)
    if reduction == "none":
        return rows
    return sum_(rows) if reduction == "sum" else div(sum_(rows), sum_(keep))


def mse_loss(a: Tensor, b: Tensor, reduction: str = "mean") -> Tensor:
    """(a - b)^2, reduced (a and b broadcast together, as in PyTorch)."""
    _check_reduction(reduction)
    if not isinstance(b, Tensor):
        from ..tensor import tensor
        b = tensor(np.asarray(b, np.float32), device=a.device)
    a, b = _f32(a), _f32(b)
    sq = map_op("(a - b) * (a - b)", [a, b])

    def bw(g):
        d = map_op("2.0 * a * (b - c)", [g, a, b])
        return (unbroadcast(d, a.shape) if a.requires_grad else None,
                unbroadcast(map_op("-a", [d]), b.shape) if b.requires_grad else None)
    record("mse", sq, [a, b], bw, saved=[a, b])
    if reduction == "none":
        return sq
    from .reduce import mean
    from .reduce import sum as _sum
    return mean(sq) if reduction == "mean" else _sum(sq)
