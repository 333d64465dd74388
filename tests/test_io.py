"""Checkpoints: safetensors round trips and interop, atomic writes under a simulated crash,
clear errors for corrupt files and wrong shapes, and training checkpoints that resume to the
same losses as an uninterrupted run."""
import json
import os
import struct

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

import wgrumus as wr
from wgrumus import io as wio
from wgrumus import nn, optim
from wgrumus.data import DataLoader, TensorDataset
from wgrumus.nn import functional as F


def test_save_load_roundtrip_and_safetensors_interop(tmp_path, devs):
    m = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    path = tmp_path / "m.safetensors"
    wr.save(m.state_dict(), path)
    ref = {k: v.numpy() for k, v in m.state_dict().items()}
    arrays = load_file(str(path))  # readable by the safetensors reference reader
    assert set(arrays) == set(ref)
    for k in ref:
        np.testing.assert_array_equal(arrays[k], ref[k])
    loaded = wr.load(path, device=devs[1])
    assert all(t.device is devs[1] for t in loaded.values())
    m2 = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    m2.load_state_dict(loaded)
    for k, v in m2.state_dict().items():
        np.testing.assert_array_equal(v.numpy(), ref[k])


def test_pytorch_named_file_loads_into_sequential(tmp_path, rng):
    """A state_dict as PyTorch names it (written here with numpy; int64 and float64 too)."""
    sd = {"0.weight": rng.standard_normal((5, 4)).astype(np.float32),
          "0.bias": rng.standard_normal(5).astype(np.float32),
          "2.weight": rng.standard_normal((2, 5)),  # float64
          "2.bias": rng.standard_normal(2).astype(np.float32),
          "3.running_mean": np.zeros(2, np.float32), "3.running_var": np.ones(2, np.float32),
          "3.weight": np.ones(2, np.float32), "3.bias": np.zeros(2, np.float32),
          "3.num_batches_tracked": np.array(7, np.int64)}
    path = str(tmp_path / "torch.safetensors")
    save_file(sd, path)
    m = nn.Sequential(nn.Linear(4, 5), nn.ReLU(), nn.Linear(5, 2), nn.BatchNorm2d(2))
    m.load_state_dict(wr.load(path))
    np.testing.assert_array_equal(m[0].weight.numpy(), sd["0.weight"])
    np.testing.assert_allclose(m[2].weight.numpy(), sd["2.weight"], rtol=1e-7)
    assert int(m[3].num_batches_tracked.item()) == 7
    x = rng.standard_normal((3, 4)).astype(np.float32)
    out = m[2](m[1](m[0](wr.tensor(x)))).numpy()
    ref = np.maximum(x @ sd["0.weight"].T + sd["0.bias"], 0) @ sd["2.weight"].T + sd["2.bias"]
    np.testing.assert_allclose(out, ref, rtol=1e-4, atol=1e-5)


def test_wrong_shapes_and_corrupt_files_are_clear_errors(tmp_path):
    path = tmp_path / "w.safetensors"
    wr.save({"weight": np.zeros((3, 4), np.float32), "bias": np.zeros(3, np.float32)}, path)
    with pytest.raises(nn.StateDictError, match=r"weight: checkpoint has shape \(3, 4\)"):
        nn.Linear(5, 3).load_state_dict(wr.load(path))
    data = path.read_bytes()
    bad = tmp_path / "truncated.safetensors"
    bad.write_bytes(data[:40])
    with pytest.raises(wio.CheckpointError, match="truncated or corrupt"):
        wr.load(bad)
    hlen = struct.unpack("<Q", data[:8])[0]
    garbled = bytearray(data)
    garbled[8:8 + 5] = b"#####"
    bad.write_bytes(bytes(garbled))
    with pytest.raises(wio.CheckpointError, match="truncated or corrupt .*JSON"):
        wr.load(bad)
    bad.write_bytes(b"abc")
    with pytest.raises(wio.CheckpointError, match="not a safetensors file"):
        wr.load(bad)
    # valid JSON, but offsets outside the data
    hdr = json.dumps({"w": {"dtype": "F32", "shape": [100], "data_offsets": [0, 400]}}).encode()
    bad.write_bytes(struct.pack("<Q", len(hdr)) + hdr + b"\0" * 8)
    with pytest.raises(wio.CheckpointError, match="not a valid safetensors file"):
        wr.load(bad)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        wr.load(tmp_path / "missing.safetensors")
    assert hlen > 0


