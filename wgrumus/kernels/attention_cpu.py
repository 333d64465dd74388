"""Attention of short sequences on CPU adapters: shaders/attention_cpu.wgsl, one dispatch
forward and two backward where the unfused composition (ops/attention.py ``_attend``) takes three
and five, on the packed projection qkv [B, T, 3, H, d] in place.

A quick GPT step spent ~1.8 ms of its ~10 ms in those eight dispatches per layer on lavapipe:
llvmpipe's fixed ~20 us a dispatch, a texture copy per operand, and [T, d] products too small
for the matmul's register blocks. Here a workgroup is one subgroup on W rows of one (batch,
head), and the rows every lane reads are fetched one texel a lane and shared by
subgroupBroadcast. The forward stores the probabilities P and their transpose PT (T <= TMAX
floats a row: cheap at these lengths), which the backward reads: bwd_q gives d(q) and the
transposed score gradients DST, bwd_kv d(k) and d(v).
"""
from __future__ import annotations

import functools
import math

from ..runtime.buffer_view import BufferView, View, float32
from ..runtime.device import TEX_W, groups_1d
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from . import texture
from .matmul_cpu import cpu_subgroup

TMAX = 64  # longest sequence
HEAD_DIMS = (4, 8, 16, 32, 64)  # head sizes (rows of whole texels, shared in whole rounds)
# T * d at most: the unrolled code's size (llvmpipe compiles T = 32, d = 16 in ~1 s, 64 x 16
# and 16 x 64 in 5-7 s)
MAX_WORK = 1024

# entry: {binding: (name, texture?)}; storage outputs are vec4 arrays but PT / DST (f32)
_BINDINGS = {
    "fwd": {1: ("QKV", True), 2: ("Y", False), 3: ("P", False), 4: ("PT", False)},
    "bwd_q": {1: ("QKV", True), 2: ("GO", True), 3: ("P", True), 4: ("DQKV", False),
              5: ("DST", False)},
    "bwd_kv": {1: ("QKV", True), 2: ("GO", True), 3: ("PT", True), 4: ("DST", True),
               5: ("DQKV", False)},
}


def fits(dev, T: int, d: int) -> bool:
    """Whether these kernels take heads of size ``d`` over ``T`` tokens on ``dev``."""
    on = profile(dev).cpu if TUNING.cpu_attention is None else TUNING.cpu_attention
    return bool(on and cpu_subgroup(dev) and texture.enabled(dev) and 1 <= T <= TMAX
                and d in HEAD_DIMS and T * d <= MAX_WORK)


