"""Fused attention kernels: FlashAttention-2 tiles (shaders/flash_attention2.wgsl: tile variants,
the generated register code of each entry point, the choice of tiles per adapter) and the row
kernel (shaders/flash_attention.wgsl) where no tile fits, with their launch.

A role's tiles are (R, S, TM, TN): R resident rows per workgroup, S streamed rows per tile,
TM x TN scores per invocation. The register code is unrolled with literal indices so compilers
keep it in registers.
"""
from __future__ import annotations

import functools

from ..runtime.buffer_view import float16
from ..runtime.device import groups_1d
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING

# name -> tiles per role: (resident rows, streamed rows per tile, TM, TN[, flag]); the flag is
# SG for "fwd" (row reductions by subgroup shuffles where subgroups hold a row: 3 barriers a tile
# instead of 4) and PF for "q"/"kv" (the next tile prefetched into registers). A role whose tiles
# do not fit the workgroup memory takes the first of FALLBACK[role] that does.
VARIANTS = {
    # Along the H100's trend (more invocations, 1-2 rows each; the sweep picks a role's tiles
    # on their own, so the roles differ): up to 512 invocations, subgroup forwards.
    "a32t2": {"fwd": (32, 32, 2, 2), "q": (32, 32, 2, 2), "kv": (32, 32, 2, 2)},
    "a32t2sg": {"fwd": (32, 32, 2, 2, 1), "q": (32, 32, 2, 2), "kv": (32, 32, 2, 2)},
    "a32t2pf": {"fwd": (32, 32, 2, 2, 1), "q": (32, 32, 2, 2, 1), "kv": (32, 32, 2, 2, 1)},
    "a64i512pf": {"fwd": (64, 32, 2, 2, 1), "q": (64, 16, 2, 1, 1), "kv": (32, 32, 1, 2, 1)},
    "a32x16pf": {"fwd": (32, 16, 2, 1, 1), "q": (32, 16, 2, 1, 1), "kv": (32, 16, 2, 1, 1)},
    "a64i512": {"fwd": (64, 32, 2, 2, 1), "q": (64, 16, 2, 1), "kv": (32, 32, 1, 2)},
    "a32t12": {"fwd": (32, 32, 1, 2, 1), "q": (32, 32, 1, 2), "kv": (16, 32, 1, 2)},
    "a32x16": {"fwd": (32, 16, 2, 1, 1), "q": (32, 16, 2, 1), "kv": (32, 16, 2, 1)},
    "a16x32": {"fwd": (16, 32, 1, 2, 1), "q": (16, 32, 1, 2), "kv": (16, 32, 2, 2)},
    "a32x64t24": {"fwd": (32, 64, 2, 4), "q": (64, 16, 4, 1), "kv": (32, 16, 1, 1)},
    "a64x16": {"fwd": (64, 16, 2, 1, 1), "q": (32, 16, 1, 1), "kv": (16, 16, 1, 1)},
    "a64t2": {"fwd": (64, 32, 4, 2), "q": (32, 32, 4, 2), "kv": (32, 32, 4, 2)},
    "a64t2sg": {"fwd": (64, 32, 4, 2, 1), "q": (32, 32, 4, 2), "kv": (32, 32, 4, 2)},
    "a64": {"fwd": (64, 32, 4, 4), "q": (32, 32, 4, 4), "kv": (32, 32, 4, 4)},
    "a64sg": {"fwd": (64, 32, 4, 4, 1), "q": (32, 32, 4, 4), "kv": (32, 32, 4, 4)},
    "a32x64": {"fwd": (32, 64, 4, 4), "q": (64, 16, 4, 4), "kv": (32, 32, 4, 4)},
    "a16": {"fwd": (32, 16, 4, 4), "q": (16, 16, 4, 4), "kv": (16, 16, 4, 4)},
}
FALLBACK = {
    "fwd": [(64, 32, 4, 4), (32, 32, 4, 4), (64, 16, 4, 4), (32, 16, 4, 4), (16, 16, 4, 4),
            (16, 16, 2, 2)],
    "q": [(32, 32, 4, 4), (64, 16, 4, 4), (32, 16, 4, 4), (16, 16, 4, 4), (16, 16, 2, 2),
          (8, 16, 2, 2)],
    "kv": [(32, 32, 4, 4), (32, 16, 4, 4), (16, 32, 4, 4), (16, 16, 4, 4), (16, 16, 2, 2),
           (8, 16, 2, 2)],
}
# The variant per adapter class ("gpu": any other): a VARIANTS name, {"fwd": .., "bwd": ..} or
# one per role (the H100 sweep behind it: BENCHMARKS.md, findings).
ATTN_TABLE: dict = {"gpu": "a64",  # nvidia: the H100 sweep's suggestion (BENCHMARKS.md)
                    "nvidia": {"fwd": "a32t2", "q": "a32t2pf", "kv": "a32t2pf"}}


