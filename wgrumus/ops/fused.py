"""Fused layer ops: Linear with bias, activation and residual, and causal self-attention from a
packed qkv projection. Each is one autograd node calling kernels directly, so a step records a
few nodes instead of dozens of views, copies and broadcasts: the bias gradient is fused with
the activation's backward, the weight gradient comes out [out, in], and attention splits and
assembles the heads with at most one copy each way (none on CPU adapters: ops/attention_cpu.py).
"""
from __future__ import annotations

import math

from ..autograd.tape import needs_grad, no_grad, record
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import Tensor, check_same_device, float32
from . import attention_cpu, texread
from .attention import attention_backward, attention_forward, prefer_fused
from .bounds import chunk_rows
from .creation import dummy_buffer
from .elementwise import _f32, cast, contiguous, run_map, saved_output
from .matmul import linear_2d, matmul, matmul_into, use_cpu_kernel
from .nnops import softmax, softmax_backward
from .precision import autocast_dtype, in_forward_precision
from .shape import permute, reshape, transpose

# activation: (forward expression of z, dz expression of g and z)
ACTIVATIONS = {
    None: ("{z}", "g"),
    "relu": ("max({z}, 0.0)", "select(0.0, g, z > 0.0)"),
    "gelu": ("gelu_({z})", "g * gelu_grad_(z)"),
    "gelu_tanh": ("gelu_tanh_({z})", "g * gelu_tanh_grad_(z)"),
}

