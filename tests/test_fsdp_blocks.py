"""Per-block FSDP (auto_wrap): the losses and weights of one device, each block's parameters
gathered just for its own forward and backward, a lower peak than whole-model FSDP."""
import sys
from pathlib import Path

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus import nn, optim
from wgrumus.distributed import FSDP
from wgrumus.nn.attention import TransformerBlock

sys.path.insert(0, str(Path(__file__).parent))
from test_zero1 import batches as token_batches
from test_zero1 import lm_loss, one_device

WORLD, STEPS = 4, 3
UNITS = (TransformerBlock, nn.Embedding, nn.LayerNorm, nn.Linear)


def make(dev):
    return nn.GPT(vocab_size=32, block_size=8, n_layer=3, n_head=2, n_embd=32, device=dev,
                  seed=4)


def batches():
    return token_batches(vocab=32, seed=2, steps=STEPS)


def train_fsdp(devs, auto_wrap):
    per = 8 // WORLD

    def fn(g):
        f = FSDP(make(g.device), g, auto_wrap=auto_wrap)
        opt = optim.AdamW(f.parameters(), lr=0.01)
        pool = g.device.pool
        losses, peaks = [], []
        try:
            for b in batches():
                rows = b[g.rank * per:(g.rank + 1) * per]
                pool.reset_peak()
                loss = lm_loss(f(wr.tensor(rows[:, :-1], device=g.device)),
                               wr.tensor(rows[:, 1:], device=g.device))
                f.zero_grad()
                loss.backward()
                opt.step()
                losses.append(g.all_reduce(np.array([loss.item()]), "mean")[0])
                peaks.append(pool.peak_live_bytes)
            sd = f.full_state_dict()
            ops = dict(g.stats()["by_op"], prefetch_hits=f.prefetch_hits)
            return losses, sd, max(peaks), ops
        finally:
            f.close()

    return dist.spawn(fn, WORLD, devices=devs[:WORLD], timeout=120)


@pytest.mark.timeout(300)
def test_per_block_fsdp_trains_like_one_device_with_a_lower_peak(devs):
    model = make(devs[0])
    ref = one_device(model, devs[0], batches())
    blocks = train_fsdp(devs, UNITS)
    whole = train_fsdp(devs, None)
    n_params = len(list(model.parameters()))
    for losses, sd, _peak, ops in blocks:
        assert losses == pytest.approx(ref, rel=1e-5)
        for k, v in model.state_dict().items():
            # atol: the attention key bias has a zero gradient up to rounding, which AdamW
            # turns into ~1e-5 steps of either sign in both runs
            np.testing.assert_allclose(sd[k], v.numpy(), rtol=1e-4, atol=1e-4, err_msg=k)
        # every parameter gathered once for forward and once for backward, then the final
        # full_state_dict: the per-block schedule adds no gathers
        assert ops["all_gather"]["calls"] == STEPS * 2 * n_params + n_params
        assert ops["reduce_scatter"]["calls"] == STEPS * n_params
        # 7 units (wte, wpe, 3 blocks, ln_f, lm_head) after the parameter-less root: in
        # forward each is prefetched by the one before it (from the second forward on, once
        # the order is known), in every backward each but lm_head by the one after it
        assert ops["prefetch_hits"] == (STEPS - 1) * 7 + STEPS * 6
    for (lb, _, pb, _), (lw, _, pw, _) in zip(blocks, whole):
        assert lb == pytest.approx(lw, rel=1e-6)
        assert pb < pw, (pb, pw)


@pytest.mark.timeout(60)
def test_only_the_running_block_is_gathered(devs):
    """While block i runs forward, block i's parameters are whole and the other blocks' are
    freed (a prefetched next block may be in flight on the communication thread, but its
    buffers are only filled when its turn comes)."""
    def fn(g):
        model = make(g.device)
        seen = []
        for i, blk in enumerate(model.blocks):
            orig = blk.ln1.forward

            def probe(x, i=i, orig=orig):
                seen.append([all(p._storage.buffer is not None for p in b.parameters())
                             for b in model.blocks])
                return orig(x)
            blk.ln1.forward = probe
        f = FSDP(model, g, auto_wrap=TransformerBlock)
        try:
            with wr.no_grad():
                f(wr.tensor(np.zeros((1, 8), np.int32), device=g.device))
        finally:
            f.close()
        return seen

    for seen in dist.spawn(fn, 2, devices=devs[:2], timeout=60):
        assert seen == [[True, False, False], [False, True, False], [False, False, True]]


def test_auto_wrap_picks_outermost_modules(devs):
    from wgrumus.distributed.fsdp import _wrap_targets
    m = make(devs[0])
    names = [n for n, _ in _wrap_targets(m, UNITS)]
    assert names == ["wte", "wpe", "blocks.0", "blocks.1", "blocks.2", "ln_f", "lm_head"]
    assert [n for n, _ in _wrap_targets(m, lambda mod: isinstance(mod, nn.LayerNorm))][:2] == \
        ["blocks.0.ln1", "blocks.0.ln2"]
