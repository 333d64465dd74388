"""texplan: a replay's texture copies grouped before few passes (CPU adapters). Checked by
simulating what every dispatch reads from its textures (each copied region and the version of
its source buffer at the copy) in the recorded order and in the planned one, and by training
through replays planned and unplanned against eager."""
import pytest
import wgpu
from test_jit import _batches, _same, _train
from test_jit_textures import textures  # noqa: F401  (fixture)

from wgrumus.runtime import replay, texplan

pytestmark = pytest.mark.timeout(300)


def _reads(ops, texture_of) -> list:
    """Per dispatch, in order: what each texture it binds holds (the regions of the texture's
    latest filling, each with its source buffer's version at the copy)."""
    version, filling, out = {}, {}, []
    for op in ops:
        if op[0] == "t":
            src, so, bpr, tex, y, w, rows = op[1:]
            got = (id(src), so, bpr, y, w, rows, version.get(id(src), 0))
            filling[id(tex)] = ([] if y == 0 else filling[id(tex)]) + [got]
        elif op[0] == "d":
            out.append([tuple(filling[id(texture_of[id(b)])]) if isinstance(
                b, wgpu.GPUTextureView) else id(b) for b in op[4]])
            for j, b in enumerate(op[4], 1):
                if isinstance(b, wgpu.GPUBuffer) and (op[8] is None or j in op[8]):
                    version[id(b)] = version.get(id(b), 0) + 1
        elif op[0] in ("c", "w"):
            dst = op[3] if op[0] == "c" else op[1]
            version[id(dst)] = version.get(id(dst), 0) + 1
    return out


def _passes(ops) -> int:
    """Compute passes a replay of ``ops`` runs (runs of dispatches)."""
    return sum(op[0] == "d" and (i == 0 or ops[i - 1][0] != "d") for i, op in enumerate(ops))


def _plan(dev, ops):
    made = {}

    def new_texture(height):
        tv = dev.new_operand_texture(height)
        made[id(tv[1])] = tv[0]
        return tv
    texture_of = {id(v): t for t, v in dev._textures.values()}
    planned = texplan.plan(ops, texture_of, new_texture)
    return planned, {**texture_of, **made}


def _check(dev, ops):
    planned, texture_of = _plan(dev, ops)
    assert [op for op in planned if op[0] not in "dt"] == [op for op in ops if op[0] not in "dt"]
    assert [op[1] for op in planned if op[0] == "d"] == [op[1] for op in ops if op[0] == "d"]
    assert _reads(planned, texture_of) == _reads(ops, texture_of)
    return planned


def _op_d(bufs, written=frozenset({2})):
    return ("d", "pipe", "layout", True, tuple(bufs), b"", (1, 1, 1), None, written)


def _op_t(src, tex, y=0, rows=1):
    return ("t", src, y * 16384, 16384, tex, y, 1024, rows)


def test_plan_breaks_a_pass_only_where_a_source_was_written(dev):
    """Hand-made ops: copies whose sources no dispatch of the open pass wrote share one block;
    a copy of a buffer written in the open pass starts a new pass; a host write stays in place
    with the copies recorded before it ahead of it; a two-region filling moves whole."""
    a, b, c, d = (dev.alloc(1 << 16) for _ in range(4))
    (t0, v0), (t1, v1) = (dev.operand_texture(s, a, 0, 4) and dev._textures[(s, 1)]
                          for s in (0, 1))
    t2, v2 = dev.operand_texture(2, a, 0, 2048) and dev._textures[(2, 2)]
    dev.synchronize()
    ops = [_op_t(a, t0), _op_d([v0, b]), _op_t(c, t1), _op_d([v1, d]),  # one pass
           _op_t(b, t0), _op_d([v0, c]),  # b written in the open pass: a new one
           _op_t(a, t1), ("w", a, 0, b"\0" * 16), _op_d([v1, d]),  # the copy precedes the write
           _op_t(c, t2), _op_t(d, t2, 1), _op_d([v2, b]), _op_d([v0, c])]
    planned = _check(dev, ops)
    assert "".join(op[0] for op in planned) == "ttdd" "ttd" "w" "d" "ttdd"
    assert _passes(planned) == 4 < _passes(ops)
    two = [op for op in planned if op[0] == "t" and op[1] in (c, d) and op[5] in (0, 1)][-2:]
    assert [op[5] for op in two] == [0, 1] and two[0][4] is two[1][4]


def test_plan_shares_textures_between_operands_whose_uses_do_not_overlap(dev, monkeypatch):
    """Operands in use at once get textures of their own, later ones reuse them; a block of
    copies fills at most BLOCK_BYTES of textures (then the pass breaks)."""
    a, b = dev.alloc(1 << 16), dev.alloc(1 << 16)
    t0, v0 = dev.operand_texture(0, a, 0, 4) and dev._textures[(0, 1)]
    dev.synchronize()
    ops = [op for _ in range(6) for op in (_op_t(b, t0), _op_d([v0, a], frozenset({2})))]
    planned = _check(dev, ops)  # each dispatch writes a; copies of b: all in one block
    assert _passes(planned) == 1
    assert len({id(op[4]) for op in planned if op[0] == "t"}) == 6
    monkeypatch.setattr(texplan, "BLOCK_BYTES", 2 * t0.size[0] * 16)  # two textures a block
    planned = _check(dev, ops)
    assert "".join(op[0] for op in planned) == "ttdd" * 3
    assert len({id(op[4]) for op in planned if op[0] == "t"}) == 2
    chain = [op for _ in range(6) for op in (_op_t(a, t0), _op_d([v0, a]))]
    planned = _check(dev, chain)  # each copy reads what the last dispatch wrote
    assert _passes(planned) == 6
    assert len({id(op[4]) for op in planned if op[0] == "t"}) == 1


@pytest.mark.parametrize("kind", ["mlp", "gpt"])
def test_planned_replays_match_eager_and_unplanned(dev, rng, textures, monkeypatch, kind):  # noqa: F811
    """Training through planned replays gives the eager losses and weights, as unplanned
    replays do; the plan of the captured step reads what the recording read, in fewer
    passes."""
    batches = _batches(kind, 5, 4, rng)
    eager = _train(kind, dev, batches, False)
    planned = _train(kind, dev, batches, True)
    monkeypatch.setattr(replay, "GROUP_TEXTURES", False)
    plain = _train(kind, dev, batches, True)
    _same(eager, planned)
    _same(eager, plain)
    rec = textures[0]
    ops = _check(dev, rec.ops)
    assert _passes(ops) < _passes(rec.ops)
    assert sum(op[0] == "t" for op in ops) == sum(op[0] == "t" for op in rec.ops)