def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None,
           activation: str | None = None, residual: Tensor | None = None) -> Tensor:
    """act(x @ weight.T + bias) with weight [out, in]; ``activation``: None, "relu", "gelu"
    or "gelu_tanh". ``residual`` (no activation) is added in the same kernel as the bias."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"linear: activation must be one of {list(ACTIVATIONS)}, "
                         f"got {activation!r}")
    if residual is not None:
        if activation is not None:
            raise ValueError("linear: residual works without an activation (act(z) + r is "
                             "not fused); add the residual separately")
        want = x.shape[:-1] + (weight.shape[0],)
        if tuple(residual.shape) != want:
            raise ShapeError(f"linear: residual shape {residual.shape} != output shape {want}")
        check_same_device(x, residual, op="linear")
    if weight.ndim != 2 or x.ndim == 0 or x.shape[-1] != weight.shape[1]:
        raise ShapeError(f"linear: input {x.shape} does not match weight {weight.shape} "
                         f"([out, in]: the input's last dim must be {weight.shape[-1]})")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise ShapeError(f"linear: bias shape {bias.shape} != ({weight.shape[0]},)")
    check_same_device(x, weight, *([bias] if bias is not None else []), op="linear")
    n_out, n_in = weight.shape
    lead = x.shape[:-1]
    fwd, grad_expr = ACTIVATIONS[activation]
    with no_grad():
        x2 = contiguous(reshape(_f32(x), (math.prod(lead), n_in)))  # (no -1: n_in may be 0)
        b = contiguous(_f32(bias)) if bias is not None else None
        # the backward needs u = x @ W.T itself (relu' reads the output, None reads nothing)
        keep_u = activation not in (None, "relu")
        wt = transpose(weight, 0, 1)
        r2 = (contiguous(reshape(_f32(residual), (math.prod(lead), n_out)))
              if residual is not None else None)
        ub = b  # the bias the backward adds to u (None: u includes it)
        if keep_u:  # (no residual: checked above)
            # the activation in the matmul's epilogue, which also stores its argument u + bias
            # (no pass of its own over the output)
            u, ub = Tensor.empty((x2.shape[0], n_out), x2.device, float32), None
            y = linear_2d(x2, _f32(wt), b, None, fwd, r16=autocast_dtype() is not None, pre=u)
        else:  # bias, residual and relu in the matmul's epilogue
            y = linear_2d(x2, _f32(wt), b, r2, fwd if activation else None,
                          r16=autocast_dtype() is not None)  # autocast: f16 product
    out = reshape(y, lead + (n_out,)) if x.ndim != 2 else y
    if not needs_grad(x, weight, bias, residual):
        return out
    N = x2.shape[0]
    z_saved = u if keep_u else saved_output(y)

    def bw(g):
        g2 = contiguous(reshape(g, (N, n_out)))
        db = None
        if bias is not None or activation is not None:
            dz, db = _epilogue_grad(g2, z_saved if activation else None, ub if keep_u else None,
                                    grad_expr, bias is not None and bias.requires_grad,
                                    activation is not None)
        else:
            dz = g2
        dx = dw = None
        if x.requires_grad:
            dx = matmul(dz, weight)
            dx = reshape(dx, x.shape) if x.ndim != 2 else dx
        if weight.requires_grad:
            dw = matmul(transpose(dz, 0, 1), x2)  # [out, in], contiguous
        if residual is None:
            return dx, dw, db
        return dx, dw, db, (g if residual.requires_grad else None)
    record("linear" + (f"_{activation}" if activation else ""), out,
           [x, weight, bias] + ([residual] if residual is not None else []),
           in_forward_precision(bw),
           saved=[x2, weight, z_saved] + ([b] if b is not None else []))
    return out


def _epilogue_grad(g: Tensor, z: Tensor | None, b: Tensor | None, grad_expr: str,
                   want_db: bool, has_act: bool):
    """(dz, db) of y = act(z + b) for contiguous [R, L] g: dz and per-chunk column sums in one
    kernel, the partials summed by a second. ``z``: the pre-bias output (relu: y itself);
    ``b``: bound only when z excludes the bias."""
    if not has_act and not want_db:
        return g, None
    R, L = g.shape
    dev = g.device
    # one chunk for small R (no second pass); else chunks of >= 64 rows, enough of them to
    # spread over a GPU
    rows = R if R <= 256 else chunk_rows(R, 64)
    chunks = max(1, -(-R // max(rows, 1)))
    dz = Tensor.empty((R, L), dev, float32) if has_act else g
    part = Tensor.empty((chunks, L), dev, float32)
    zt = z if z is not None else g
    bufs = [g._storage.buffer, zt._storage.buffer,
            b._storage.buffer if b is not None else dummy_buffer(dev, 0),
            dz._storage.buffer if has_act else dummy_buffer(dev, 1), part._storage.buffer]
    offs = [g.offset, zt.offset, b.offset if b is not None else 0]
    # CPU adapters: a quad of columns an invocation, one SIMD vector (8 lanes) a group, g and
    # z read through textures (ops/texread.py) where they fit
    v, wg = ((4, 8) if use_cpu_kernel(dev) and all(w % 4 == 0 for w in [L, *offs])
             else (1, 64))
    grad_v = "act_grad(g, z)" if v == 1 else "vec4<f32>({})".format(", ".join(
        f"act_grad(g.{q}, z.{q})" for q in "xyzw"))
    vt = "f32" if v == 1 else "vec4<f32>"
    with dev.lock:  # (the operand textures hold g and z until this dispatch has read them)
        tex = v == 4 and texread.enabled(dev)
        views = tex and [texread.operand(t, s, R * L) for s, t in enumerate((g, zt))]
        tex = bool(views) and None not in views
        if tex:
            bufs[:2], offs[:2] = views, [0, 0]
        k = Kernel.of("linear", "bwd", ACT_GRAD=grad_expr, V=v, WG=wg, VT=vt,
                      ACT_GRAD_V=grad_v, IN_DECLS=texread.decls({"G": 1, "U": 2}, tex, vt))
        dev.dispatch(k, bufs, [R, L, *offs, rows, chunks, int(b is not None), int(has_act)],
                     (-(-L // (v * wg)), chunks, 1))
    if not want_db:
        return dz, None
    if chunks == 1:
        return dz, Tensor(part._storage, (L,), None, part.offset)
    db = Tensor.empty((L,), dev, float32)
    dev.dispatch(Kernel.of("colsum"), [part._storage.buffer, db._storage.buffer],
                 [L, chunks, part.offset, db.offset], (-(-L // 64), 1, 1))
    return dz, db


def causal_self_attention(qkv: Tensor, n_head: int, causal: bool = True,
                          compute_dtype=None) -> Tensor:
    """softmax(q k^T / sqrt(d), causal) v from a packed qkv [B, T, 3E] (PyTorch's layout) to
    [B, T, E]: the fused kernel where the [T, T] scores are large (``prefer_fused``), else two
    matmuls around the fused softmax. ``compute_dtype`` f16 (autocast's default) casts q, k, v."""
    if qkv.ndim != 3 or qkv.shape[-1] % (3 * n_head):
        raise ShapeError(f"causal_self_attention: qkv must be [B, T, 3E] with E divisible by "
                         f"{n_head} heads, got {qkv.shape}")
    B, T, E3 = qkv.shape
    E = E3 // 3
    H, d = n_head, E // n_head
    scale = 1.0 / math.sqrt(d)
    dev = qkv.device
    fused = prefer_fused(dev, B * H, d, T, T)
    cpu = None
    with no_grad():
        src = contiguous(cast(qkv, compute_dtype or autocast_dtype() or float32)) if fused \
            else contiguous(_f32(qkv))  # (unfused: its matmuls cast under autocast)
        # [B, T, 3, H, d] -> [3, B, H, T, d]: q, k, v as head views (fused: one copy)
        heads = permute(reshape(src, (B, T, 3, H, d)), (2, 0, 3, 1, 4))
        if fused:
            heads = contiguous(heads)
            n = B * H * T * d
            q, k, v = (Tensor(heads._storage, (B * H, T, d), None, heads.offset + i * n,
                              heads.dtype) for i in range(3))
            o, lse = attention_forward(q, k, v, scale, causal)  # [B*H, T, d]
            y = contiguous(permute(reshape(o, (B, H, T, d)), (0, 2, 1, 3)))
            y = Tensor(y._storage, (B, T, E), None, y.offset)
        else:  # the output stored with its heads merged (CPU adapters: attention_cpu)
            cpu = compute_dtype is None and autocast_dtype() is None and \
                attention_cpu.fits(dev, T, d) and attention_cpu.forward(src, H, scale, causal)
            if cpu:
                y = cpu[0]
            else:
                q, k, v = (heads[i] for i in range(3))
                y = Tensor.empty((B, T, E), dev, float32)
                p = _attend(q, k, v, _merged(y, H), scale, causal)
    if not needs_grad(qkv):
        return y

    def bw(g):
        if not fused and cpu:
            return (attention_cpu.backward(src, g, *cpu[1:], H, scale, causal),)
        go = permute(reshape(g, (B, T, H, d)), (0, 2, 1, 3))
        if not fused:  # each gradient stored into its part of d(qkv) [B, T, 3, H, d]
            dqkv = Tensor.empty((B, T, 3, H, d), dev, float32)
            _attend_backward(q, k, v, p, go, permute(dqkv, (2, 0, 3, 1, 4)), scale, causal)
            return (Tensor(dqkv._storage, (B, T, E3), None, 0),)
        go = contiguous(go)
        go = Tensor(go._storage, (B * H, T, d), None, go.offset)
        dq, dk, dv = attention_backward(q, k, v, o, lse, go, scale, causal)
        # d(qkv) [B, T, 3, H, d] in one kernel: part s of each element picks dq, dk or dv
        st = (H * T * d, d, 0, T * d, 1)
        views = [Tensor(t._storage, (B, T, 3, H, d), st, t.offset) for t in (dq, dk, dv)]
        dqkv = Tensor.empty((B, T, 3, H, d), dev, float32)
        run_map("select(select(c, b, (i / u32(E)) % 3u == 1u), a, (i / u32(E)) % 3u == 0u)",
                dqkv, views, {"E": E})
        return (Tensor(dqkv._storage, (B, T, E3), None, 0),)
    record("causal_self_attention" if causal else "self_attention", y, [qkv], bw,
           saved=[heads, o, lse] if fused else [src, *cpu[1:]] if cpu else [heads, p])
    return y


def _merged(y: Tensor, H: int) -> Tensor:
    """[B, H, T, d] view of a [B, T, H * d] tensor (its heads merged)."""
    B, T, E = y.shape
    return permute(reshape(y, (B, T, H, E // H)), (0, 2, 1, 3))


def _part(causal: bool, Tq: int, Tk: int):
    """matmul_into's causal parts where the mask is square (else the whole products)."""
    return (lambda name: name) if causal and Tq == Tk else (lambda name: None)


def _attend(q, k, v, y, scale: float, causal: bool) -> Tensor:
    """y (a view) = softmax(q k^T scale, causal) v on [B, H, T, d] f32 views, in place and
    skipping what the mask hides; returns the probabilities (the backward reads them)."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[-2]
    part = _part(causal, Tq, Tk)
    s = matmul_into(q, transpose(k, -1, -2), Tensor.empty((B, H, Tq, Tk), q.device, float32),
                    part("out"))
    p = softmax(s, -1, scale=scale, causal=causal)
    matmul_into(p, v, y, part("a_lower"))
    return p


def _attend_backward(q, k, v, p, go, out, scale: float, causal: bool) -> None:
    """_attend's gradients: d(q), d(k), d(v) stored into the [B, H, T, d] views out[0..2]."""
    B, H, Tq, _ = q.shape
    Tk = k.shape[-2]
    part = _part(causal, Tq, Tk)
    dp = matmul_into(go, transpose(v, -1, -2), Tensor.empty((B, H, Tq, Tk), q.device, float32),
                     part("out"))
    ds = softmax_backward(p, dp, False, scale, Tq if causal else 0)
    for j, (x, w, tri) in enumerate(((ds, k, "a_lower"), (transpose(ds, -1, -2), q, "a_upper"),
                                     (transpose(p, -1, -2), go, "a_upper"))):
        matmul_into(x, w, out[j], part(tri))


def head_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False) -> Tensor:
    """Unfused attention of f32 [B, H, T, d] tensors (any strides) in one autograd node."""
    B, H, Tq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    with no_grad():
        y = Tensor.empty((B, H, Tq, v.shape[-1]), q.device, float32)
        p = _attend(q, k, v, y, scale, causal)
    if not needs_grad(q, k, v):
        return y

    def bw(g):
        grads = [Tensor.empty(t.shape, t.device, float32) for t in (q, k, v)]
        _attend_backward(q, k, v, p, g, grads, scale, causal)
        return tuple(gr if t.requires_grad else None for gr, t in zip(grads, (q, k, v)))
    record("attention", y, [q, k, v], in_forward_precision(bw), saved=[q, k, v, p])
    return y
