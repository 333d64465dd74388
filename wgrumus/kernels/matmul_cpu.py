"""The barrier-free matmul of CPU adapters (shaders/matmul_cpu.wgsl): blocks per invocation,
operands from storage or textures, its unrolled register code, and the launch in K passes under
llvmpipe's loop cap. Operands are buffer views (kernels/__init__.py)."""
from __future__ import annotations

import functools
import weakref

from ..runtime.buffer_view import BufferView, View, float16, float32
from ..runtime.device import MAX_WG_PER_DIM, TEX_W, groups_1d, texture_loader
from ..runtime.errors import ShapeError
from ..runtime.kernels import Kernel
from ..runtime.profile import profile
from ..runtime.tuning import TUNING
from . import texture
from .map import run_map
from .matmul_gpu import _epilogue_defines, _load

# CPU adapters (shaders/matmul_cpu.wgsl): outputs per invocation (TM x TN) and invocations per
# workgroup (WGX along n, WGY along m), from a sweep on lavapipe (AVX2; BENCHMARKS.md, findings).
# K per pass of the CPU kernel (element-wise, vec4): llvmpipe ends an invocation's loops after
# 65,535 back-edges in all; a vec4 step covers 4 K.
CPU_KPASS = (65_000, 260_000)
CPU_K1_BLOCK = 256  # blocks of this many outputs and more step K one at a time (compile time)
# Smaller products keep storage operands: there the two texture copies cost about what they
# save (4x4 @ 4x4: 0.5x, 4x64 @ 64x64 .. 32x64 @ 64x64: 0.8-1.6x, 128x64 @ 64x64: 3.4-4x;
# BENCHMARKS.md).
CPU_TEX_MIN = 1 << 18
CPU_WG = (4, 4)  # WGX, WGY
# Output sides from this long get 16-wide blocks: at 64 (1024x256 @ 256x64, 64x1024 @ 1024x64,
# ...: the GPT-default shapes) they ran 1.3-2.8x the 8-wide ones (fewer lanes busy, twice the
# FMAs per load); BENCHMARKS.md, lavapipe section.
CPU_SIDE16 = 64
CPU_FLAT = (1, 4, 1, 64, 1)  # tiny batched matrices: one row an invocation, 64 a workgroup
CPU_TEX_WG = 8  # invocations a workgroup with texture operands: one AVX2 SIMD vector
# Texture operands: 16-row blocks where they still make this many workgroups (work for every
# CPU thread), else 8 (64x1024 @ 1024x64, A transposed: 7.3 vs 4.3 GFLOP/s; BENCHMARKS.md)
CPU_TEX_GROUPS = 16


def use_cpu_kernel(dev) -> bool:
    """Whether ``dev``'s products run this kernel (CPU adapters; TUNING.cpu_matmul forces it)."""
    on = TUNING.cpu_matmul
    return profile(dev).cpu if on is None else on


def cpu_subgroup(dev) -> int:
    """Lanes of a subgroup where a CPU adapter's subgroup size is known: llvmpipe's is its
    vector width ("llvmpipe (LLVM 15.0.6, 256 bits)": 8 f32 lanes); 0 elsewhere, without the
    subgroup feature, or with TUNING.matmul_subgroup_rows False."""
    return 0 if TUNING.matmul_subgroup_rows is False else profile(dev).lanes


def use_cpu_textures(dev, f16: bool, work: int = CPU_TEX_MIN) -> bool:
    """f32 operands go through textures on CPU adapters (TUNING.matmul_textures forces it) for
    products of at least CPU_TEX_MIN multiply-adds (``work``); wr.jit captures replay the
    texture copies too."""
    on = TUNING.matmul_textures
    on = profile(dev).cpu and work >= CPU_TEX_MIN if on is None else on
    return on and not f16


