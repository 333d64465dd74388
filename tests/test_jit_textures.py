"""wr.jit on CPU adapters with texture operands: captures record the matmuls' buffer-to-texture
copies where eager runs them (right before the kernels that read the textures), so replays use
the same texture kernels as eager and give the same losses (replays move the copies into
blocks: test_texplan.py)."""
import importlib

import numpy as np
import pytest
import wgpu
from test_jit import _batches, _same, _train

import wgrumus as wr
from wgrumus.runtime.replay import _TEX
from wgrumus.runtime.tuning import TUNING

pytestmark = pytest.mark.timeout(300)
mc = importlib.import_module("wgrumus.kernels.matmul_cpu")
jit_mod = importlib.import_module("wgrumus.jit")


@pytest.fixture
def textures(monkeypatch):
    """Texture operands for every f32 matmul (the tests' shapes are below CPU_TEX_MIN) and the
    recordings of the captures made meanwhile."""
    monkeypatch.setattr(TUNING, "cpu_matmul", True)
    monkeypatch.setattr(TUNING, "matmul_textures", True)
    recs = []
    orig = jit_mod.Replay
    monkeypatch.setattr(jit_mod, "Replay", lambda rec: (recs.append(rec), orig(rec))[1])
    return recs


def _tex_reads(op) -> list:
    return [b for b in op[4] if isinstance(b, wgpu.GPUTextureView)]


def _check_copies_before_reads(dev, rec) -> int:
    """Every dispatch that reads an operand texture comes after a copy into that texture made
    since the previous dispatch that read it (each matmul refills its textures, as eager
    does); returns how many dispatches read textures."""
    texture_of = {id(view): tex for tex, view in dev._textures.values()}
    fresh, reads = set(), 0
    for op in rec.ops:
        if op[0] == "t":
            fresh.add(id(op[4]))
        elif op[0] == "d" and _tex_reads(op):
            reads += 1
            for view in _tex_reads(op):
                tex = id(texture_of[id(view)])
                assert tex in fresh, "a replayed kernel would read a stale operand texture"
                fresh.discard(tex)
    return reads


@pytest.mark.parametrize("kind", ["mlp", "cnn", "gpt"])
def test_texture_replay_matches_eager(dev, rng, textures, kind):
    batches = _batches(kind, 5, 4, rng)
    eager = _train(kind, dev, batches, False)
    jitted = _train(kind, dev, batches, True)
    _same(eager, jitted)
    assert jitted[2].replays == 3 and len(textures) == 1
    assert _check_copies_before_reads(dev, textures[0]) > 0


def test_replay_encodes_texture_copies_between_passes(dev, rng, textures, monkeypatch):
    """The recording, as plain data: texture copies, each followed by the dispatch that reads
    it; the replay lowers them to copy segments (grouped before few passes: texplan.py),
    through wgpu-native's C calls and (without the raw copy) through wgpu-py's API, with the
    same losses. (The
    matmuls' copies: the other CPU kernels read storage here, TUNING.texture_reads False;
    test_texture_replay_matches_eager replays them all.)"""
    monkeypatch.setattr(TUNING, "texture_reads", False)
    batches = _batches("mlp", 4, 5, rng)
    eager = _train("mlp", dev, batches, False)
    raw = _train("mlp", dev, batches, True)
    monkeypatch.setattr(dev, "raw_copy", None)
    api = _train("mlp", dev, batches, True)
    _same(eager, raw)
    _same(eager, api)
    for rec, fn in zip(textures, (raw[2], api[2])):
        kinds = [op[0] for op in rec.ops]
        # forward 2 matmuls, backward 3 (no input gradient): 2 copies each
        assert kinds.count("t") == 10
        for i, k in enumerate(kinds):
            if k == "t":  # the copy's reader: the next dispatch, after the other operand's copy
                nxt = next(op for op in rec.ops[i + 1:] if op[0] == "d")
                assert _tex_reads(nxt)
        assert _check_copies_before_reads(dev, rec) == 5
        rep = next(iter(fn._captures.values())).replay_obj
        segs = [kind for kind, _ in rep._parts[0]]
        assert segs.count(_TEX) == 10
        assert (rep._raw is None) == (fn is api[2])


@pytest.mark.timeout(120)
def test_texture_replay_past_65535_workgroups(dev, rng, textures, monkeypatch):
    """A captured batched matmul past the per-dimension workgroup limit (z slices of 65,535)
    whose operands span many texture rows (TEX_W texels each): replays of new inputs match
    numpy."""
    monkeypatch.setattr(mc, "_cpu_tile", lambda *a: (4, 4, 1, 1, 0))
    f = wr.jit(lambda a, b: a @ b)
    for _ in range(4):
        an = rng.standard_normal((70_000, 4, 3)).astype(np.float32)
        bn = rng.standard_normal((70_000, 3, 4)).astype(np.float32)
        out = f(wr.tensor(an, device=dev), wr.tensor(bn, device=dev))
        np.testing.assert_allclose(out.numpy(), an @ bn, rtol=1e-5, atol=1e-5)
    assert f.replays == 2
    kinds = [op[0] for op in textures[0].ops]
    assert kinds.count("d") == 2 and kinds.count("t") >= 2
    assert max(op[6][2] for op in textures[0].ops if op[0] == "d") == 65_535
