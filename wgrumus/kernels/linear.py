"""The linear layer's backward epilogue (shaders/linear.wgsl ``bwd``, colsum.wgsl): d(z) of
act(z + bias) and the bias gradient's column sums in one pass, the partial sums added by a
second; on CPU adapters a column quad an invocation, inputs through textures."""
from __future__ import annotations

import weakref

from ..runtime.buffer_view import BufferView, View, float32
from ..runtime.kernels import Kernel
from . import texture
from .bounds import chunk_rows
from .map import run_map
from .matmul_cpu import use_cpu_kernel

_dummies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def dummy_buffer(dev, k: int = 0):
    """The k-th (0 or 1) one-element zero buffer of ``dev``, bound where a kernel slot is unused
    (one per slot: a read_write buffer may not be bound twice in a dispatch)."""
    ts = _dummies.get(dev)
    if ts is None:
        ts = _dummies[dev] = [run_map("v", View.empty((1,), dev, float32), [],
                                      scalars={"v": 0.0}) for _ in range(2)]
    return ts[k].buffer


def epilogue_grad(g: BufferView, z: BufferView | None, b: BufferView | None, grad_expr: str,
                  dz: BufferView | None, db: BufferView | None) -> tuple:
    """(dz, db) of y = act(z + b) for contiguous [R, L] g: dz and per-chunk column sums in one
    kernel, the partials summed by a second. ``z``: the pre-bias output (relu: y itself);
    ``b``: bound only when z excludes the bias. Outputs (contiguous f32 from offset 0): ``dz``
    [R, L] (None: no activation, dz is g) and ``db`` [L] (None: not wanted)."""
    has_act, want_db = dz is not None, db is not None
    if not has_act and not want_db:
        return g, None
    R, L = g.shape
    dev = g.device
    # one chunk for small R (no second pass); else chunks of >= 64 rows, enough of them to
    # spread over a GPU
    rows = R if R <= 256 else chunk_rows(R, 64)
    chunks = max(1, -(-R // max(rows, 1)))
    dz = dz if has_act else g
    part = db if chunks == 1 and want_db else View.empty((chunks, L), dev, float32)
    zt = z if z is not None else g
    bufs = [g.buffer, zt.buffer,
            b.buffer if b is not None else dummy_buffer(dev, 0),
            dz.buffer if has_act else dummy_buffer(dev, 1), part.buffer]
    offs = [g.offset, zt.offset, b.offset if b is not None else 0]
    # CPU adapters: a quad of columns an invocation, one SIMD vector (8 lanes) a group, g and
    # z read through textures (kernels/texture.py) where they fit
    v, wg = ((4, 8) if use_cpu_kernel(dev) and all(w % 4 == 0 for w in [L, *offs])
             else (1, 64))
    grad_v = "act_grad(g, z)" if v == 1 else "vec4<f32>({})".format(", ".join(
        f"act_grad(g.{q}, z.{q})" for q in "xyzw"))
    vt = "f32" if v == 1 else "vec4<f32>"
    with dev.lock:  # (the operand textures hold g and z until this dispatch has read them)
        tex = v == 4 and texture.enabled(dev)
        views = tex and [texture.operand(t, s, R * L) for s, t in enumerate((g, zt))]
        tex = bool(views) and None not in views
        if tex:
            bufs[:2], offs[:2] = views, [0, 0]
        k = Kernel.of("linear", "bwd", ACT_GRAD=grad_expr, V=v, WG=wg, VT=vt,
                      ACT_GRAD_V=grad_v, IN_DECLS=texture.decls({"G": 1, "U": 2}, tex, vt))
        dev.dispatch(k, bufs, [R, L, *offs, rows, chunks, int(b is not None), int(has_act)],
                     (-(-L // (v * wg)), chunks, 1))
    if not want_db or chunks == 1:
        return dz, db
    dev.dispatch(Kernel.of("colsum"), [part.buffer, db.buffer],
                 [L, chunks, part.offset, db.offset], (-(-L // 64), 1, 1))
    return dz, db
