"""The generic strided map kernel (shaders/map.wgsl): every elementwise op, copy, cast and fill
goes through ``run_map`` on views broadcast to the output shape, so views cost no copies.
"""
from __future__ import annotations

import functools
import math

import numpy as np

from ..runtime.buffer_view import DTYPES, BufferView, check_same_device
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from . import texture

MAXD = 8
SCALAR_BASE = 48
# CPU adapters (shaders/map_cpu.wgsl): invocations per workgroup, from a sweep on lavapipe
# (BENCHMARKS.md, findings; outputs per invocation: the adapter profile's map_chunk; 1 on GPUs:
# map.wgsl)
CPU_WG = 64
# A strided f32 input reads through a texture where its span (copied) is at most this many
# times its elements: a column of a [4096, 4096] matrix copied the matrix, 10.5 ms against
# 0.6 ms from storage (lavapipe; every 4th column 14 vs 15 ms, every 8th 10 vs 9 ms).
TEX_SPAN_MAX = 4


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


def expand_strides(t: BufferView, shape) -> tuple:
    """Strides of ``t`` viewed at the broadcast ``shape`` (0 along broadcast dims)."""
    if t.shape == shape:
        return t.strides
    pad = len(shape) - len(t.shape)
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
def _kernel(expr: str, types: tuple, modes: tuple, binds: tuple, named: tuple = (),
            nd: int = 0) -> Kernel:
    """The map kernel for one specialisation (cached). types: WGSL type per operand (0: out);
    modes: 'c' contiguous, 's' strided, 'b' broadcast; binds: binding per operand; named:
    (name, kind) scalars from SCALAR_BASE; nd: launch rank. Strided operands share one unrolled
    index decomposition (a runtime-rank loop per operand ran a permuting copy at 1/4 speed)."""
    decls, seen = [], set()
    for k, (ty, b) in enumerate(zip(types, binds)):
        if b in seen:
            continue
        seen.add(b)
        access = "read_write" if k == 0 else "read"
        decls.append(f"@group(0) @binding({b}) var<storage, {access}> B{b}: array<{ty}>;")
    body = [f"    let {name} = p{kind}({SCALAR_BASE + k}u);"
            for k, (name, kind) in enumerate(named)]
    names = ["o", "a", "b", "c"]
    strided = [k for k, m in enumerate(modes) if m == "s"]
    if strided:
        body += [f"    var s{names[k]} = pi({10 + 9 * k + 8}u);" for k in strided]
        body.append("    var rem = i;")
        for dim in reversed(range(nd)):
            body.append(f"    {{ let n = pu({2 + dim}u); let c = i32(rem % n); rem = rem / n;")
            body += [f"      s{names[k]} += c * pi({10 + 9 * k + dim}u);" for k in strided]
            body.append("    }")
    for k, m in enumerate(modes):
        base = 10 + 9 * k
        idx = {"c": f"i + pu({base + 8}u)", "b": f"pu({base + 8}u)"}.get(m, f"u32(s{names[k]})")
        body.append(f"    let i{names[k]} = {idx};")
        if k:
            body.append(f"    let {names[k]} = B{binds[k]}[i{names[k]}];")
    body.append(f"    B{binds[0]}[io] = {types[0]}({expr});")
    defines = {"DECLS": "\n".join(decls), "BODY": "\n".join(body)}
    if "f16" in types:
        defines["F16"] = "1"
    return Kernel.of("map", **defines)


