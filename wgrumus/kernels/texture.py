"""Read-only operands of CPU-adapter kernels through textures (issue 20).

llvmpipe 22.3 reads storage with a branch per lane and component (~7 ns a float), while a
``textureLoad`` is one 16-byte load a lane: 256K floats took 0.35 ms with the copy into the
texture against 1.85 ms from storage. So read-heavy CPU kernels take their inputs as copies in
the device's operand textures, quad q at texel (q % TEX_W, q / TEX_W).
"""
from __future__ import annotations

from ..runtime.buffer_view import float32
from ..runtime.device import TEX_W, texture_loader
from ..runtime.profile import profile
from ..runtime.tuning import TUNING


def enabled(dev) -> bool:
    """Whether read-heavy kernels on ``dev`` take their operands through textures (CPU
    adapters; TUNING.texture_reads forces it)."""
    on = TUNING.texture_reads
    return profile(dev).cpu if on is None else on


def decls(names: dict, tex: bool, vt: str = "vec4<f32>", elements: bool = False) -> str:
    """WGSL declarations of operands {name: binding} with quad loads ``ld_<name>(q)`` from
    textures (``tex``) or ``vt`` arrays; ``elements``: also ``ex_<name>(i)``."""
    if tex:
        out = [texture_loader(n, b, f"ld_{n}") for n, b in names.items()]
    else:
        out = [f"@group(0) @binding({b}) var<storage, read> {n}: array<{vt}>;\n"
               f"fn ld_{n}(q: u32) -> {vt} {{ return {n}[q]; }}" for n, b in names.items()]
    if elements:
        out += [f"fn ex_{n}(i: u32) -> f32 {{ return "
                + (f"ld_{n}(i >> 2u)[i & 3u]; }}" if tex else f"ld_{n}(i); }}") for n in names]
    return "\n".join(out)


def operand(t, slot: int, n: int):
    """A view of operand texture ``slot`` holding n elements of f32 ``t`` (offset a multiple
    of 4), or None where it does not fit. Call under the device lock with the dispatch that
    reads it (the next call for the slot refills the texture)."""
    got = elements(t, slot, n) if t.offset % 4 == 0 else None
    return got and got[0]


def elements(t, slot: int, n: int):
    """(view, shift) as ``operand`` for any offset: the texture starts at the 16-byte boundary
    at or below t.offset, which is element ``shift`` there; None where it does not fit."""
    if t.dtype != float32 or n <= 0:
        return None
    start = t.offset & ~3
    texels = -(-(t.offset - start + n) // 4)
    buf = t.buffer
    rows_max = t.device.limits["max-texture-dimension-2d"]
    if start * 4 + texels * 16 > buf.size or -(-texels // TEX_W) > rows_max:
        return None
    return t.device.operand_texture(slot, buf, start * 4, texels), t.offset - start