def _variant_name(dev, role: str):
    forced = TUNING.attention_variant
    if forced is not None:
        if forced not in VARIANTS:
            raise ValueError(f"attention tile variant {forced!r} is not one of "
                             f"{sorted(VARIANTS)}")
        return forced
    entry = ATTN_TABLE.get(profile(dev).adapter_class, ATTN_TABLE.get("gpu"))
    if isinstance(entry, dict):
        return entry.get(role) or entry.get("fwd" if role == "fwd" else "bwd")
    return entry


def _subgroups_hold(dev, nx: int) -> bool:
    """Whether every subgroup holds whole rows of nx consecutive invocations."""
    least = TUNING.subgroup_min or profile(dev).subgroup_min
    return "subgroup" in dev.features and bool(least) and least >= nx and nx & (nx - 1) == 0


def _shape(role: str, tiles, d: int) -> dict:
    """Derived sizes of a role's tiles at head size d (see the shader's constants)."""
    R, S, TM, TN = tiles[:4]
    sg = role == "fwd" and len(tiles) > 4 and bool(tiles[4])
    pf = role != "fwd" and len(tiles) > 4 and bool(tiles[4])
    nx, ny = S // TN, R // TM
    d4 = -(-d // 4)
    ku = -(-d4 // 4)  # quads of the head per pass of the score loop (<= 4 passes)
    d4p = -(-d4 // ku) * ku
    dq = -(-d4 // nx)  # output quads per invocation (those past D4 are computed on the row's
    rp = d4p + 1  # last quad and never stored); odd pitch: no bank conflicts
    pq = S // 4 + 1
    rv = role == "fwd" and not sg and nx % 4 == 0  # the forward's row reductions in quads
    rows = {"fwd": (R, 0, S, S if sg else 0), "q": (R, R, S, S), "kv": (R, R, S, S)}[role]
    smem = {"SRA": rows[0] * rp, "SRB": rows[1] * rp, "STA": rows[2] * rp,
            "STB": rows[3] * rp, "SPA": R * pq, "SPB": R * pq if role == "kv" else 0,
            "SRED": {"fwd": 0 if sg or rv else R * nx, "kv": 2 * S, "q": 0}[role],
            "SRV": R * nx // 4 if rv else 0}
    nbytes = 16 * sum(v for k, v in smem.items() if k != "SRED") + 4 * smem["SRED"]
    return dict(R=R, S=S, TM=TM, TN=TN, NX=nx, NY=ny, NT=nx * ny, D4=d4, KU=ku, D4P=d4p,
                DQ=dq, RP=rp, PQ=pq, JU=max(1, -(-(S // 4) // 4)), SG=sg, PF=pf, RV=rv, smem=smem,
                nbytes=nbytes)


def _valid(tiles) -> bool:
    R, S, TM, TN = tiles[:4]
    return R % TM == 0 and S % TN == 0 and S % 16 == 0


@functools.lru_cache(maxsize=1024)
def _fits(role: str, tiles: tuple, d: int, limit: int, inv: int) -> bool:
    """Whether ``tiles`` are valid and fit ``limit`` bytes of workgroup memory and ``inv``
    invocations at head size d (cached: every attention call picks its tiles)."""
    sh = _shape(role, tiles, d)
    return _valid(tiles) and sh["nbytes"] <= limit and sh["NT"] <= inv


def pick_tiles(dev, role: str, d: int):
    """The tiles of ``role`` at head size d on ``dev``, or None when none fits its workgroup
    memory (the caller then runs the one-row-per-invocation kernel)."""
    limit = dev.limits.get("max-compute-workgroup-storage-size", 16384)
    inv = dev.limits.get("max-compute-invocations-per-workgroup", 256)
    name = _variant_name(dev, role)
    first = [VARIANTS[name][role]] if name in VARIANTS else []
    for tiles in first + FALLBACK[role]:
        if (role == "fwd" and len(tiles) > 4
                and not (tiles[4] and _subgroups_hold(dev, tiles[1] // tiles[3]))):
            tiles = tiles[:4]
        if _fits(role, tiles, d, limit, inv):
            return tiles
    return None


# role -> entry point (also the row kernel's)
ENTRIES = {"fwd": "fwd", "q": "bwd_q", "kv": "bwd_kv"}


@functools.lru_cache(maxsize=256)
def kernel(role: str, tiles: tuple, d: int, f16: bool, v4: bool = False) -> Kernel:
    """The entry point of ``role`` with ``tiles`` at head size d (f16: f16 q, k, v; v4: q, k,
    v, o, do read in quads, where d and their offsets are multiples of 4)."""
    sh = _shape(role, tiles, d)
    gen = {"fwd": _fwd, "q": _bwd_q, "kv": _bwd_kv}[role]
    t = "f16" if f16 else "f32"
    return Kernel.of("flash_attention2", ENTRIES[role],
                     T=t, QT=f"vec4<{t}>" if v4 else t, OT="vec4<f32>" if v4 else "f32",
                     F16=int(f16), D=d, D4=sh["D4"], RP=sh["RP"], PQ=sh["PQ"], NX=sh["NX"],
                     LOADS=_loads(v4), ENTRY=gen(sh),
                     **{k: max(1, v) for k, v in sh["smem"].items()})


def _loads(v4: bool) -> str:
    """The shader's ld_* functions (see there)."""
    out = []
    for name, arr in (("q", "Q"), ("k", "K"), ("v", "V"), ("o", "OS"), ("do", "DO")):
        if v4:
            body = [f"    return vec4<f32>({arr}[(base + row * D) / 4u + qq]);"]
        else:
            body = ["    let x = quad(base + row * D + 4u * qq, qq);",
                    f"    return select(vec4<f32>(0.0), vec4<f32>(f32({arr}[x.x]), "
                    f"f32({arr}[x.y]), f32({arr}[x.z]), f32({arr}[x.w])), inrow(qq));"]
        out += [f"fn ld_{name}(base: u32, row: u32, qq: u32, n: u32) -> vec4<f32> {{",
                "    if (row >= n || qq >= D4) { return vec4<f32>(0.0); }"] + body + ["}"]
    return "\n".join(out)


def _tile_loads(sh, dst: str, load: str, base: str, n: str, rows: int, scale: str = ""):
    """(guard, destination, value of row0) per pass of staging rows [row0, row0 + rows) of a
    [T, D] block into a row tile (pitch RP quads, zero past n rows and past D), unrolled over
    the workgroup."""
    total, nt = rows * sh["RP"], sh["NT"]
    for l in range(-(-total // nt)):
        e = f"lid + {l * nt}u"
        yield (f"{e} < {total}u" if (l + 1) * nt > total else None, f"{dst}[{e}]",
               lambda r0, e=e: f"{load}({base}, {r0} + ({e}) / RP, ({e}) % RP, {n}){scale}")


def _guarded(guard, st: str) -> str:
    return f"if ({guard}) {{ {st} }}" if guard else st


def _stage(sh, dst: str, load: str, base: str, row0: str, n: str, rows: int,
           scale: str = "") -> list:
    """Rows [row0, row0 + rows) of a [T, D] block into a row tile."""
    return [_guarded(g, f"{d} = {v(row0)};")
            for g, d, v in _tile_loads(sh, dst, load, base, n, rows, scale)]


def _streamed(sh, entries, first: str) -> tuple:
    """(before the loop, top of a tile, after its barrier): staging of the streamed tiles;
    with PF tile t + S is loaded into registers while tile t is computed."""
    if not sh["PF"]:
        return [], [_guarded(g, f"{d} = {v('t')};") for g, d, v in entries], []
    before, top, after, nxt = [], [], [], f"t + {sh['S']}u"
    for k, (g, d, v) in enumerate(entries):
        before.append(f"var pf{k} = {v(first)};")
        top.append(_guarded(g, f"{d} = pf{k};"))
        after.append(f"pf{k} = {v(nxt)};")
    return before, top, after


def _head(sh, heavy_last: bool = False) -> list:
    """The entry's first lines. heavy_last: causal blocks taken from the last (the heaviest),
    so the dispatch ends on light workgroups."""
    blk = ("select(g % pu(10u), pu(10u) - 1u - g % pu(10u), pu(9u) != 0u)" if heavy_last
           else "g % pu(10u)")
    return [f"@compute @workgroup_size({sh['NT']})",
            "fn {entry}(ids: Launch) {",
            "    let g = group_idx(ids);",
            "    let bh = g / pu(10u);",
            "    if (bh >= pu(0u)) { return; }",
            f"    let r0 = {blk} * {sh['R']}u;",
            "    let lid = ids.lid;",
            "    let tx = lid % NX;",
            "    let ty = lid / NX;",
            "    let Tq = pu(1u);",
            "    let Tk = pu(2u);",
            "    let causal = pu(9u) != 0u;",
            "    let c2 = pf(8u) * LOG2E;",
            "    let qb = pu(3u) + bh * Tq * D;",
            "    let kb = pu(4u) + bh * Tk * D;",
            "    let vb = pu(5u) + bh * Tk * D;"]


def _rows(sh, ind="    ") -> list:
    """rr{i}: this invocation's resident tile rows; cc{j}: its streamed tile rows."""
    return ([f"{ind}let rr{i} = ty + {sh['NY'] * i}u;" for i in range(sh["TM"])]
            + [f"{ind}let cc{j} = tx + {sh['NX'] * j}u;" for j in range(sh["TN"])])


def _scores(sh, pairs, ind="        ") -> list:
    """Zeroed score registers and the loop over the head: for each (name, resident tile,
    streamed tile) in pairs, name{i}_{j} = row rr{i} . row cc{j}."""
    TM, TN, KU = sh["TM"], sh["TN"], sh["KU"]
    out = [f"{ind}var {n}{i}_{j} = 0.0;" for n, _, _ in pairs for i in range(TM)
           for j in range(TN)]
    out.append(f"{ind}for (var kq = 0u; kq < {sh['D4P']}u; kq += {KU}u) {{")
    for ku in range(KU):
        for n, ra, ta in pairs:
            a, b, k = f"{ind}    let {n}a", f"{ind}    let {n}b", f"kq + {ku}u"
            out += [f"{a}{i}_{ku} = {ra}[rr{i} * RP + {k}];" for i in range(TM)]
            out += [f"{b}{j}_{ku} = {ta}[cc{j} * RP + {k}];" for j in range(TN)]
            out += [f"{ind}    {n}{i}_{j} += dot({n}a{i}_{ku}, {n}b{j}_{ku});" for i in range(TM)
                    for j in range(TN)]
    out.append(f"{ind}}}")
    return out


def _accumulate(sh, terms, ind="        ") -> list:
    """acc{i}_{u} += sum over the tile's streamed rows c of score[rr{i}][c] * tile[c][quad
    tx + NX u], for each (acc, score tile, row tile) in terms."""
    TM, DQ, JU, S = sh["TM"], sh["DQ"], sh["JU"], sh["S"]
    out = [f"{ind}for (var jq = 0u; jq < {S // 4}u; jq += {JU}u) {{"]
    for ju in range(JU):
        for acc, pt, _ in terms:
            out += [f"{ind}    let {acc}p{i}_{ju} = {pt}[rr{i} * PQ + jq + {ju}u];"
                    for i in range(TM)]
        for e, c in enumerate("xyzw"):
            row = f"(4u * (jq + {ju}u) + {e}u) * RP"
            for acc, _, rt in terms:
                for u in range(DQ):
                    qq = f"tx + {sh['NX'] * u}u"
                    if sh["NX"] * (u + 1) > sh["D4"]:  # quads past D4: unused, kept in range
                        qq = f"min({qq}, {sh['D4'] - 1}u)"
                    out.append(f"{ind}    let {acc}v{u}_{ju}{c} = {rt}[{row} + {qq}];")
                    out += [f"{ind}    {acc}{i}_{u} = fma(vec4<f32>({acc}p{i}_{ju}.{c}), "
                            f"{acc}v{u}_{ju}{c}, {acc}{i}_{u});" for i in range(TM)]
    out.append(f"{ind}}}")
    return out


def _acc_decl(sh, names, ind="    ") -> list:
    return [f"{ind}var {n}{i}_{u} = vec4<f32>(0.0);" for n in names for i in range(sh["TM"])
            for u in range(sh["DQ"])]


def _fwd(sh) -> str:
    TM, TN, NX, DQ, R, S, SG = (sh[k] for k in ("TM", "TN", "NX", "DQ", "R", "S", "SG"))
    vt = "TB" if SG else "TA"  # V's tile: beside K's (SG), or K's once the scores are done
    L = _head(sh, True) + _rows(sh)
    L += ["    " + x for x in _stage(sh, "RA", "ld_q", "qb", "r0", "Tq", R, " * c2")]
    L += [f"    var m{i} = LOWEST_F32;\n    var l{i} = 0.0;" for i in range(TM)]
    L += _acc_decl(sh, ["o"])
    L += [f"    let kend = select(Tk, min(Tk, r0 + {R}u), causal);",
          f"    for (var t = 0u; t < kend; t += {S}u) {{",
          "        workgroupBarrier();"]
    L += ["        " + x for x in _stage(sh, "TA", "ld_k", "kb", "t", "Tk", S)]
    if SG:
        L += ["        " + x for x in _stage(sh, "TB", "ld_v", "vb", "t", "Tk", S)]
    L += ["        workgroupBarrier();"]
    L += _scores(sh, [("s", "RA", "TA")])
    for j in range(TN):
        L.append(f"        let key{j} = t + cc{j};")
    for i in range(TM):
        L.append(f"        let row{i} = r0 + rr{i};")
        for j in range(TN):
            L.append(f"        s{i}_{j} = select(LOWEST_F32, s{i}_{j}, key{j} < Tk && "
                     f"(!causal || key{j} <= row{i}));")
        mx = f"s{i}_0"
        for j in range(1, TN):
            mx = f"max({mx}, s{i}_{j})"
        if SG:
            L.append(f"        var mx{i} = max(m{i}, {mx});")
            L += [f"        mx{i} = max(mx{i}, subgroupShuffleXor(mx{i}, {b}u));"
                  for b in _xor_steps(NX)]
        else:
            L.append(f"        {_red_put(sh, i)} = {mx};")
    if not SG:
        L.append("        workgroupBarrier();")
    for i in range(TM):
        if SG:
            L.append(f"        let mn{i} = mx{i};")
        else:
            pre, mx = _red_all(sh, i, "max", f"m{i}")
            L += ["        " + x for x in pre] + [f"        let mn{i} = {mx};"]
        L += [f"        let al{i} = exp2(m{i} - mn{i});",
              f"        m{i} = mn{i};",
              f"        l{i} *= al{i};"]
        L += [f"        o{i}_{u} *= al{i};" for u in range(DQ)]
        for j in range(TN):
            L += [f"        let p{i}_{j} = exp2(s{i}_{j} - mn{i});",
                  f"        l{i} += p{i}_{j};",
                  f"        put_pa(rr{i}, cc{j}, p{i}_{j});"]
    if not SG:
        L += ["        " + x for x in _stage(sh, "TA", "ld_v", "vb", "t", "Tk", S)]
    L.append("        workgroupBarrier();")
    L += _accumulate(sh, [("o", "PA", vt)])
    L.append("    }")
    if SG:
        for i in range(TM):
            L += [f"    l{i} += subgroupShuffleXor(l{i}, {b}u);" for b in _xor_steps(NX)]
    else:
        L.append("    workgroupBarrier();")
        L += [f"    {_red_put(sh, i)} = l{i};" for i in range(TM)]
        L.append("    workgroupBarrier();")
    for i in range(TM):
        pre, tot = ([], f"l{i}") if SG else _red_all(sh, i, "add")
        L += ["    " + x for x in pre] + [f"    if (r0 + rr{i} < Tq) {{",
              f"        let row = bh * Tq + r0 + rr{i};",
              f"        let lsum = {tot};"]
        L += [f"        st_w1(pu(6u) + row * D, tx + {NX * u}u, o{i}_{u} / lsum);"
              for u in range(DQ)]
        L += [f"        if (tx == 0u) {{ W2[pu(7u) + row] = (m{i} + log2(lsum)) * LN2; }}",
              "    }"]
    L.append("}")
    return "\n".join(L).replace("{entry}", "fwd")


def _red_put(sh, i: int) -> str:
    """This invocation's slot of resident row rr{i} in the forward's row reduction."""
    if sh["RV"]:
        return f"RV[rr{i} * {sh['NX'] // 4}u + tx / 4u][tx % 4u]"
    return f"RED[rr{i} * NX + tx]"


def _red_all(sh, i: int, op: str, init: str = "") -> tuple:
    """(lines, expression): the max or sum of row rr{i}'s NX slots (and init); in quads where
    RV holds them (NX / 4 loads instead of NX)."""
    f = (lambda a, b: f"max({a}, {b})") if op == "max" else (lambda a, b: f"({a} + {b})")
    lines = []
    if sh["RV"]:
        v = functools.reduce(f, [f"RV[rr{i} * {sh['NX'] // 4}u + {x}u]"
                                 for x in range(sh["NX"] // 4)])
        lines.append(f"let rd{i} = {v};")
        terms = [f(f(f"rd{i}.x", f"rd{i}.y"), f(f"rd{i}.z", f"rd{i}.w"))]
    else:
        terms = [f"RED[rr{i} * NX + {x}u]" for x in range(sh["NX"])]
    return lines, functools.reduce(f, ([init] if init else []) + terms)


def _xor_steps(nx: int) -> list:
    """Shuffle distances that combine the nx invocations of a row (tx = lane % nx)."""
    return [1 << b for b in range(nx.bit_length() - 1)]


def _bwd_q(sh) -> str:
    TM, TN, NX, DQ, R, S = sh["TM"], sh["TN"], sh["NX"], sh["DQ"], sh["R"], sh["S"]
    L = _head(sh, True) + _rows(sh)
    L += ["    let ob = pu(11u) + bh * Tq * D;", "    let db = pu(12u) + bh * Tq * D;"]
    L += ["    " + x for x in _stage(sh, "RA", "ld_q", "qb", "r0", "Tq", R, " * c2")]
    L += ["    " + x for x in _stage(sh, "RB", "ld_do", "db", "r0", "Tq", R)]
    L.append("    workgroupBarrier();")
    # DSUM = dO . O of own rows (dO from the tile, O from storage): the row's NX invocations
    # each take its quads tx + NX u and add up their parts through PA (free until the loop)
    for i in range(TM):
        L += [f"    let row{i} = r0 + rr{i};",
              f"    let lse{i} = LS[pu(13u) + bh * Tq + min(row{i}, Tq - 1u)] * LOG2E;"]
        part = []
        for u in range(DQ):
            qq = f"tx + {NX * u}u"
            rq = f"min({qq}, {sh['D4'] - 1}u)" if NX * (u + 1) > sh["D4"] else qq
            part.append(f"dot(RB[rr{i} * RP + {rq}], ld_o(ob, row{i}, {qq}, Tq))")
        L.append(f"    put_pa(rr{i}, tx, {' + '.join(part)});")
    L.append("    workgroupBarrier();")
    for i in range(TM):
        terms = [f"dot(PA[rr{i} * PQ + {x}u], vec4<f32>(1.0))" for x in range(NX // 4)]
        terms += [f"PA[rr{i} * PQ + {x // 4}u].{'xyzw'[x % 4]}" for x in range(NX // 4 * 4, NX)]
        L.append(f"    let dsum{i} = {' + '.join(terms)};")
    L += _acc_decl(sh, ["o"])
    before, top, after = _streamed(sh, list(_tile_loads(sh, "TA", "ld_k", "kb", "Tk", S))
                                   + list(_tile_loads(sh, "TB", "ld_v", "vb", "Tk", S)), "0u")
    L += ["    " + x for x in before]
    L += [f"    let kend = select(Tk, min(Tk, r0 + {R}u), causal);",
          f"    for (var t = 0u; t < kend; t += {S}u) {{",
          "        workgroupBarrier();"]
    L += ["        " + x for x in top] + ["        workgroupBarrier();"]
    L += ["        " + x for x in after]
    L += _scores(sh, [("s", "RA", "TA"), ("dp", "RB", "TB")])
    for j in range(TN):
        L.append(f"        let key{j} = t + cc{j};")
    for i in range(TM):
        for j in range(TN):
            L += [f"        let p{i}_{j} = select(0.0, exp2(s{i}_{j} - lse{i}), key{j} < Tk && "
                  f"(!causal || key{j} <= row{i}));",
                  f"        put_pa(rr{i}, cc{j}, p{i}_{j} * (dp{i}_{j} - dsum{i}));"]
    L.append("        workgroupBarrier();")
    L += _accumulate(sh, [("o", "PA", "TA")])
    L.append("    }")
    for i in range(TM):
        L += [f"    if (row{i} < Tq) {{",
              f"        let row = bh * Tq + row{i};"]
        L += [f"        st_w1(pu(6u) + row * D, tx + {NX * u}u, o{i}_{u} * pf(8u));"
              for u in range(DQ)]
        L += [f"        if (tx == 0u) {{ W2[pu(7u) + row] = dsum{i}; }}", "    }"]
    L.append("}")
    return "\n".join(L).replace("{entry}", "bwd_q")


def _bwd_kv(sh) -> str:
    TM, TN, NX, DQ, R, S = sh["TM"], sh["TN"], sh["NX"], sh["DQ"], sh["R"], sh["S"]
    L = _head(sh) + _rows(sh)
    L += ["    let db = pu(12u) + bh * Tq * D;", "    let lb = bh * Tq;"]
    L += ["    " + x for x in _stage(sh, "RA", "ld_k", "kb", "r0", "Tk", R, " * c2")]
    L += ["    " + x for x in _stage(sh, "RB", "ld_v", "vb", "r0", "Tk", R)]
    L += [f"    let key{i} = r0 + rr{i};" for i in range(TM)]
    L += _acc_decl(sh, ["dk", "dv"])
    ok = lambda r0, e: f"{r0} + {e} < Tq"  # noqa: E731
    row = lambda r0, e: f"lb + select(0u, {r0} + {e}, {ok(r0, e)})"  # noqa: E731
    red = []  # the query rows' logsumexp (log2 units) and DSUM
    for l in range(-(-S // sh["NT"])):
        e = f"lid + {l * sh['NT']}u"
        g = f"{e} < {S}u" if (l + 1) * sh["NT"] > S else None
        red += [(g, f"RED[{e}]", lambda r0, e=e: f"select(0.0, LS[pu(13u) + {row(r0, e)}] * "
                 f"LOG2E, {ok(r0, e)})"),
                (g, f"RED[{S}u + {e}]", lambda r0, e=e: f"select(0.0, DS[pu(14u) + "
                 f"{row(r0, e)}], {ok(r0, e)})")]
    before, top, after = _streamed(sh, list(_tile_loads(sh, "TA", "ld_q", "qb", "Tq", S))
                                   + list(_tile_loads(sh, "TB", "ld_do", "db", "Tq", S)) + red,
                                   "qstart")
    L += [f"    let qstart = select(0u, (r0 / {S}u) * {S}u, causal);"]
    L += ["    " + x for x in before]
    L += [f"    for (var t = qstart; t < Tq; t += {S}u) {{",
          "        workgroupBarrier();"]
    L += ["        " + x for x in top] + ["        workgroupBarrier();"]
    L += ["        " + x for x in after]
    L += _scores(sh, [("s", "RA", "TA"), ("dp", "RB", "TB")])
    for j in range(TN):
        L += [f"        let qr{j} = t + cc{j};",
              f"        let lse{j} = RED[cc{j}];",
              f"        let dsum{j} = RED[{S}u + cc{j}];"]
    for i in range(TM):
        for j in range(TN):
            L += [f"        let p{i}_{j} = select(0.0, exp2(s{i}_{j} - lse{j}), qr{j} < Tq && "
                  f"(!causal || key{i} <= qr{j}));",
                  f"        put_pa(rr{i}, cc{j}, p{i}_{j});",
                  f"        put_pb(rr{i}, cc{j}, p{i}_{j} * (dp{i}_{j} - dsum{j}));"]
    L.append("        workgroupBarrier();")
    L += _accumulate(sh, [("dv", "PA", "TB"), ("dk", "PB", "TA")])
    L.append("    }")
    for i in range(TM):
        L += [f"    if (key{i} < Tk) {{", f"        let row = bh * Tk + key{i};"]
        for u in range(DQ):
            L += [f"        st_w1(pu(6u) + row * D, tx + {NX * u}u, dk{i}_{u} * pf(8u));",
                  f"        st_w2(pu(7u) + row * D, tx + {NX * u}u, dv{i}_{u});"]
        L.append("    }")
    L.append("}")
    return "\n".join(L).replace("{entry}", "bwd_kv")


WG = 64  # row kernel: rows (queries, or keys in bwd_kv) per workgroup, one per invocation
MAX_HEAD_DIM = 128
# llvmpipe's 65,535-iteration loop cap (the row kernel's block loops count about one per
# streamed row; its vec4 loops unroll up to d 64) bounds CPU adapters' shapes.
CPU_MAX_HEAD_DIM = 64
CPU_MAX_ROWS = 60_000
# CPU adapters take the tiles from this head size and one query block up, else the row kernel
# (lavapipe, causal f+b: tiles at d 64 1.7x, 32 1.5x, 16 1.0x, 4 0.5x the row kernel's rate).
CPU_TILES_MIN_D = 32


def fused_fits(dev, d: int, Tq: int, Tk: int) -> bool:
    """Whether the fused kernel takes this head size and these lengths on ``dev`` (callers
    with another way, the unfused composition, pick it when not)."""
    if profile(dev).cpu:
        return d <= CPU_MAX_HEAD_DIM and max(Tq, Tk) <= CPU_MAX_ROWS
    return d <= MAX_HEAD_DIM


def _row_kernel(entry: str, d: int, dtype) -> Kernel:
    """The one-row-per-invocation kernel (shaders/flash_attention.wgsl, no workgroup memory,
    no barriers): adapters whose workgroup memory holds no FlashAttention-2 tile."""
    t = "f16" if dtype == float16 else "f32"
    return Kernel.of("flash_attention", entry, T=t, F16=int(t == "f16"), WG=WG, D=d, BK=32)


def tiles_for(dev, d: int, T: int):
    """Tiles per role, or None for the row kernel (no tile fits; CPU adapters below
    CPU_TILES_MIN_D or one query block). TUNING.row_mode forces the choice."""
    forced = TUNING.row_mode
    if forced == "thread":
        return None
    tiles = {r: pick_tiles(dev, r, d) for r in ("fwd", "q", "kv")}
    if None in tiles.values():
        return None
    if forced is None and profile(dev).cpu and (d < CPU_TILES_MIN_D or T < tiles["fwd"][0]):
        return None
    return tiles


def launch(entry, q, k, v, w1, w2, scale, causal, rows, o=None, do=None, lse=None, dsum=None,
           tiles=None):
    """One dispatch: the FlashAttention-2 kernel of role ``entry`` ('fwd', 'q', 'kv') with
    ``tiles``, or the row kernel's entry (fwd, bwd_q, bwd_kv) without. Operands: views of
    [BH, T, d] rows."""
    BH, Tq, d = q.shape
    Tk = k.shape[1]
    dev = q.device
    if tiles is None:
        block = WG
        kern = _row_kernel(ENTRIES[entry], d, q.dtype)
    else:
        block = tiles[entry][0]
        v4 = all(t.offset % 4 == 0 for t in (q, k, v, o, do) if t is not None) and d % 4 == 0
        kern = kernel(entry, tiles[entry], d, q.dtype == float16, v4)
    blocks = -(-rows // block)
    off = lambda t: t.offset if t is not None else 0
    bufs = [t.buffer for t in (q, k, v, w1, w2, o, do, lse, dsum) if t is not None]
    dev.dispatch(kern, bufs,
                 [BH, Tq, Tk, q.offset, k.offset, v.offset, w1.offset, w2.offset, float(scale),
                  int(causal), blocks, off(o), off(do), off(lse), off(dsum)],
                 groups_1d(BH * blocks, 1))