@functools.lru_cache(maxsize=4096)
def _cpu_kernel(expr: str, types: tuple, modes: tuple, binds: tuple, chunk: int,
                wg: int, named: tuple = (), tex: tuple = (), quads=None) -> Kernel:
    """map_cpu.wgsl (as ``_kernel``), ``chunk`` outputs per invocation, strided operands
    stepping a running offset. ``tex``: bindings read through textures (ops/texture.py);
    ``quads`` (all inputs textured and aligned, a quad at a time): per input, whether it
    repeats along the output (``_quad_periods``)."""
    base = _kernel(expr, types, modes, binds)
    setup = [f"    let {name} = p{kind}({SCALAR_BASE + k}u);"
             for k, (name, kind) in enumerate(named)]
    names = ["o", "a", "b", "c"]
    if quads is not None:
        body = [f"        let q{names[k]} = ld_B{b}("
                + (f"q % pu({10 + 9 * k}u));" if quads[k - 1] else "q);")
                for k, b in enumerate(binds) if k]
        body.append("        var r: vec4<f32>;")
        for e, comp in enumerate("xyzw"):
            lets = "".join(f" let {names[k]} = q{names[k]}.{comp};" for k in range(1, len(binds)))
            body.append(f"        {{ let i = 4u * q + {e}u;{lets} r.{comp} = f32({expr}); }}")
        body.append(f"        B{binds[0]}Q[qo + q] = r;")
        decls = "\n".join([f"@group(0) @binding({binds[0]}) var<storage, read_write> "
                           f"B{binds[0]}Q: array<vec4<f32>>;",
                           texture.decls({f"B{b}": b for b in tex}, True)])
        return Kernel.of("map_cpu", "quads", DECLS=decls, QSETUP="\n".join(setup), SETUP="",
                         WRAP="", BODY="", STEP="", QBODY="\n".join(body), CHUNK=chunk, WG=wg)
    wrap, body, step = [], [], []
    for k, m in enumerate(modes):
        x, w = names[k], 10 + 9 * k
        if m == "s":
            full = f"i32(strided_offset({{i}}, nd, 2u, {w}u, pi({w + 8}u)))"
            setup += [f"    var s{x} = {full.format(i='i0')};",
                      f"    let st_{x} = pi({w}u + nd - 1u);"]
            wrap.append(f"            s{x} = {full.format(i='i')};")
            step.append(f"        s{x} += st_{x};")
            idx = f"u32(s{x})"
        else:
            idx = f"i + pu({w + 8}u)" if m == "c" else f"pu({w + 8}u)"
        body.append(f"        let i{x} = {idx};")
        if k:
            load = f"ex_B{binds[k]}(i{x})" if binds[k] in tex else f"B{binds[k]}[i{x}]"
            body.append(f"        let {x} = {load};")
    body.append(f"        B{binds[0]}[io] = {types[0]}({expr});")
    d = dict(base.defines)
    decls = d["DECLS"]
    if tex:  # those bindings' storage declarations give way to textures
        decls = "\n".join([line for line in decls.split("\n") if not any(
            f"> B{b}:" in line for b in tex)] + [texture.decls(
                {f"B{b}": b for b in tex}, True, elements=True)])
    defines = {"DECLS": decls, "SETUP": "\n".join(setup), "WRAP": "\n".join(wrap),
               "BODY": "\n".join(body), "STEP": "\n".join(step), "CHUNK": chunk, "WG": wg,
               "QSETUP": "", "QBODY": ""}
    if "F16" in d:
        defines["F16"] = "1"
    return Kernel.of("map_cpu", **defines)


def _texture_inputs(dev, inputs, modes, types, binds, buffers, params, n) -> tuple:
    """CPU adapters: swap f32 inputs bound alone, contiguous or strided (no negative stride: the
    span they cover), for texture views (in ``buffers`` and ``params``); returns the bindings so
    read."""
    if not texture.enabled(dev):
        return ()
    tex = []
    for k, t in enumerate(inputs, 1):
        b = binds[k]
        if modes[k] == "b" or types[k] != "f32" or binds.count(b) > 1 or min(t.strides) < 0:
            continue
        span = n if modes[k] == "c" else 1 + sum((d - 1) * s for d, s in zip(t.shape, t.strides))
        if span > TEX_SPAN_MAX * math.prod(d for d, s in zip(t.shape, t.strides) if s):
            continue
        got = texture.elements(t, k - 1, span)
        if got is not None:
            buffers[b - 1], params[18 + 9 * k] = got
            tex.append(b)
    return tuple(tex)


