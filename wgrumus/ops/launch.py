"""Launching the generic strided map kernel (shaders/map.wgsl).

Every elementwise op, copy, cast, fill and the scatter of a gradient into a view goes through
``run_map``: operands are views (shape/strides/offset) broadcast to the output shape, so
broadcasting, transposes and slices cost no copies.
"""
from __future__ import annotations

import functools

from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..tensor import DTYPES, Tensor, check_same_device

MAXD = 8
SCALAR_BASE = 48


def broadcast_shapes(*shapes) -> tuple:
    if len(shapes) == 2 and shapes[0] == shapes[1]:  # the common case, on every op
        return tuple(shapes[0])
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for k in range(nd):
        d = 1
        for s in shapes:
            i = k - (nd - len(s))
            if i < 0:
                continue
            if s[i] != 1:
                if d != 1 and d != s[i]:
                    raise ShapeError("shapes " + " and ".join(str(tuple(x)) for x in shapes)
                                     + " cannot be broadcast together (dimension "
                                     f"{k - nd} is {d} vs {s[i]})")
                d = s[i]
        out.append(d)
    return tuple(out)


def expand_strides(t: Tensor, shape) -> tuple:
    """Strides of ``t`` viewed at the broadcast ``shape`` (0 along broadcast dims)."""
    if t.shape == shape:
        return t.strides
    pad = len(shape) - t.ndim
    if pad < 0:
        raise ShapeError(f"cannot broadcast shape {t.shape} to {tuple(shape)}")
    st = []
    for k, s in enumerate(shape):
        i = k - pad
        if i < 0:
            st.append(0)
        elif t.shape[i] == s:
            st.append(t.strides[i] if s != 1 else 0)
        elif t.shape[i] == 1:
            st.append(0)
        else:
            raise ShapeError(f"cannot broadcast shape {t.shape} to {tuple(shape)}")
    return tuple(st)


def coalesce(shape, strides_list):
    """Drop size-1 dims and merge adjacent dims that are contiguous in every operand."""
    dims = [(s, [st[k] for st in strides_list]) for k, s in enumerate(shape) if s != 1]
    out = []
    for s, sts in dims:
        if out:
            ps, psts = out[-1]
            if all(p == c * s for p, c in zip(psts, sts)):
                out[-1] = (ps * s, sts)
                continue
        out.append((s, sts))
    if not out:
        return (1,), [(0,) for _ in strides_list]
    shp = tuple(s for s, _ in out)
    return shp, [tuple(sts[i] for _, sts in out) for i in range(len(strides_list))]


@functools.lru_cache(maxsize=4096)
def _kernel(expr: str, types: tuple, modes: tuple, binds: tuple) -> Kernel:
    """The map kernel for one specialisation (cached: building it costs more than a launch).
    types: WGSL storage type per operand (0 = output); modes: 'c' contiguous, 's' strided,
    'b' broadcast scalar; binds: binding slot per operand (operands sharing a buffer share one)."""
    decls, seen = [], set()
    for k, (ty, b) in enumerate(zip(types, binds)):
        if b in seen:
            continue
        seen.add(b)
        access = "read_write" if k == 0 else "read"
        decls.append(f"@group(0) @binding({b}) var<storage, {access}> B{b}: array<{ty}>;")
    body = []
    names = ["o", "a", "b", "c"]
    for k, m in enumerate(modes):
        base = 10 + 9 * k
        if m == "c":
            idx = f"i + pu({base + 8}u)"
        elif m == "b":
            idx = f"pu({base + 8}u)"
        else:
            idx = f"strided_offset(i, pu(1u), 2u, {base}u, pi({base + 8}u))"
        body.append(f"    let i{names[k]} = {idx};")
        if k:
            body.append(f"    let {names[k]} = B{binds[k]}[i{names[k]}];")
    body.append(f"    B{binds[0]}[io] = {types[0]}({expr});")
    defines = {"DECLS": "\n".join(decls), "BODY": "\n".join(body)}
    if "f16" in types:
        defines["F16"] = "1"
    return Kernel.of("map", **defines)


def run_map(expr: str, out: Tensor, inputs=(), scalars=()) -> Tensor:
    """out[...] = expr(a, b, c) elementwise; inputs broadcast to out.shape. Scalars are read in
    ``expr`` as pf(48u), pf(49u), ... (or pi/pu). Bumps out's storage version (a write)."""
    n = out.numel
    if n == 0:
        return out
    dev = out.device
    for t in inputs:
        if t._storage.device is not dev:
            check_same_device(out, *inputs, op="elementwise op")
    ops = (out, *inputs)
    strides = [out.strides] + [expand_strides(t, out.shape) for t in inputs]
    shape, strides = coalesce(out.shape, strides)
    nd = len(shape)
    if nd > MAXD:
        raise ShapeError(f"views with more than {MAXD} non-mergeable dimensions are not supported "
                         f"(shape {out.shape}); call .contiguous() on the inputs first")
    modes, binds, buffers, slots = [], [], [], {}
    params = [0] * SCALAR_BASE
    params[0], params[1] = n, nd
    params[2:2 + nd] = shape
    for k, (t, st) in enumerate(zip(ops, strides)):
        if not any(st):
            modes.append("b")
        elif nd == 1 and st[0] == 1:
            modes.append("c")
        else:
            modes.append("s")
        buf = t._storage.buffer
        slot = slots.get(id(buf))
        if slot is None:
            buffers.append(buf)
            slot = slots[id(buf)] = len(buffers)
        binds.append(slot)
        base = 10 + 9 * k
        params[base:base + nd] = st
        params[base + 8] = t.offset
    params.extend(scalars)
    kernel = _kernel(expr, tuple(DTYPES[t.dtype] for t in ops), tuple(modes), tuple(binds))
    dev.dispatch_1d(kernel, buffers, params, n)
    out._storage.version += 1
    return out
