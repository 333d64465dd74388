"""CPU-adapter variants of a training step's kernels (issue 20, fewer passes over memory):
the matmul epilogue that also stores the activation's argument (fused GELU-type linears),
against numpy, on whatever adapter runs the tests (the CPU kernel forced)."""
import importlib

import numpy as np
import pytest

import wgrumus as wr
from wgrumus.ops.matmul import linear_2d
from wgrumus.tensor import Tensor

mm = importlib.import_module("wgrumus.ops.matmul")  # (wgrumus.ops.matmul is also the function)

GELU_TANH = "gelu_tanh_({z})"


def _gelu_tanh(z):
    return 0.5 * z * (1 + np.tanh(np.sqrt(2 / np.pi) * (z + 0.044715 * z ** 3)))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("M,K,N,kpass", [(37, 13, 21, None), (5, 64, 8, None), (130, 7, 67, None),
                                         (9, 70, 12, (16, 16))])
@pytest.mark.parametrize("bias", [True, False])
def test_linear_pre_activation_store_matches_numpy(monkeypatch, rng, M, K, N, kpass, bias):
    """y = gelu(x @ wt + b) and pre = x @ wt + b from one CPU kernel, odd sizes; kpass: K in
    passes of 16 (the epilogue and the store run in the last pass only)."""
    monkeypatch.setattr(mm, "CPU_KERNEL", True)
    if kpass:
        monkeypatch.setattr(mm, "CPU_KPASS", kpass)
    x = rng.standard_normal((M, K)).astype(np.float32)
    wt = rng.standard_normal((K, N)).astype(np.float32)
    b = rng.standard_normal(N).astype(np.float32) if bias else None
    pre = Tensor.empty((M, N))
    y = linear_2d(wr.tensor(x), wr.tensor(wt), wr.tensor(b) if bias else None, None, GELU_TANH,
                  pre=pre)
    z = x.astype(np.float64) @ wt + (b if bias else 0)
    np.testing.assert_allclose(pre.numpy(), z, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y.numpy(), _gelu_tanh(z), rtol=1e-4, atol=1e-4)


def test_pre_activation_store_is_cpu_only(monkeypatch):
    monkeypatch.setattr(mm, "CPU_KERNEL", False)
    x = wr.ones((4, 4))
    with pytest.raises(ValueError, match="CPU-kernel epilogue only"):
        linear_2d(x, x, None, None, GELU_TANH, pre=Tensor.empty((4, 4)))
    with pytest.raises(ValueError, match="needs an activation"):
        mm._epilogue_defines(None, True, False, True)
