"""Activation checkpointing: the same gradients as the plain run, activations not kept."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn
from wgrumus.autograd import backward
from wgrumus.utils import checkpoint


def _grads(model, idx, tgt, ckpt):
    model.checkpoint = ckpt
    logits = model(idx)
    loss = nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.reshape(-1))
    store = backward(loss)
    return loss.item(), {n: store.get(p).numpy() for n, p in model.named_parameters()}


@pytest.mark.timeout(120)
def test_gpt_checkpointed_blocks_give_the_plain_gradients(dev):
    model = nn.GPT(vocab_size=16, block_size=8, n_layer=3, n_head=2, n_embd=16, device=dev,
                   seed=3)
    rng = np.random.default_rng(0)
    idx = wr.tensor(rng.integers(0, 16, (2, 8)).astype(np.int32), device=dev)
    tgt = wr.tensor(rng.integers(0, 16, (2, 8)).astype(np.int32), device=dev)
    l0, g0 = _grads(model, idx, tgt, False)
    l1, g1 = _grads(model, idx, tgt, True)
    assert l0 == l1
    assert g0.keys() == g1.keys() and len(g0) == len(list(model.parameters()))
    for n in g0:
        np.testing.assert_allclose(g1[n], g0[n], rtol=1e-5, atol=1e-7, err_msg=n)


@pytest.mark.timeout(60)
def test_input_gradient_and_dropout_masks_are_recomputed_identically(dev):
    """Gradients reach a non-leaf input (the graph before the checkpoint) and the recomputed
    dropout draws the masks of the forward (the random generator is rewound)."""
    lin = nn.Linear(5, 7, device=dev, seed=1)
    drop = nn.Dropout(0.5)
    x0 = np.random.default_rng(1).standard_normal((4, 5)).astype(np.float32)

    def run(ckpt):
        wr.manual_seed(7)
        x = wr.tensor(x0, device=dev, requires_grad=True)
        h = x * 2.0  # the checkpoint's input is an op output: backward must continue past it
        f = (lambda t: drop(lin(t)).tanh())
        y = checkpoint(f, h) if ckpt else f(h)
        store = backward((y * y).sum())
        return store.get(x).numpy(), store.get(lin.weight).numpy(), store.get(lin.bias).numpy()

    for a, b in zip(run(False), run(True)):
        np.testing.assert_allclose(b, a, rtol=1e-5, atol=1e-7)


@pytest.mark.timeout(60)
def test_checkpoint_keeps_no_intermediates_and_checks_its_input(dev):
    """After the forward only the output's own buffer is held by the graph; modifying the
    saved input in place before backward is reported, not silently wrong."""
    lin = nn.Linear(64, 64, device=dev, seed=2)
    x = wr.tensor(np.ones((64, 64), np.float32), device=dev, requires_grad=True)

    def deep(t):
        for _ in range(6):
            t = lin(t).relu()
        return t

    pool = dev.pool
    base = pool.live_bytes
    y_plain = deep(x)
    plain = pool.live_bytes - base
    del y_plain
    base = pool.live_bytes
    y = checkpoint(deep, x)
    kept = pool.live_bytes - base
    assert kept < plain / 3, (kept, plain)
    backward(y.sum())  # works once
    y2 = checkpoint(deep, x)
    with wr.no_grad():
        from wgrumus.ops.elementwise import copy_into
        copy_into(x, wr.tensor(np.zeros((64, 64), np.float32), device=dev))
    with pytest.raises(wr.WgrumusError, match="modified in place"):
        backward(y2.sum())


def test_checkpoint_without_grad_is_plain_and_rejects_non_tensor_outputs(dev):
    lin = nn.Linear(3, 3, device=dev, seed=0)
    x = wr.tensor(np.ones((2, 3), np.float32), device=dev)
    with wr.no_grad():
        out = checkpoint(lin, x)
    assert out._node is None
    with pytest.raises(wr.WgrumusError, match="one Tensor"):
        checkpoint(lambda t: (lin(t), lin(t)), x)
    y = wr.tensor(np.ones((2, 3), np.float32), device=dev, requires_grad=True) * 2.0
    assert checkpoint(lambda t: t, y) is y  # nothing computed inside: nothing to recompute