def _cpu_tile(M: int, N: int, nbatch: int, tex: bool = False, sg: bool = False) -> tuple:
    """(TM, TN, WGX, WGY, FLAT, TEX, SG). Storage operands: 16 x 16 blocks (the most FMAs per
    loaded value that llvmpipe still compiles in seconds) where the output has enough of them,
    smaller ones on thin sides so that fewer lanes idle. Texture operands (cheaper loads):
    16 x 8 blocks (8 x 8 where that leaves few workgroups), 8 invocations along n (fewer on
    narrow outputs, the rest along m); with A's rows shared over a subgroup of CPU_TEX_WG lanes
    (``sg``: A read as vec4) 32 x 8 blocks (32 x 4 on outputs under 64 wide: every lane busy;
    16 or 8 rows where that leaves few workgroups; 32 x 8 ran 1.02-1.4x 32 x 4 on 512^2, 256^2
    and a training step's products, 32 x 16 below 32 x 8: BENCHMARKS.md).
    Batches of matrices of a few rows run FLAT (lanes over all batches' rows).
    BENCHMARKS.md (findings) has the sweep that chose them."""
    if nbatch > 1 and 8 * M <= CPU_FLAT[3]:
        return CPU_FLAT + (tex, False)
    groups = lambda tm, tn, wgx, wgy: nbatch * -(-N // (tn * wgx)) * -(-M // (tm * wgy))
    if sg and N > 4 * (CPU_TEX_WG - 1):  # every lane of the subgroup on a column quad
        tn = 8 if N >= 8 * CPU_TEX_WG else 4  # two quads a lane where all 8 lanes get them
        tm = next((t for t in (32, 16) if groups(t, tn, CPU_TEX_WG, 1) >= CPU_TEX_GROUPS), 8)
        return (tm, tn, CPU_TEX_WG, 1, 0, True, True)
    if tex:
        tn = 8 if N >= 32 else 4
        wgx = min(CPU_TEX_WG, 1 << (-(-N // tn) - 1).bit_length())
        wgy = CPU_TEX_WG // wgx
        tm = 16 if M >= 64 and groups(16, tn, wgx, wgy) >= CPU_TEX_GROUPS else \
            8 if M >= 32 else 4
        return (tm, tn, wgx, wgy, 0, True, False)
    side = lambda d: 16 if d >= CPU_SIDE16 else 8 if d >= 32 else 4
    return (side(M), side(N)) + CPU_WG + (0, False, False)




def _fin_code(t: str, acc: bool, epilogue: tuple, v4: bool, rtex: bool = False) -> str:
    """FIN of matmul_cpu.wgsl: C's declaration and the stored value, fin(i, n, x) per element
    or (``v4``, f32) fin4(i, n, x) per quad of a row, the epilogue's operands read as quads
    (``rtex``: the residual from a texture holding a copy of it, ops/texture.py)."""
    act, bias, residual, *pre = epilogue
    if not v4:
        d = {"EPI_PRE": "", **_epilogue_defines(act, bias, residual, *pre)}
        c = f"{t}(epi(i, n, x + f32(C[i])))" if acc else f"{t}(epi(i, n, x))"
        return (f"@group(0) @binding(3) var<storage, read_write> C: array<{t}>;\n"
                f"{d['EPI_DECLS']}\n"
                f"fn epi(i: u32, n: u32, x: f32) -> f32 {{ {d['EPI_PRE']}return {d['EPI']}; }}\n"
                f"fn fin(i: u32, n: u32, x: f32) -> {t} {{ return {c}; }}")
    if t != "f32" or (pre and (residual or not act)):
        raise ValueError("matmul_cpu: quad stores are f32 only; the pre-activation store needs "
                         "an activation and no residual")
    decls = ["@group(0) @binding(3) var<storage, read_write> C: array<vec4<f32>>;"]
    z = "x" + (" + C[i >> 2u]" if acc else "")
    e = "(i - pu(11u) + pu(14u)) >> 2u"  # the quad's index in RES / PRE
    if bias:  # (the caller loads the column quad's bias once: bq, _cpu_code)
        decls.append("@group(0) @binding(4) var<storage, read> BIAS: array<vec4<f32>>;")
        z += " + b"
    if residual:
        decls.append(texture.decls({"RES": 4 + bias}, rtex))
        z += f" + ld_RES({e})"
    body = [f"let z = {z};"]
    if pre:
        decls.append(f"@group(0) @binding({4 + bias}) var<storage, read_write> PRE: "
                     "array<vec4<f32>>;")
        body.append(f"PRE[{e}] = z;")
    ret = "z" if not act else "vec4<f32>(" + ", ".join(
        act.format(z=f"z.{q}") for q in _Q) + ")"
    args = ", b: vec4<f32>" if bias else ""
    return "\n".join(decls) + (f"\nfn fin4(i: u32, n: u32, x: vec4<f32>{args}) -> vec4<f32> {{"
                               "\n    " + "\n    ".join(body) + f"\n    return {ret};\n}}")


_Q = "xyzw"


def _cpu_code(tm: int, tn: int, am: int, bm: int, vec: bool, k4: bool, t: str,
              sg: int = 0, v4: bool = False, bias: bool = False) -> dict:
    """Register code of matmul_cpu.wgsl, unrolled with literal indices (every accumulator and
    loaded value stays a named register); ``sg``: the subgroup size that shares A's rows;
    ``v4``: C stored a quad at a time (fin4), with ``bias`` each column quad's bias loaded once
    (a storage read costs llvmpipe a loop over the lanes: not once per row)."""
    fmas = _fmas(tm, tn)
    body1 = [f"let a{i} = ea(ra{i} + k * ac);" for i in range(tm)]
    if vec and bm == 0:  # B's quads along n, one k at a time
        body1 += [f"let b{q} = ld(qb((nq{q} + k * br) >> 2u));" for q in range(tn // 4)]
        body1 += fmas(lambda i, r: f"a{i}", lambda r, q: f"b{q}", [0])
    else:
        body1 += [f"let b{j} = eb(cb{j} + k * br);" for j in range(tn)]
        body1 += fmas(lambda i, r: f"a{i}", lambda r, q: _bcols("b", q), [0])
    ind = lambda lines, n: "\n".join(" " * n + x.replace("\n", "\n" + " " * n) for x in lines)
    return {"SETUP": ind(_setup(tm, tn, am, bm, vec, sg), 4),
            "BODY4": ind(_body4(tm, tn, am, bm, sg) if k4 else [], 8), "BODY1": ind(body1, 8),
            "STORE": ind(_cpu_stores(tm, tn, v4, bias), 4)}


def _fmas(tm: int, tn: int):
    """fmas(a_of, bq_of, rs, rows): each accumulator's k steps ``rs`` in a row."""
    def fmas(a_of, bq_of, rs, rows=range(tm)):
        return [f"c{i}_{q} = fma(vec4<f32>({a_of(i, r)}), {bq_of(r, q)}, c{i}_{q});"
                for i in rows for q in range(tn // 4) for r in rs]
    return fmas


def _bcols(name, q, suffix=""):
    return "vec4<f32>(" + ", ".join(f"{name}{4 * q + e}{suffix}" for e in range(4)) + ")"


def _setup(tm: int, tn: int, am: int, bm: int, vec: bool, sg: int) -> list:
    """Row and column bases of the block's operands, and its zeroed accumulators."""
    setup = [f"let ra{i} = abase + min(m0 + {i}u, lm) * ar;" for i in range(tm)]
    if sg and am == 0:  # lane l fetches rows m0 + l, m0 + sg + l, ...
        setup += [f"let sa{j} = abase + min(m0 + {sg * j}u + lane, lm) * ar;"
                  for j in range(tm // sg)]
    if sg and am == 1:  # lane l fetches the quad of rows m0 + 4l ..
        setup.append("let sq = abase + min(m0 + 4u * lane, lqm);")
    setup += [f"let cb{j} = bbase + min(n0 + {j}u, ln) * bc;" for j in range(tn)]
    if vec and am == 1:
        setup += [f"let mq{q} = abase + min(m0 + {4 * q}u, lqm);" for q in range(tm // 4)]
    if vec and bm == 0:
        setup += [f"let nq{q} = bbase + min(n0 + {4 * q}u, lqn);" for q in range(tn // 4)]
    return setup + [f"var c{i}_{q} = vec4<f32>(0.0);" for i in range(tm) for q in range(tn // 4)]


def _a_loads(tm: int, am: int, sg: int) -> tuple:
    """(shared loads per 4-k step, a_defs(g): row group g's A values): A's rows from the
    subgroup's shared texels (``sg``) or loaded per row (am 0) or per column quad (am 1)."""
    if am == 0 and sg:
        return ([f"let s{j} = ld(qa((sa{j} + k) >> 2u));" for j in range(tm // sg)],
                lambda g: [f"let a{g} = subgroupBroadcast(s{g // sg}, {g % sg}u);"])
    if am == 0:
        return [], lambda g: [f"let a{g} = ld(qa((ra{g} + k) >> 2u));"]
    if sg:
        return ([f"let s{r} = ld(qa((sq + (k + {r}u) * ac) >> 2u));" for r in range(4)],
                lambda g: [f"let a{g}_{r} = subgroupBroadcast(s{r}, {g}u);" for r in range(4)])
    return [], lambda g: [f"let a{g}_{r} = ld(qa((mq{g} + (k + {r}u) * ac) >> 2u));"
                          for r in range(4)]


def _body4(tm: int, tn: int, am: int, bm: int, sg: int) -> list:
    """A 4-k step: B's loads, A's shared texels, then per row group its A values and FMAs."""
    body4, a_defs = _a_loads(tm, am, sg)
    a_of = (lambda i, r: f"a{i}.{_Q[r]}") if am == 0 else (
        lambda i, r: f"a{i // 4}_{r}.{_Q[i % 4]}")
    if bm == 0:
        body4 += [f"let b{r}_{q} = ld(qb((nq{q} + (k + {r}u) * br) >> 2u));"
                  for r in range(4) for q in range(tn // 4)]
        bq_of = lambda r, q: f"b{r}_{q}"
    else:
        body4 += [f"let b{j} = ld(qb((cb{j} + k) >> 2u));" for j in range(tn)]
        bq_of = lambda r, q: _bcols("b", q, "." + _Q[r])
    # A row group's values are defined right before its FMAs, and each accumulator takes
    # its 4 k steps in a row: short live ranges (llvmpipe keeps every lane value of a
    # vec4 in its own vector register; TM x TN accumulators already spill)
    per = 1 if am == 0 else 4
    fmas = _fmas(tm, tn)
    for g in range(tm // per):
        body4 += a_defs(g) + fmas(a_of, bq_of, range(4), range(g * per, (g + 1) * per))
    return body4


def _cpu_stores(tm: int, tn: int, v4: bool, bias: bool) -> list:
    """The block's guarded stores through fin (per element) or fin4 (``v4``: per quad)."""
    store = []
    if v4 and bias:  # (a quad past N loads the last one; its sums are never stored)
        store += [f"let bq{q} = BIAS[(pu(13u) + min(n0 + {4 * q}u, N - 4u)) >> 2u];"
                  for q in range(tn // 4)]
    for i in range(tm):
        store.append(f"if (m0 + {i}u < M) {{\n    let r{i} = c0 + (m0 + {i}u) * cr;")
        for j in range(0, tn, 4) if v4 else range(tn):  # v4: N % 4 == 0, whole quads
            n = f"n0 + {j}u"
            store.append(f"    if ({n} < N) {{ C[(r{i} + {n}) >> 2u] = fin4(r{i} + {n}, {n}, "
                         f"c{i}_{j // 4}{f', bq{j // 4}' if bias else ''}); }}" if v4 else
                         f"    if ({n} < N) {{ C[r{i} + {n}] = fin(r{i} + {n}, {n}, "
                         f"c{i}_{j // 4}.{_Q[j % 4]}); }}")
        store.append("}")
    return store


def _operand_decls(t: str, tex: bool) -> str:
    """A and B (bindings 1, 2) with their quad loads qa / qb: storage arrays, or (``tex``)
    rgba32float textures of TEX_W texels a row."""
    if not tex:
        return "\n".join(f"@group(0) @binding({i}) var<storage, read> {x}: array<vec4<{t}>>;\n"
                         f"fn q{x.lower()}(q: u32) -> vec4<{t}> {{ return {x}[q]; }}"
                         for i, x in ((1, "A"), (2, "B")))
    return "\n".join(texture_loader(x, i, f"q{x.lower()}") for i, x in ((1, "A"), (2, "B")))


@functools.lru_cache(maxsize=128)
def cpu_kernel_for(tm: int, tn: int, wgx: int, wgy: int, am: int, bm: int, flat: bool = False,
                   f16: bool = False, epilogue: tuple = (None, False, False),
                   acc: bool = False, tex: bool = False, sg: bool = False,
                   r16: bool = False, v4: bool = False, rtex: bool = False) -> Kernel:
    """The barrier-free CPU-adapter matmul (shaders/matmul_cpu.wgsl): TM x TN outputs per
    invocation, WGX x WGY invocations per workgroup, load modes AM/BM (2: element-wise),
    operands in storage buffers or (``tex``, f32 only) textures; ``sg``: A's rows shared over
    the subgroup (texture operands, vec4 loads, the workgroup one subgroup of WGX lanes on the
    same rows; the caller checks the subgroup size), else ignored; ``r16``: f32 operands
    rounded to f16 as they are read; ``v4``: C (f32) stored a quad at a time, which needs C's
    rows, offset and strides and the epilogue operands' offsets to be multiples of 4 (the
    caller checks them); ``rtex``: with v4, the residual read from a texture."""
    if tn % 4 or (tm % 4 and not flat) or (flat and (tm != 1 or wgx != 1)):
        raise ValueError(f"CPU matmul block {tm}x{tn} (flat={flat}) is not a supported shape")
    if tex and f16:
        raise ValueError("texture operands of the CPU matmul are f32 only")
    vec = am != 2 and bm != 2 and not (am == 1 and tm % 4)
    am, bm = (am, bm) if vec else (0, 0)
    # Texture loads compile to straight-line code, so every block size takes the 4-k body.
    k4 = vec and (tex or tm * tn < CPU_K1_BLOCK)
    sg = wgx if sg and tex and k4 and not flat and wgy == 1 and (
        tm % wgx == 0 if am == 0 else tm <= 4 * wgx) else 0
    t = "f16" if f16 else "f32"
    return Kernel.of("matmul_cpu", TM=tm, TN=tn, WGX=wgx, WGY=wgy, WG=wgx * wgy, VEC=int(k4),
                     FLAT=int(flat), T=t, F16=int(f16 or r16), ACC=int(acc),
                     LD=_load(r16, "f32"), OPERANDS=_operand_decls(t, tex),
                     SG_ARGS=",\n        @builtin(subgroup_invocation_id) lane: u32" if sg else "",
                     FIN=_fin_code(t, acc, epilogue, v4, rtex),
                     **_cpu_code(tm, tn, am, bm, vec, k4, t, sg, v4, epilogue[1]))


def _tex_operand(t: BufferView, slot: int, rows: int, cols: int, sb: int, nbatch: int,
                 inner: tuple = (1, 0)):
    """(texture view, offset) of operand ``t`` ([nbatch] x rows x cols, batch stride sb; with
    ``inner`` (n, stride) batch z at (z // n) * sb + (z % n) * stride) copied
    into the device's operand texture ``slot``: the elements the kernel reads, from the
    16-byte boundary at or below the first; offset: the first one's index there. None where
    that region does not fit (the texture's rows: TEX_W texels, at most
    max-texture-dimension-2d of them)."""
    st = (sb, inner[1], *t.strides[-2:])
    if min(st) < 0:
        return None
    first = t.offset
    last = first + sum((n - 1) * s for n, s in zip((nbatch // inner[0], *inner[:1], rows, cols),
                                                     st))
    start = first & ~3
    texels = (last - start) // 4 + 1
    rows_max = t.device.limits["max-texture-dimension-2d"]
    if start * 4 + texels * 16 > t.buffer.size or -(-texels // TEX_W) > rows_max:
        return None
    return t.device.operand_texture(slot, t.buffer, start * 4, texels), first - start


def _padded(t: BufferView, mode: int) -> tuple:
    """(operand, load mode): a 2-D f32 operand of load mode 2 that is a contiguous matrix or
    its transpose with rows of a length not a multiple of 4 ([128, 65] logits' gradient),
    as the same view of a copy whose rows are padded to quads, in mode 0 (its columns
    contiguous) or 1; else unchanged. The CPU kernel then loads it as quads: a K % 4 tail is
    read element-wise, and quads past M or N read the padding (never stored)."""
    if mode != 2 or t.dtype != float32:
        return t, mode
    (r, c), (sr, sc) = t.shape, t.strides
    flip = sc != 1  # the transpose of a contiguous matrix
    if (sc, sr) != ((1, c) if not flip else (r, 1)):
        return t, mode
    rows, cols = (c, r) if flip else (r, c)
    dev = t.device
    if 16 * rows * -(-cols // 4) > dev.max_binding:  # (t itself may just fit one)
        return t, mode
    key = (t.storage.version, t.offset, rows, cols, dev.recorder, dev.replays)
    got = _PADS.pop(t.storage, None)
    # A linear's backward pads its gradient once for d(x) and d(W): a pad serves the next
    # product that reads the same unchanged operand within PAD_REUSE dispatches, with no
    # replay in between (replays write buffers without a version bump) and in one capture.
    if got is None or got[0] != key or dev.dispatches - got[1] > PAD_REUSE:
        pad = View.empty((rows, -(-cols // 4) * 4), dev, float32)
        view = View(pad.storage, (rows, cols), (pad.shape[1], 1), 0, float32)
        run_map("a", view, [_transposed(t) if flip else t])
        _PADS[t.storage] = (key, dev.dispatches, view)
        got = (key, 0, view)
    return (_transposed(got[2]), 1) if flip else (got[2], 0)


def _transposed(t: BufferView) -> View:
    """The transpose of 2-D ``t`` as a plain view (a kernel operand: no autograd)."""
    return View(t.storage, t.shape[::-1], t.strides[::-1], t.offset, t.dtype)


_PADS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage -> its pad, unused
PAD_REUSE = 2


def plan(a, am, b, bm, M, N, K, nbatch) -> tuple:
    """(a, am, b, bm, tile): the block for this product, with mode-2 operands of a product
    big enough for texture reads copied into quad-padded rows (_padded)."""
    tex = use_cpu_textures(a.device, a.dtype == float16, nbatch * M * N * K)
    if tex and nbatch == 1 and (am == 2 or bm == 2):  # (a vocabulary of 65: the lm head)
        (a, am), (b, bm) = _padded(a, am), _padded(b, bm)
    tile = _cpu_tile(M, N, nbatch, tex, tex and am != 2 and cpu_subgroup(a.device) == CPU_TEX_WG)
    return a, am, b, bm, tile


def launch(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile, r16,
           inner=(1, 0, 0), cst=None, res=None):
    """C = A @ B (+ epilogue ``epi``) in ``tile``'s blocks (_cpu_tile); bufs / extra: the
    bindings and offsets of kernels/matmul.py's launch."""
    # Under the device lock: another thread's matmul must not refill the operand textures
    # between this one's copies and its dispatches.
    with a.device.lock:
        _launch_locked(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile,
                       r16, inner, cst, res)


def _launch_locked(a, b, out, M, N, K, sa, sb, nbatch, am, bm, bufs, extra, epi, tile,
                   r16, inner=(1, 0, 0), cst=None, res=None):
    tm, tn, wgx, wgy, flat = tile[:5]
    f16 = a.dtype == float16
    words = [M, N, K, a.offset, sa, a.strides[-2], a.strides[-1], b.offset, sb,
             b.strides[-2], b.strides[-1], out.offset]
    tex = use_cpu_textures(a.device, f16, nbatch * M * N * K) if len(tile) < 6 else (
        tile[5] and not f16)
    if tex:
        ta = _tex_operand(a, 0, M, K, sa, nbatch, inner[:2])
        tb = ta and _tex_operand(b, 1, K, N, sb, nbatch, inner[::2])
        tex = tb is not None
        if tex:
            bufs = [ta[0], tb[0]] + bufs[2:]
            words[3], words[7] = ta[1], tb[1]
    sg = tex and (tile[6] if len(tile) > 6 else True) and cpu_subgroup(a.device) == wgx
    cst = cst or (inner[0] * M * N, M * N, N)  # C's outer / inner batch and row strides
    v4 = TUNING.matmul_quad_stores is not False and not f16 and N % 4 == 0 and all(
        w % 4 == 0 for w in (out.offset, *cst, *extra))
    # the residual ([M, N], contiguous) through a texture too (slot 2), with quad stores
    view = (res is not None and v4 and tex and texture.enabled(a.device)
            and texture.operand(res, 2, M * N))
    if view:
        bufs, extra = bufs[:3 + epi[1]] + [view] + bufs[4 + epi[1]:], [extra[0], 0]
    k = cpu_kernel_for(tm, tn, wgx, wgy, am, bm, flat, f16=f16, epilogue=epi, tex=tex, sg=sg,
                       r16=r16, v4=v4, rtex=bool(view))
    gx, gy = -(-N // (tn * wgx)), -(-M // (tm * wgy))
    if gx > MAX_WG_PER_DIM or (gy > MAX_WG_PER_DIM and not flat):
        raise ShapeError(f"matmul output {M}x{N} is too large for one dispatch")
    rows, bound = nbatch * M, bufs
    span = CPU_KPASS[dict(k.defines)["VEC"] == "1"]
    for kb in range(0, K, span):  # bound over K: under llvmpipe's loop cap, adding up in C
        if K > span:  # the first pass stores, later ones add; the epilogue runs in the last
            last = kb + span >= K
            k = cpu_kernel_for(tm, tn, wgx, wgy, am, bm, flat, f16=f16, acc=kb > 0,
                               epilogue=epi if last else (None, False, False), tex=tex, sg=sg,
                               r16=r16, v4=v4, rtex=bool(view) and last)
            bound = bufs if last else bufs[:3]
        ks = [kb, min(K, kb + span)]
        if flat:
            fx, fy, _ = groups_1d(rows, wgy)
            a.device.dispatch(k, bound, words + [0, *extra, rows, *ks, *inner, *cst],
                              (fx, fy, gx))
            continue
        for z0 in range(0, nbatch, MAX_WG_PER_DIM):
            gz = min(MAX_WG_PER_DIM, nbatch - z0)
            a.device.dispatch(k, bound, words + [z0, *extra, 0, *ks, *inner, *cst],
                              (gx, gy, gz))
