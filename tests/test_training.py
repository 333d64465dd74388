"""End-to-end training on the shipped data: a two-layer MLP reaches >= 95% held-out accuracy
on the digits, a small CNN's loss falls clearly, and a tiny GPT overfits a short text."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn, optim
from wgrumus.data import CharCorpus, DataLoader, TensorDataset, digits_dataset
from wgrumus.nn import functional as F


def _split(images=False):
    ds = digits_dataset(images=images)
    x, y = ds.arrays
    perm = np.random.default_rng(1234).permutation(len(x))
    test, train = perm[:300], perm[300:]
    return x[train], y[train], x[test], y[test]


@pytest.mark.timeout(120)
def test_mlp_reaches_95_percent_on_held_out_digits(dev):
    xtr, ytr, xte, yte = _split()
    wr.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10)).to(dev)
    opt = optim.Adam(model.parameters(), lr=0.01)
    loader = DataLoader(TensorDataset(xtr, ytr), batch_size=512, shuffle=True,
                        seed=0, device=dev)
    losses = []
    for _ in range(12):
        for x, y in loader:
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(loss.item())
    model.eval()
    with wr.no_grad():
        pred = model(wr.tensor(xte, device=dev)).argmax(axis=1).numpy()
    acc = float((pred == yte).mean())
    assert losses[-1] < 0.5 * losses[0]
    assert acc >= 0.95, f"held-out accuracy {acc:.3f} (losses {losses[0]:.3f} -> {losses[-1]:.3f})"


@pytest.mark.timeout(120)
def test_small_cnn_trains(dev):
    xtr, ytr, _, _ = _split(images=True)
    wr.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.MaxPool2d(2), nn.Flatten(), nn.Linear(8 * 4 * 4, 10))
    opt = optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = wr.tensor(xtr[:256]), wr.tensor(ytr[:256])
    losses = []
    for _ in range(15):
        loss = F.cross_entropy(model(x), y)
        opt.step(wr.autograd.backward(loss))
        losses.append(loss.item())
    assert losses[-1] < 0.4 * losses[0], losses


@pytest.mark.timeout(300)
def test_tiny_gpt_overfits_a_short_text():
    corpus = CharCorpus()
    text = corpus.text[:200]
    ids = corpus.encode(text)
    T = 16
    starts = np.arange(0, len(ids) - T - 1, 12)
    x = np.stack([ids[s:s + T] for s in starts])
    y = np.stack([ids[s + 1:s + T + 1] for s in starts])
    wr.manual_seed(0)
    model = nn.GPT(vocab_size=corpus.vocab_size, block_size=T, n_layer=1, n_head=2, n_embd=32)
    opt = optim.AdamW(model.parameters(), lr=2e-2, weight_decay=0.0)
    sched = optim.lr_scheduler.LinearWarmup(opt, warmup_steps=5, start_factor=0.2)
    xt, yt = wr.tensor(x), wr.tensor(y)
    losses = []
    for _ in range(30):
        logits = model(xt)
        loss = F.cross_entropy(logits.reshape(-1, corpus.vocab_size), yt.reshape(-1))
        grads = wr.autograd.backward(loss)
        optim.clip_grad_norm_(model.parameters(), 1.0, grads=grads)
        opt.step(grads)
        sched.step()
        losses.append(loss.item())
    # starts near ln(vocab) ~ 4; a model that memorised the 200 characters is far below 0.5
    assert losses[0] > 3.0 and losses[-1] < 0.5, (losses[0], losses[-1])