def _round(var: str, tex: str, base: str, stride: str, first: int, W: int, R: int) -> tuple:
    """(fetch lines, [[texel c of row first + g as every lane's value] for g]): rows first..
    of an operand in texture ``tex`` (row t at texel base + t * stride, R texels), fetched
    one texel a lane (rows past T - 1 read row T - 1) and broadcast."""
    fetch = [f"let {var}{f} = ld_{tex}({base} + min({first}u + ({f * W}u + lane) / {R}u, T - 1u)"
             f" * {stride} + ({f * W}u + lane) % {R}u);" for f in range(max(1, R // W))]
    rows = [[f"subgroupBroadcast({var}{(g * R + c) // W}, {(g * R + c) % W}u)" for c in range(R)]
            for g in range(max(1, W // R))]
    return fetch, rows


def _rounds(T: int, W: int, R: int, reads, body) -> list:
    """The rounds over T rows, G = W / R (at least 1) a round: ``reads`` [(var, texture,
    base, stride)] fetched, then body(t, [rows' texels]) per row. (No round is skipped where a
    causal mask hides it: llvmpipe runs a branch whatever its lanes' conditions, and its
    masks cost more than the masked rows.)"""
    G = max(1, W // R)
    out = []
    for t0 in range(0, T, G):
        got = [_round(f"{v}{t0}_", *rd, t0, W, R) for v, *rd in reads]
        out += [x for f, _ in got for x in f]
        for g in range(min(G, T - t0)):
            out += body(t0 + g, [rows[g] for _, rows in got])
    return out


_C = "xyzw"


@functools.lru_cache(maxsize=32)
def kernel(entry: str, W: int, T: int, d: int) -> Kernel:
    R, TP = d // 4, -(-T // 4) * 4
    cs = range(R)
    dot = lambda a, tx: " + ".join(f"dot({a}{c}, {t})" for c, t in zip(cs, tx))
    axpy = lambda acc, e, tx: [f"{acc}{c} = fma(vec4<f32>({e}), {t}, {acc}{c});"
                               for c, t in zip(cs, tx)]
    own = lambda name, tex: [f"let {name}{c} = ld_{tex}(x.pq + {c}u);" for c in range(TP // 4)]
    el = lambda name, j: f"{name}{j // 4}.{_C[j % 4]}"  # element j of a row held as texels
    zero = lambda names: [f"var {n}{c} = vec4<f32>(0.0);" for n in names for c in cs]
    ind = lambda lines, n=4: "\n".join(" " * n + x for x in lines)
    kv = [("ks", "QKV", "x.k", "x.s3")]
    vv = [("vs", "QKV", "x.v", "x.s3")]
    d = {}
    # forward: scores, probabilities (stored as P's row and PT's column), the output row
    d["FWD_S"] = ind([f"let q{c} = ld_QKV(x.qkv + x.rc * x.s3 + {c}u);" for c in cs] + _rounds(
        T, W, R, kv, lambda j, tx: [
            f"var sc{j} = ({dot('q', tx[0])}) * x.scale;",
            f"m = max(m, select(LOWEST_F32, sc{j}, {j}u <= i || !x.causal));"]))
    d["FWD_P"] = ind([f"sc{j} = select(0.0, exp(sc{j} - m), {j}u <= i || !x.causal);"
                      f" sum += sc{j};" for j in range(T)])
    p = lambda j: f"sc{j}" if j < T else "0.0"
    d["FWD_STORE_P"] = ind(
        [f"sc{j} *= inv;" for j in range(T)]
        + ["if (i < T) {"]
        + [f"    P[x.pq + {c}u] = vec4<f32>({', '.join(p(4 * c + e) for e in range(4))});"
           for c in range(TP // 4)]
        + [f"    PT[(x.bh * T + {j}u) * TP + i] = sc{j};" for j in range(T)] + ["}"])
    d["FWD_O"] = ind(zero(["o"]) + _rounds(T, W, R, vv,
                                           lambda j, tx: axpy("o", f"sc{j}", tx[0])))
    d["Y_STORE"] = ind([f"Y[yq + {c}u] = o{c};" for c in cs], 8)
    # bwd_q: d(p) = d(out) . v, the score gradients ds (stored as DST's column), d(q) = ds k
    d["BQ_DP"] = ind([f"let go{c} = ld_GO(x.y + x.rc * x.e4 + {c}u);" for c in cs]
                     + own("p", "P") + _rounds(
        T, W, R, vv, lambda j, tx: [f"let dp{j} = {dot('go', tx[0])};"]))
    d["BQ_DS"] = ind(["var D = 0.0;"] + [f"D += {el('p', j)} * dp{j};" for j in range(T)] + [
        f"let ds{j} = {el('p', j)} * (dp{j} - D) * x.scale;" for j in range(T)])
    d["DST_STORE"] = ind([f"DST[(x.bh * T + {j}u) * TP + i] = ds{j};" for j in range(T)], 8)
    d["BQ_DQ"] = ind(zero(["dq"]) + _rounds(T, W, R, kv,
                                            lambda j, tx: axpy("dq", f"ds{j}", tx[0])))
    d["DQ_STORE"] = ind([f"DQKV[oq + {c}u] = dq{c};" for c in cs], 8)
    # bwd_kv: d(k) = ds^T q and d(v) = p^T d(out) for this lane's key, over the queries
    d["BKV"] = ind(own("pt", "PT") + own("dt", "DST") + zero(["dk", "dv"]) + _rounds(
        T, W, R, [("qs", "QKV", "x.qkv", "x.s3"), ("go", "GO", "x.y", "x.e4")],
        lambda i, tx: axpy("dk", el("dt", i), tx[0]) + axpy("dv", el("pt", i), tx[1])))
    d["KV_STORE"] = ind([f"DQKV[oq + x.e4 + {c}u] = dk{c};" for c in cs]
                        + [f"DQKV[oq + 2u * x.e4 + {c}u] = dv{c};" for c in cs], 8)
    decls = []
    for b, (name, tex) in _BINDINGS[entry].items():
        if tex:
            decls.append(texture.decls({name: b}, True))
        else:
            t = "f32" if name in ("PT", "DST") else "vec4<f32>"
            decls.append(f"@group(0) @binding({b}) var<storage, read_write> {name}: array<{t}>;")
    for e in _BINDINGS:
        d[f"ON_{e.upper()}"], d[f"OFF_{e.upper()}"] = ("", "") if e == entry else ("/*", "*/")
    return Kernel.of("attention_cpu", entry, W=W, T=T, TP=TP, DECLS="\n".join(decls), **d)


def _words(B, H, E, scale, causal):
    return [B * H, 0, H, E, float(scale), int(causal)]


def forward(qkv: BufferView, H: int, scale: float, causal: bool, y: BufferView):
    """(y, P, PT): ``y`` [B, T, E] (contiguous f32 from its offset 0) of contiguous f32 qkv
    [B, T, 3E] (E = H * d, ``fits``) starting at a quad (texture rows and quad stores need
    it), with the probabilities P and PT that ``backward`` reads (scratch views); None
    (nothing run) where an operand does not fit the device's textures (the caller then takes
    the unfused path). No autograd."""
    B, T, E3 = qkv.shape
    E = E3 // 3
    dev = qkv.device
    W = cpu_subgroup(dev)
    Tp = -(-T // 4) * 4
    if not _fits(dev, B * H * T * Tp):
        return None
    P = View.empty((B * H, T, Tp), dev, float32)
    PT = View.empty((B * H, T, Tp), dev, float32)
    with dev.lock:  # (the operand texture holds qkv until the dispatch has read it)
        view = texture.operand(qkv, 0, math.prod(qkv.shape))
        if view is None:
            return None
        dev.dispatch(kernel("fwd", W, T, E // H), [view, y.buffer, P.buffer,
                                                 PT.buffer],
                     _words(B, H, E, scale, causal), groups_1d(B * H * -(-T // W), 1))
    return y, P, PT


def backward(qkv: BufferView, g: BufferView, P: View, PT: View, H: int, scale: float,
             causal: bool, dqkv: BufferView) -> BufferView:
    """``dqkv`` (returned; contiguous f32 from its offset 0): d(qkv) [B, T, 3E] of
    ``forward``'s output given its gradient ``g`` [B, T, E] (f32; qkv and g contiguous and
    starting at a quad)."""
    B, T, E3 = qkv.shape
    E = E3 // 3
    dev = qkv.device
    W = cpu_subgroup(dev)
    Tp = P.shape[-1]
    dst = View.empty((B * H, T, Tp), dev, float32)
    words = _words(B, H, E, scale, causal)
    groups = groups_1d(B * H * -(-T // W), 1)
    with dev.lock:
        views = [texture.operand(t, s, math.prod(t.shape)) for s, t in enumerate((qkv, g, P))]
        dev.dispatch(kernel("bwd_q", W, T, E // H), views + [dqkv.buffer,
                                                          dst.buffer], words, groups)
        views = [texture.operand(t, s, math.prod(t.shape))
                 for s, t in enumerate((qkv, g, PT, dst))]
        dev.dispatch(kernel("bwd_kv", W, T, E // H), views + [dqkv.buffer], words,
                     groups)
    return dqkv


def _fits(dev, n: int) -> bool:
    """Whether n floats (P, PT, DST) fit one binding and one operand texture. (The caller's
    [T, T] scores fit a binding, but P's rows are T rounded up to quads.)"""
    return 4 * n <= dev.max_binding and \
        -(-n // (4 * TEX_W)) <= dev.limits["max-texture-dimension-2d"]
