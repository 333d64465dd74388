"""What a PyTorch user types works: dim=/keepdim=, max(dim=) -> (values, indices), numel(),
t(), size(d), // and %, to(dtype) / to(device, dtype), .long(), masks from comparisons,
x[mask], the loss modules, wr.save of a tensor and checksummed checkpoints."""
import re
from pathlib import Path

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def a(rng):
    return rng.normal(size=(3, 4, 5)).astype(np.float32)


# ---------------------------------------------------------------------------- dim= / keepdim=
@pytest.mark.parametrize("name", ["sum", "mean", "var", "std"])
@pytest.mark.parametrize("dim", [None, 1, -1, (0, 2)])
@pytest.mark.parametrize("keepdim", [False, True])
def test_reductions_take_dim_and_keepdim(a, name, dim, keepdim):
    t = wr.tensor(a)
    want = getattr(np, name)(a, axis=dim, keepdims=keepdim)
    got = getattr(t, name)(dim=dim, keepdim=keepdim)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    alias = getattr(t, name)(axis=dim, keepdims=keepdim)  # the numpy names still work
    np.testing.assert_allclose(alias.numpy(), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(getattr(wr, name)(t, dim, keepdim).numpy(), want, rtol=1e-5,
                               atol=1e-5)


def test_dim_and_axis_together_is_an_error(a):
    with pytest.raises(TypeError, match="dim= or axis="):
        wr.tensor(a).sum(dim=0, axis=1)
    with pytest.raises(TypeError, match="dim= or axis="):
        wr.cat([wr.tensor(a)], dim=0, axis=1)


def test_var_correction_is_torch_unbiased(a):
    t = wr.tensor(a)
    np.testing.assert_allclose(t.var(dim=1, correction=1).numpy(), a.var(axis=1, ddof=1),
                               rtol=1e-5)
    np.testing.assert_allclose(t.std(dim=1, correction=1).numpy(), a.std(axis=1, ddof=1),
                               rtol=1e-5)


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_with_dim_return_values_and_indices(a, name, keepdim):
    t = wr.tensor(a)
    arg = np.argmax if name == "max" else np.argmin
    for dim in (0, 1, -1):
        out = getattr(t, name)(dim=dim, keepdim=keepdim)
        values, indices = out  # unpacks like torch.return_types.max
        assert out.values is values and out.indices is indices
        np.testing.assert_array_equal(values.numpy(),
                                      getattr(a, name)(axis=dim, keepdims=keepdim))
        np.testing.assert_array_equal(indices.numpy(), arg(a, axis=dim, keepdims=keepdim))
        assert indices.dtype == wr.int32
        pos = getattr(t, name)(dim, keepdim)  # positional dim, as x.max(1) in PyTorch
        np.testing.assert_array_equal(pos.indices.numpy(), indices.numpy())
    # no dim: the value; numpy's axis= and a tuple of dims: the values only
    assert getattr(t, name)().item() == pytest.approx(float(getattr(a, name)()))
    v = getattr(t, name)(axis=1)
    assert isinstance(v, wr.Tensor)
    np.testing.assert_array_equal(v.numpy(), getattr(a, name)(axis=1))
    np.testing.assert_array_equal(getattr(t, name)((0, 2)).numpy(),
                                  getattr(a, name)(axis=(0, 2)))
    # torch.max(a, b): elementwise
    b = np.flip(a, 0).copy()
    np.testing.assert_array_equal(getattr(wr, name)(t, wr.tensor(b)).numpy(),
                                  (np.maximum if name == "max" else np.minimum)(a, b))


def test_max_dim_values_gradient(rng):
    x = rng.permutation(12).reshape(3, 4) / 5.0  # distinct: no ties
    check_grad(lambda t: t.max(dim=1).values, lambda n: n.max(axis=1), [x])
    check_grad(lambda t: t.min(dim=0, keepdim=True)[0], lambda n: n.min(axis=0, keepdims=True),
               [x])


@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_argmax_argmin_dim(a, name):
    t = wr.tensor(a)
    ref = getattr(np, name)
    np.testing.assert_array_equal(getattr(t, name)(dim=2).numpy(), ref(a, axis=2))
    np.testing.assert_array_equal(getattr(t, name)(dim=0, keepdim=True).numpy(),
                                  ref(a, axis=0, keepdims=True))
    assert getattr(t, name)().item() == ref(a)


def test_joins_and_splits_take_dim(a):
    t = wr.tensor(a)
    np.testing.assert_array_equal(wr.cat([t, t], dim=1).numpy(), np.concatenate([a, a], 1))
    np.testing.assert_array_equal(wr.cat([t, t], axis=2).numpy(), np.concatenate([a, a], 2))
    np.testing.assert_array_equal(wr.stack([t, t], dim=-1).numpy(), np.stack([a, a], -1))
    np.testing.assert_array_equal(wr.stack([t, t], axis=1).numpy(), np.stack([a, a], 1))
    parts = t.split(2, dim=2)
    np.testing.assert_array_equal(parts[1].numpy(), a[:, :, 2:4])
    assert [p.shape[1] for p in t.chunk(2, dim=1)] == [2, 2]
    assert t.unsqueeze(dim=1).shape == (3, 1, 4, 5)
    assert t.unsqueeze(0).squeeze(dim=0).shape == (3, 4, 5)
    with pytest.raises(TypeError, match="unsqueeze needs"):
        t.unsqueeze()


# ------------------------------------------------------------------------ small tensor habits
def test_numel_t_size(a):
    t = wr.tensor(a)
    assert t.numel() == a.size and t.size() == a.shape and t.size(1) == 4 and t.size(-1) == 5
    m = wr.tensor(a[0])
    np.testing.assert_array_equal(m.t().numpy(), a[0].T)
    v = wr.tensor(a[0, 0])
    assert v.t() is v
    with pytest.raises(wr.ShapeError, match="transpose"):
        t.t()


def test_numel_is_called_as_a_method_everywhere():
    """numel() is a method: a property-style ``x.numel`` left anywhere (or merged in later)
    would compare a bound method with a number, silently."""
    pat = re.compile(r"\.numel\b(?!\s*\()")
    bad = []
    for folder in ("wgrumus", "benchmarks", "examples", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == Path(__file__).name:
                continue
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pat.search(line) and not re.search(r"\b(bucket|b1|self)\.numel\b", line):
                    bad.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not bad, "\n".join(bad)


FLOORDIV_CASES = [(7, 2), (-7, 2), (7, -2), (-7, -2), (6, 3), (-6, 3), (0, 5), (5, 7), (-5, 7)]


@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_floor_division_and_modulo_follow_python(dtype):
    """// floors and % takes the sign of the divisor (Python, numpy, torch.remainder), also
    for negative operands, tensor-tensor, tensor-scalar and scalar-tensor."""
    x = np.array([p for p, _ in FLOORDIV_CASES], dtype)
    y = np.array([q for _, q in FLOORDIV_CASES], dtype)
    tx, ty = wr.tensor(x, dtype=dtype), wr.tensor(y, dtype=dtype)
    np.testing.assert_array_equal((tx // ty).numpy(), x // y)
    np.testing.assert_array_equal((tx % ty).numpy(), x % y)
    np.testing.assert_array_equal((tx // 3).numpy(), x // dtype(3))
    np.testing.assert_array_equal((tx % -3).numpy(), x % dtype(-3))
    np.testing.assert_array_equal((17 // ty).numpy(), dtype(17) // y)
    np.testing.assert_array_equal((-17 % ty).numpy(), dtype(-17) % y)
    assert (tx // ty).dtype == dtype and (tx % 3).dtype == dtype
    assert [int(v) // w for v, w in FLOORDIV_CASES] == list((tx // ty).numpy().astype(int))


def test_integer_floor_division_is_exact_past_2_24_and_by_zero_gives_zero():
    x = np.array([2 ** 30 + 3, -(2 ** 30) - 3, 2 ** 31 - 1, -(2 ** 31), 5], np.int32)
    y = np.array([7, 7, -3, 3, 0], np.int32)
    q, r = (wr.tensor(x) // wr.tensor(y)).numpy(), (wr.tensor(x) % wr.tensor(y)).numpy()
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(q, x // y)  # numpy: x // 0 == 0 for integers
        np.testing.assert_array_equal(r, x % y)


def test_remainder_gradient(rng):
    x = rng.uniform(0.1, 0.9, size=(2, 3)) + rng.integers(-3, 3, size=(2, 3))
    y = rng.uniform(1.2, 1.8, size=(2, 3))
    check_grad(lambda p, q: p % q, lambda p, q: p - q * np.floor(p / q), [x, y])
    # floor division is piecewise constant: no gradient flows through it
    t = wr.tensor(x.astype(np.float32), requires_grad=True)
    assert not (t // 2.0).requires_grad


def test_to_dtype_and_device(devs, a):
    t = wr.tensor(a)
    assert t.to(wr.int32).dtype == wr.int32
    np.testing.assert_array_equal(t.to(wr.int32).numpy(), a.astype(np.int32))
    assert t.to("int32").dtype == wr.int32 and t.to(dtype=wr.int32).dtype == wr.int32
    moved = t.to(devs[1], wr.int32)
    assert moved.device is devs[1] and moved.dtype == wr.int32
    assert t.to(devs[1]).device is devs[1] and t.to(device=1).device is devs[1]
    other = wr.zeros((1,), device=devs[2], dtype=wr.int32)
    assert t.to(other).device is devs[2] and t.to(other).dtype == wr.int32
    assert t.to(wr.float32) is t and t.to(t.device) is t
    assert t.long().dtype == wr.int32 and t.int().dtype == wr.int32  # no int64 on WebGPU
    assert t.int().float().dtype == wr.float32
    with pytest.raises(TypeError, match="float64"):
        t.double()
    if "shader-f16" in t.device.features:
        h = t.to(wr.float16)
        assert h.dtype == wr.float16 and t.half().dtype == wr.float16
        np.testing.assert_allclose(h.numpy(), a.astype(np.float16))
    for habit in ("cuda", "cuda:1", "cpu"):  # each error points to wr.devices()
        with pytest.raises(TypeError, match=r"device='.*': .*wr.Device or an index into "
                                            r"wr.devices\(\)"):
            t.to(habit)
    with pytest.raises(TypeError, match=r"device='cuda'.*wr.devices\(\)"):
        wr.zeros((2,), device="cuda")


def test_comparisons_are_masks_for_where_and_indexing(a):
    t = wr.tensor(a)
    for m, ref in ((t > 0.5, a > 0.5), (t <= 0, a <= 0), (t == t, a == a), (t.ne(0.5), a != .5),
                   (t.bool(), a != 0)):
        np.testing.assert_array_equal(m.numpy(), ref.astype(np.float32))
    np.testing.assert_array_equal(wr.where(t > 0, t, 0.0).numpy(), np.where(a > 0, a, 0))


def test_boolean_mask_indexing(a):
    t = wr.tensor(a)
    np.testing.assert_array_equal(t[t > 0.5].numpy(), a[a > 0.5])  # all dims: 1-D result
    rows = a[:, 0, 0] > 0
    sel = t[t[:, 0, 0] > 0]  # a mask over the first dim picks rows
    assert sel.shape == (int(rows.sum()), 4, 5)
    np.testing.assert_array_equal(sel.numpy(), a[rows])
    np.testing.assert_array_equal(t[a > 0].numpy(), a[a > 0])  # numpy bool arrays too
    assert t[t > 100].shape == (0,)
    # an int32 index gathers rows, as in PyTorch (so mask.int() is not a mask)
    small = wr.tensor(a[:, 0, :2])
    np.testing.assert_array_equal(small[(small > 0).int()].numpy(),
                                  a[:, 0, :2][(a[:, 0, :2] > 0).astype(int)])
    with pytest.raises(IndexError, match="read as a mask"):
        t[t * 2.0]
    with pytest.raises(IndexError, match="does not match"):
        t[wr.tensor(np.ones(4, np.float32))]
    with pytest.raises(IndexError, match=r"np.array\(mask\)"):
        t[[True, False, True]]


def test_boolean_mask_select_gradient(rng):
    x = rng.normal(size=(4, 3))
    mask = x[:, 0] > 0
    mask[0] = True
    check_grad(lambda p: p[wr.tensor(mask.astype(np.float32))], lambda p: p[mask], [x])


def test_boolean_mask_assignment(rng):
    x = rng.normal(size=(4, 5)).astype(np.float32)
    t = wr.tensor(x)
    t[t < 0] = 0.0
    np.testing.assert_array_equal(t.numpy(), np.where(x < 0, 0, x))
    ti = wr.tensor(np.arange(-4, 4, dtype=np.int32) * 2 ** 25)  # int32 stays exact
    ti[ti > 0] = wr.tensor(np.full(8, 2 ** 30 + 1, np.int32))
    ref = np.arange(-4, 4) * 2 ** 25
    np.testing.assert_array_equal(ti.numpy(), np.where(ref > 0, 2 ** 30 + 1, ref))


def test_mask_select_past_65535_rows():
    n = 70_001
    x = np.arange(n, dtype=np.float32)
    t = wr.tensor(x)
    np.testing.assert_array_equal(t[t % 2.0 == 1.0].numpy(), x[x % 2 == 1])


# ----------------------------------------------------------------------------- loss modules
def test_cross_entropy_loss_module(rng):
    logits = rng.normal(size=(6, 4)).astype(np.float32)
    target = np.array([0, 3, 1, 1, -100, 2], np.int32)
    lt, tt = wr.tensor(logits), wr.tensor(target)
    lp = logits - np.log(np.exp(logits).sum(1, keepdims=True))
    keep = target != -100
    per = -lp[np.arange(6)[keep], target[keep]]
    assert nn.CrossEntropyLoss()(lt, tt).item() == pytest.approx(per.mean(), rel=1e-5)
    assert nn.CrossEntropyLoss(reduction="sum")(lt, tt).item() == pytest.approx(per.sum(),
                                                                                  rel=1e-5)
    none = nn.CrossEntropyLoss(reduction="none")(lt, tt).numpy()
    np.testing.assert_allclose(none[keep], per, rtol=1e-5)
    smooth = nn.CrossEntropyLoss(label_smoothing=0.1)(lt, tt).item()
    assert smooth == pytest.approx(
        nn.functional.cross_entropy(lt, tt, label_smoothing=0.1).item())
    # [N, C, d] logits with [N, d] targets, as PyTorch takes them
    t2 = np.where(keep, target, 0).astype(np.int32)
    seq = nn.CrossEntropyLoss(ignore_index=0)(
        wr.tensor(logits.reshape(2, 3, 4).transpose(0, 2, 1).copy()), wr.tensor(t2.reshape(2, 3)))
    assert seq.item() == pytest.approx(-lp[np.arange(6), t2][t2 != 0].mean(), rel=1e-5)
    # class weights (test_ops_torch_losses checks unequal ones): all ones is the plain loss
    assert nn.CrossEntropyLoss(weight=wr.ones(4))(lt, tt).item() == pytest.approx(
        per.mean(), rel=1e-5)
    assert isinstance(nn.CrossEntropyLoss(), nn.Module)


def test_mse_loss_module(rng):
    x, y = rng.normal(size=(2, 3, 4)).astype(np.float32), rng.normal(size=(3, 4))
    tx = wr.tensor(x, requires_grad=True)
    loss = nn.MSELoss()(tx, wr.tensor(y))
    assert loss.item() == pytest.approx(((x - y) ** 2).mean(), rel=1e-5)
    loss.backward()
    np.testing.assert_allclose(tx.grad.numpy(), 2 * (x - y) / x.size, rtol=1e-5)
    assert nn.MSELoss(reduction="sum")(tx, wr.tensor(y)).item() == pytest.approx(
        ((x - y) ** 2).sum(), rel=1e-5)
    assert nn.MSELoss(reduction="none")(tx, wr.tensor(y)).shape == x.shape
    with pytest.raises(ValueError, match="reduction"):
        nn.MSELoss(reduction="avg")(tx, wr.tensor(y))


# ------------------------------------------------------------------------------ save / load
def test_save_a_tensor_or_a_dict(tmp_path, a):
    t = wr.tensor(a)
    wr.save(t, tmp_path / "t.safetensors")
    back = wr.load(tmp_path / "t.safetensors")
    assert isinstance(back, wr.Tensor)
    np.testing.assert_array_equal(back.numpy(), a)
    wr.save({"w": t, "i": t.int()}, tmp_path / "d.safetensors")
    d = wr.load(tmp_path / "d.safetensors")
    assert set(d) == {"w", "i"} and d["i"].dtype == wr.int32
    np.testing.assert_array_equal(d["w"].numpy(), a)
    from safetensors.numpy import load_file  # a standard safetensors file
    np.testing.assert_array_equal(load_file(tmp_path / "d.safetensors")["w"], a)
    with pytest.raises(wr.WgrumusError, match="tensor or a dict"):
        wr.save([t], tmp_path / "l.safetensors")


def test_corrupt_tensor_data_is_an_error_on_load(tmp_path, a):
    from safetensors import safe_open

    from wgrumus.io import CHECKSUM_KEY, CheckpointError
    path = tmp_path / "m.safetensors"
    model = nn.Linear(5, 3)
    wr.save(model.state_dict(), path)
    with safe_open(path, "numpy") as f:
        assert len(f.metadata()[CHECKSUM_KEY]) == 64
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # one bit of a weight
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        wr.load(path)
    with pytest.raises(CheckpointError, match="corrupt"):
        model.load_state_dict(wr.load(path))
    # a file written elsewhere (no checksum) still loads
    from safetensors.numpy import save_file
    save_file({"w": a}, tmp_path / "plain.safetensors")
    np.testing.assert_array_equal(wr.load(tmp_path / "plain.safetensors")["w"].numpy(), a)


def test_files_of_the_earlier_checksum_still_load_and_are_checked(tmp_path, a):
    """Earlier files carry the sha256 of the whole tensor data region (under another key)."""
    import hashlib

    from safetensors.numpy import save

    from wgrumus.io import OLD_CHECKSUM_KEY, CheckpointError
    arrays = {"w": a, "b": np.arange(3, dtype=np.float32)}
    region = save(arrays)[-sum(x.nbytes for x in arrays.values()):]
    data = save(arrays, metadata={OLD_CHECKSUM_KEY: hashlib.sha256(region).hexdigest()})
    path = tmp_path / "old.safetensors"
    path.write_bytes(data)
    np.testing.assert_array_equal(wr.load(path)["w"].numpy(), a)
    bad = bytearray(data)
    bad[-1] ^= 0x01
    path.write_bytes(bytes(bad))
    with pytest.raises(CheckpointError, match="corrupt"):
        wr.load(path)


def test_training_checkpoint_carries_a_checksum(tmp_path):
    from wgrumus.io import CheckpointError
    model = nn.Linear(4, 2)
    opt = wr.optim.Adam(model.parameters(), lr=1e-2)
    path = tmp_path / "ck.safetensors"
    wr.save_checkpoint(path, model, opt, step=3)
    assert wr.load_checkpoint(path, nn.Linear(4, 2), restore_rng=False)["step"] == 3
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        wr.load_checkpoint(path, nn.Linear(4, 2))


@pytest.mark.timeout(120)
def test_readme_example_runs_with_dim_and_with_the_numpy_aliases(tmp_path):
    """README's ten lines use dim=/keepdim=; the same lines with axis=/keepdims= learn the
    same (test_cli runs the README text itself)."""
    import subprocess
    import sys
    text = (ROOT / "README.md").read_text()
    start = text.index("```python", text.index("## About ten lines of Python")) + len("```python")
    code = text[start:text.index("```", start)]
    assert "dim=1, keepdim=True" in code
    losses = []
    for variant in (code, code.replace("dim=1, keepdim=True", "axis=1, keepdims=True")):
        script = tmp_path / "example.py"
        script.write_text(variant)
        p = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                           timeout=110, cwd=ROOT, env={**__import__("os").environ,
                                                       "PYTHONPATH": str(ROOT)})
        assert p.returncode == 0, p.stderr
        losses.append(float(p.stdout.split()[1]))
    assert losses[0] == losses[1] and losses[0] < 0.15


def test_readme_compatibility_table_names_exist():
    """The names README's "Coming from PyTorch" table says exist do exist."""
    text = (ROOT / "README.md").read_text()
    assert "## Coming from PyTorch" in text
    for name in ("sum", "mean", "max", "min", "argmax", "argmin", "var", "std", "numel", "size",
                 "dim", "t", "view", "reshape", "permute", "transpose", "split", "chunk",
                 "squeeze", "unsqueeze", "to", "float", "half", "int", "long", "bool", "double",
                 "backward", "softmax", "log_softmax", "__floordiv__", "__mod__"):
        assert callable(getattr(wr.Tensor, name)), name
    for name in ("tensor", "zeros", "ones", "full", "arange", "rand", "randn", "manual_seed",
                 "cat", "stack", "where", "save", "load", "no_grad", "max", "min"):
        assert callable(getattr(wr, name)), name
    for name in ("CrossEntropyLoss", "MSELoss", "Linear", "Conv2d", "LayerNorm", "Embedding"):
        assert issubclass(getattr(nn, name), nn.Module), name
    assert not hasattr(wr.Tensor, "cuda")  # "do not exist"
