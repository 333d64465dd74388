"""GPU variants of the row ops (shaders/rowops.wgsl: vec4 loads, subgroup reductions, rows in
registers), picked by ROW_TABLE per adapter class, op and row length (else kernels/rows.py's own).
"""
from __future__ import annotations

from ..runtime.device import groups_1d
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from .bounds import LOOP_BUDGET

# name -> vec: vec4 loads (where L and the offsets allow); sg: subgroup reductions (where the
# adapter has them); reg: the row held in registers (up to MAX_NR quads per invocation); rpw:
# most rows per workgroup (short rows); qpi: quads per invocation the row is spread for.
ROW_VARIANTS = {
    "s1": dict(vec=False, sg=False, reg=False, rpw=1, qpi=4),
    "v4": dict(vec=True, sg=False, reg=False, rpw=1, qpi=4),
    "v4r": dict(vec=True, sg=False, reg=True, rpw=1, qpi=4),
    "v4sg": dict(vec=True, sg=True, reg=False, rpw=1, qpi=4),
    "v4sgr": dict(vec=True, sg=True, reg=True, rpw=1, qpi=4),
    "v4sgr_q1": dict(vec=True, sg=True, reg=True, rpw=1, qpi=1),
    "v4sgr_q2": dict(vec=True, sg=True, reg=True, rpw=1, qpi=2),
    "v4sgr8": dict(vec=True, sg=True, reg=True, rpw=8, qpi=4),
    "v4sgr4_q2": dict(vec=True, sg=True, reg=True, rpw=4, qpi=2),
    "v4r8": dict(vec=True, sg=False, reg=True, rpw=8, qpi=4),
}
# {(adapter class, op): ((largest row length L, variant), ...)}: the first L that fits wins;
# none (or "default"): the caller's kernel. From the H100 sweep's "best" lines
# (benchmarks/results/h100_kernel_sweep_20261123.txt; rows past 4096 keep the defaults).
ROW_TABLE: dict = {
    ("nvidia", "sm_fwd"): ((256, "v4sgr4_q2"), (768, "v4"), (1024, "v4sgr_q2"), (4096, "v4r")),
    ("nvidia", "sm_bwd"): ((256, "v4sgr_q1"), (1024, "v4sgr_q1"), (4096, "v4sgr_q2")),
    ("nvidia", "ln_fwd"): ((256, "v4sgr4_q2"), (768, "v4sg"), (1024, "v4sgr_q2"),
                           (4096, "v4sgr8")),
    ("nvidia", "ln_bwd"): ((256, "v4sgr_q1"), (768, "v4sgr_q2"), (1024, "v4sgr_q1"),
                           (4096, "v4r8")),
    ("nvidia", "xe_stats"): ((256, "v4sgr4_q2"), (768, "v4sgr8"), (4096, "v4r")),
}
MAX_NR = 8  # quads held in registers per invocation, at most
_PASSES = {"sm_fwd": 2, "sm_bwd": 2, "ln_fwd": 3, "ln_bwd": 2, "xe_stats": 1}


def _subgroup_max(dev) -> int | None:
    if "subgroup" not in dev.features:
        return None
    return TUNING.subgroup_max or profile(dev).subgroup_max


def _variant(dev, op: str, L: int):
    if TUNING.row_variant is not None:
        return ROW_VARIANTS[TUNING.row_variant]
    cls = profile(dev).adapter_class
    if not ROW_TABLE or cls == "cpu":
        return None
    for most, name in ROW_TABLE.get((cls, op), ()):
        if L <= most:
            return ROW_VARIANTS.get(name)  # "default": the caller's own kernel
    return None


def plan(dev, op: str, L: int, R: int, offsets=(), log: bool = False):
    """(kernel, workgroups) of entry ``op`` over R rows of L, or None (the caller's own
    kernel). ``offsets``: every operand's (vec4 loads need multiples of 4)."""
    aligned = L % 4 == 0 and all(o % 4 == 0 for o in offsets)
    global _plans_for
    tuned = (ROW_TABLE, TUNING.row_variant, TUNING.subgroup_max)
    if _plans_for != tuned:  # a table changed (tests, the sweep)
        _plans.clear()
        _plans_for = (dict(ROW_TABLE), *tuned[1:])
    key = (dev, op, L, R, aligned, log)
    if key not in _plans:
        if len(_plans) > 4096:
            _plans.clear()
        _plans[key] = _plan(dev, op, L, R, aligned, log)
    return _plans[key]


_plans: dict = {}  # a plan costs ~14 us of Python; an eager step asks for the same few again
_plans_for = None


def _plan(dev, op: str, L: int, R: int, aligned: bool, log: bool):
    v = _variant(dev, op, L)
    if v is None or not L or not R:
        return None
    V = 4 if v["vec"] and aligned else 1
    lq = L // V
    g = 32
    while g < 256 and g * v["qpi"] < lq:  # G: invocations per row
        g *= 2
    if _PASSES[op] * -(-lq // g) > LOOP_BUDGET - 64:
        return None
    smax = _subgroup_max(dev) if v["sg"] else None
    sg = smax is not None and smax <= g
    nr = -(-lq // g) if v["reg"] and -(-lq // g) <= MAX_NR else 0
    rpw = max(1, min(v["rpw"], 256 // g, R))
    vt = "vec4<f32>" if V == 4 else "f32"
    k = Kernel.of("rowops", op, WG=g * rpw, G=g, VEC=V, VT=vt, NR=nr, NRA=max(nr, 1),
                  LOG=str(bool(log)).lower(), SUBGROUP=_SUBGROUP if sg else _TREE,
                  HSUM="dot(v, vec4<f32>(1.0))" if V == 4 else "v",
                  HMAX="max(max(v.x, v.y), max(v.z, v.w))" if V == 4 else "v",
                  MASK=("vec4<u32>(q * 4u) + vec4<u32>(0u, 1u, 2u, 3u) >= vec4<u32>(K)"
                        if V == 4 else "q >= K"))
    return k, groups_1d(-(-R // rpw), 1)


_TREE = """struct Sub { @builtin(local_invocation_id) unused: vec3<u32> }
fn row_reduce(v: vec2<f32>, lid: u32, sub: Sub, lse: bool) -> vec2<f32> {
    return tree_reduce(v, lid, lse);
}"""

# Subgroup reduction, then one value per subgroup through workgroup memory (G is a multiple of
# the subgroup size; subgroups are consecutive invocations, as on every adapter seen).
_SUBGROUP = """struct Sub {
    @builtin(subgroup_size) size: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_id) id: u32,
}
fn row_reduce(v: vec2<f32>, lid: u32, sub: Sub, lse: bool) -> vec2<f32> {
    let m = subgroupMax(v.x);
    let s = subgroupAdd(select(v.y, v.y * exp(v.x - m), lse));
    let t = vec2<f32>(select(subgroupAdd(v.x), m, lse), s);
    if (sub.lane == 0u) { red[sub.id] = t; }
    workgroupBarrier();
    let n = G / sub.size;
    let first = (lid / G) * n;
    var r = red[first];
    for (var i = 1u; i < n; i++) { r = merge(r, red[first + i], lse); }
    workgroupBarrier();
    return r;
}"""
