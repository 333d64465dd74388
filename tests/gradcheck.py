"""Finite-difference gradient checks shared by the op tests.

``check_grad(wr_fn, np_fn, inputs)`` compares wgrumus' autograd gradient of
``sum(wr_fn(*tensors) * w)`` with central differences of the float64 numpy reference
``np_fn`` (w is a fixed random weighting, so every output element matters).
"""
from __future__ import annotations

import numpy as np

import wgrumus as wr


def numeric_grad(f, xs, i, eps=1e-3):
    """d f(*xs) / d xs[i] by central differences in float64; f returns a scalar."""
    x = np.array(xs[i], dtype=np.float64)
    g = np.zeros_like(x)
    it = np.nditer(x, flags=["multi_index"])
    for _ in it:
        idx = it.multi_index
        orig = x[idx]
        args = list(xs)
        x[idx] = orig + eps
        args[i] = x.copy()
        fp = f(*args)
        x[idx] = orig - eps
        args[i] = x.copy()
        fm = f(*args)
        x[idx] = orig
        g[idx] = (fp - fm) / (2 * eps)
    return g


def check_grad(wr_fn, np_fn, inputs, device=None, rtol=2e-2, atol=2e-3, eps=1e-3,
               grad_of=None, seed=0):
    """Assert autograd gradients of every input in ``grad_of`` (default: all) match numpy."""
    inputs = [np.asarray(x, dtype=np.float64) for x in inputs]
    grad_of = range(len(inputs)) if grad_of is None else grad_of
    ts = [wr.tensor(x.astype(np.float32), device=device, requires_grad=(k in grad_of))
          for k, x in enumerate(inputs)]
    out = wr_fn(*ts)
    ref = np.asarray(np_fn(*inputs), dtype=np.float64)
    assert tuple(out.shape) == ref.shape, (out.shape, ref.shape)
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-4, atol=1e-5)
    w = np.random.default_rng(seed).uniform(0.5, 1.5, ref.shape)
    loss = (out * wr.tensor(w.astype(np.float32), device=out.device)).sum()
    store = wr.autograd.backward(loss)

    def f(*xs):
        return float(np.sum(np.asarray(np_fn(*xs), dtype=np.float64) * w))
    for k in grad_of:
        num = numeric_grad(f, inputs, k, eps)
        got = store.get(ts[k])
        got = np.zeros_like(num) if got is None else got.numpy()
        np.testing.assert_allclose(got, num, rtol=rtol, atol=atol,
                                   err_msg=f"gradient of input {k}")
    return store