def test_atomic_write_keeps_previous_file_on_failure(tmp_path, monkeypatch):
    path = tmp_path / "ckpt.safetensors"
    wr.save({"a": np.arange(4, dtype=np.float32)}, path)
    before = path.read_bytes()

    def crash(*a, **k):
        raise OSError("simulated crash before the rename")
    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError, match="simulated crash"):
        wr.save({"a": np.zeros(1000, np.float32)}, path)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(os.listdir(tmp_path)) == ["ckpt.safetensors"]  # no temporary file left

    def crash_write(*a, **k):
        raise MemoryError("simulated failure while serialising")
    monkeypatch.setattr(wio, "_serialize", crash_write)
    with pytest.raises(MemoryError):
        wr.save({"a": np.zeros(3, np.float32)}, path)
    monkeypatch.undo()
    np.testing.assert_array_equal(load_file(str(path))["a"], np.arange(4, dtype=np.float32))


# ----------------------------------------------------------------------------- training checkpoints
def _setup(seed=0):
    wr.manual_seed(seed)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.3), nn.Linear(16, 3))
    opt = optim.AdamW(model.parameters(), lr=0.02)
    sched = optim.lr_scheduler.CosineAnnealingLR(opt, T_max=6, warmup_steps=2)
    rng = np.random.default_rng(0)
    ds = TensorDataset(rng.standard_normal((40, 6)).astype(np.float32),
                       rng.integers(0, 3, 40).astype(np.int32))
    loader = DataLoader(ds, batch_size=8, shuffle=True, seed=3, prefetch=2)
    return model, opt, sched, loader


def _train(model, opt, sched, loader, steps):
    losses = []
    while len(losses) < steps:
        it = iter(loader)
        for x, y in it:
            loss = F.cross_entropy(model(wr.tensor(x)), wr.tensor(y))
            opt.step(wr.autograd.backward(loss))
            sched.step()
            losses.append(loss.item())
            if len(losses) == steps:
                it.close()
                break
    return losses


@pytest.mark.timeout(120)
def test_resume_gives_identical_losses(tmp_path):
    full = _train(*_setup(), 8)
    model, opt, sched, loader = _setup()
    first = _train(model, opt, sched, loader, 3)
    path = tmp_path / "train.safetensors"
    wr.save_checkpoint(path, model, opt, sched, step=3, extra={"note": "hi", "ema": np.ones(2)},
                       data_loader=loader)
    wr.manual_seed(999)  # scramble everything the checkpoint must restore
    model2, opt2, sched2, loader2 = _setup(seed=5)
    info = wr.load_checkpoint(path, model2, opt2, sched2, data_loader=loader2)
    assert info["step"] == 3 and info["extra"]["note"] == "hi"
    np.testing.assert_array_equal(info["extra"]["ema"], np.ones(2))
    rest = _train(model2, opt2, sched2, loader2, 5)
    assert first + rest == full
    arrays = load_file(str(path))  # a plain safetensors file underneath
    assert "model.0.weight" in arrays and "optimizer.state.0.exp_avg" in arrays


def test_load_checkpoint_errors(tmp_path):
    model, opt, sched, _ = _setup()
    plain = tmp_path / "plain.safetensors"
    wr.save(model.state_dict(), plain)
    with pytest.raises(wio.CheckpointError, match="not a wgrumus training checkpoint"):
        wr.load_checkpoint(plain, model)
    ck = tmp_path / "ck.safetensors"
    wr.save_checkpoint(ck, model, step=1)
    with pytest.raises(wio.CheckpointError, match="no optimizer state"):
        wr.load_checkpoint(ck, model, opt)
    other = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 3))
    with pytest.raises(nn.StateDictError, match="shape mismatch"):
        wr.load_checkpoint(ck, other)
