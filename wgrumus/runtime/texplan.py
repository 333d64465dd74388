"""Where a replay copies operands into textures (CPU adapters).

A capture records each buffer-to-texture copy right before the kernel that reads the texture,
as eager work runs it (``Device.operand_texture``: one shared texture per operand slot, refilled
for every kernel). Replayed that way, a step of ~85 dispatches ends its compute pass ~70 times
around ~280 copies, and on lavapipe every pass break and every copy between passes costs tens
of microseconds. ``plan`` rewrites a recording's ops so each operand gets a texture of the
replay's own and its copy moves back into a block of copies as early as its sources allow:
before the current pass unless a dispatch of that pass wrote a source buffer, in which case
the pass ends there. A replay then runs few passes, each after one block of copies (the quick
GPT step: 48 passes instead of 70, the fewest its dependencies allow, since every pass break
left is a copy of what the pass before wrote). Textures are shared between operands whose uses
do not overlap (interval allocation); a block fills at most BLOCK_BYTES of them.
"""
from __future__ import annotations

import wgpu

# Texture bytes a block of copies fills at most (then the pass breaks and later blocks reuse
# its textures): what a replay's own textures can take besides the device's buffers.
BLOCK_BYTES = 64 << 20


def _bytes(texture) -> int:
    return texture.size[0] * texture.size[1] * 16  # rgba32float


class _Operand:
    """One filling of a texture: its copy regions ("t" ops), the device texture it was made
    for (its size), the stages of its copy and of its last reader, and the replay's texture
    holding it."""
    __slots__ = ("regions", "texture", "first", "last", "own")

    def __init__(self, regions: list, texture, stage: int):
        self.regions, self.texture, self.first, self.last = regions, texture, stage, stage
        self.own = None


def plan(ops: list, texture_of: dict, new_texture) -> list:
    """``ops`` (capture.Recording.ops) with the texture copies grouped: each stage is a block
    of copies, then the dispatches of one pass; copies, host writes and host operations stay in
    place as stage boundaries. ``texture_of``: id(view) -> texture of the device's operand
    textures; ``new_texture(height)`` -> (texture, view), the replay's own."""
    stages, fill = [], {}  # id(texture) -> [[texture, regions...], its _Operand or None]
    copies, items, dirty = [], [], set()  # the open stage; dirty: ids of buffers its pass wrote
    operands = []

    def close():
        nonlocal copies, items, dirty
        if copies or items:
            stages.append((copies, items))
        copies, items, dirty = [], [], set()

    def place(fills: list) -> None:
        """Copies for the fillings not yet placed, in the open stage's block (after a pass
        break where a dispatch of the open pass wrote a source, or where the block's textures
        would pass BLOCK_BYTES)."""
        new = [f for f in fills if f[1] is None]
        if any(id(r[1]) in dirty for f in new for r in f[0][1:]) or copies and sum(
                _bytes(f[0][0]) for f in new) + sum(_bytes(o.texture) for o in copies) > \
                BLOCK_BYTES:
            close()
        for f in new:
            f[1] = _Operand(f[0][1:], f[0][0], len(stages))
            operands.append(f[1])
            copies.append(f[1])

    for op in ops:
        if op[0] == "t":
            key = id(op[4])
            if op[5] == 0 or fill[key][1] is not None:  # a new filling (row 0 first)
                fill[key] = [[op[4], *(fill[key][0][1:] if op[5] else ()), op], None]
            else:
                fill[key][0].append(op)
            continue
        if op[0] != "d":  # copies and host work stay in place: earlier fillings copy before
            place(list(fill.values()))
            close()
            stages.append(([], [op]))
            continue
        bufs = op[4]
        reads = [(i, fill[id(texture_of[id(b)])]) for i, b in enumerate(bufs)
                 if isinstance(b, wgpu.GPUTextureView)]
        place([f for _, f in reads])
        new = list(bufs)
        for i, f in reads:
            f[1].last = len(stages)
            new[i] = f[1]
        items.append((*op[:4], new, *op[5:]))
        written = op[8]
        dirty.update(id(b) for j, b in enumerate(bufs, 1)
                     if isinstance(b, wgpu.GPUBuffer) and (written is None or j in written))
    close()
    _allocate(operands, new_texture)
    out = []
    for copies, items in stages:
        for o in copies:
            out += [(*r[:4], o.own[0], *r[5:]) for r in o.regions]
        out += [op if op[0] != "d" else (*op[:4], tuple(
            b.own[1] if isinstance(b, _Operand) else b for b in op[4]), *op[5:])
            for op in items]
    return out


def _allocate(operands: list, new_texture) -> None:
    """A texture for every operand, shared by operands of one height whose stages (copy
    through last reader) do not overlap."""
    free: dict = {}  # height -> [(last stage, (texture, view))]
    for o in sorted(operands, key=lambda o: o.first):
        height = o.texture.size[1]
        pool = free.setdefault(height, [])
        k = next((k for k, (last, _) in enumerate(pool) if last < o.first), None)
        o.own = pool.pop(k)[1] if k is not None else new_texture(height)
        pool.append((o.last, o.own))