def _quad_periods(head: list, nin: int):
    """Per input of a launch layout, its period in quads where it repeats along the leading
    dims (a broadcast over the batch; else 0: it covers the output in order), which the quad
    entry reads from word 10 + 9k (the input's first stride, 0, unused there); None where the
    output or an input is neither."""
    nd = head[1]
    shape = head[2:2 + nd]
    flat = [math.prod(shape[d + 1:]) for d in range(nd)]
    if head[10:10 + nd] != flat:
        return None
    out = []
    for k in range(1, nin + 1):
        st = head[10 + 9 * k:10 + 9 * k + nd]
        lead = next((d for d, s in enumerate(st) if s), nd)
        if lead == nd or st[lead:] != flat[lead:]:
            return None
        period = flat[lead - 1] if lead else 0  # elements of one repeat
        if period % 4:
            return None
        out.append(period // 4)
    return tuple(out)


def cpu_chunk(dev) -> int:
    """Outputs per invocation of the map on ``dev`` (1: map.wgsl)."""
    chunk = TUNING.map_chunk
    return profile(dev).map_chunk if chunk is None else chunk


_LAYOUTS: dict = {}  # (out shape, strides of every operand) -> (modes, head, quad periods)


def _layout(shape, strides_list) -> tuple:
    """Coalesced launch layout, cached (the same layouts recur every step, and working one
    out costs more than the rest of a launch)."""
    key = (shape, *strides_list)
    hit = _LAYOUTS.get(key)
    if hit is not None:
        return hit
    cshape, cstrides = coalesce(shape, strides_list)
    nd = len(cshape)
    if nd > MAXD:
        raise ShapeError(f"views with more than {MAXD} non-mergeable dimensions are not supported "
                         f"(shape {shape}); call .contiguous() on the inputs first")
    head = [0] * SCALAR_BASE
    head[1] = nd
    head[2:2 + nd] = cshape
    modes = []
    for k, st in enumerate(cstrides):
        modes.append("b" if not any(st) else "c" if nd == 1 and st[0] == 1 else "s")
        head[10 + 9 * k:10 + 9 * k + nd] = st
    if len(_LAYOUTS) > 8192:
        _LAYOUTS.clear()
    hit = _LAYOUTS[key] = (tuple(modes), head, _quad_periods(head, len(strides_list) - 1))
    return hit


def scalar_kind(value) -> str:
    """'f' (f32), 'u' (u32: numpy unsigned ints, e.g. seeds) or 'i' (i32) for a map scalar."""
    if isinstance(value, (float, np.floating)):
        return "f"
    return "u" if isinstance(value, np.unsignedinteger) else "i"


def run_map(expr: str, out: BufferView, inputs=(), scalars=()) -> BufferView:
    """out[...] = expr(a, b, c) with inputs broadcast to out.shape (``i``: the linear index).
    ``scalars``: {name: value} read by name (float f32, int i32, np.uint32 u32), or raw words
    from SCALAR_BASE. Bumps out's storage version; returns ``out``."""
    n = math.prod(out.shape)
    if n == 0:
        return out
    dev = out.device
    for t in inputs:
        if t.device is not dev:
            check_same_device(out, *inputs, op="elementwise op")
    shape = out.shape
    modes, head, periods = _layout(shape,
                                   (out.strides, *[expand_strides(t, shape) for t in inputs]))
    params = head.copy()
    params[0] = n
    params[18] = out.offset
    buf = out.buffer
    buffers, binds, types = [buf], [1], [DTYPES[out.dtype]]
    for k, t in enumerate(inputs):
        params[27 + 9 * k] = t.offset
        b = t.buffer
        for j, have in enumerate(buffers):  # an operand sharing a buffer shares its binding
            if have is b:
                binds.append(j + 1)
                break
        else:
            buffers.append(b)
            binds.append(len(buffers))
        types.append(DTYPES[t.dtype])
    names = ()
    if isinstance(scalars, dict):
        names = tuple((name, scalar_kind(v)) for name, v in scalars.items())
        scalars = scalars.values()
    params.extend(scalars)
    chunk = cpu_chunk(dev)
    if chunk > 1:
        with dev.lock:  # (the operand textures hold the inputs until this dispatch read them)
            tex = _texture_inputs(dev, inputs, modes, types, binds, buffers, params, n)
            quads = None
            if (periods is not None and len(tex) == len(inputs) and types[0] == "f32"
                    and not (n % 4 or chunk % 4 or out.offset % 4)
                    and not any(params[27 + 9 * k] for k in range(len(inputs)))):
                quads = tuple(map(bool, periods))
                for k, q in enumerate(periods, 1):
                    if q:
                        params[10 + 9 * k] = q
            k = _cpu_kernel(expr, tuple(types), modes, tuple(binds), chunk, CPU_WG, names, tex,
                            quads)
            dev.dispatch_1d(k, buffers, params, -(-n // chunk), CPU_WG)
    else:
        dev.dispatch_1d(_kernel(expr, tuple(types), modes, tuple(binds), names, head[1]),
                        buffers, params, n)
    out.storage.version += 1
    return out
