"""The three models of `wgrumus train` and their data, independent of the layout: a Task builds
its model from the seed and batch ``k`` from (seed, k) alone, so every layout and a resumed run
see the same weights and batches."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import wgrumus as wr

from .. import nn, optim
from ..data import CharCorpus, load_digits
from ..nn import functional as F
from .common import UsageError
from .optimizing import TrainOptimizer

DEFAULT_LR = {"sgd": 0.1, "adam": 3e-3, "adamw": 3e-3}
TEST_SPLIT_SEED = 1234  # the held-out split does not move with --seed


@dataclass
class Task:
    name: str
    unit: str                       # throughput unit: samples or tokens
    units_per_sample: int
    default_steps: int
    lr: float
    optimizer: str
    seed: int
    config: dict                    # what a checkpoint must match to be resumed
    build: Callable                 # build(device) -> freshly initialised, seeded module
    x_train: np.ndarray
    y_train: np.ndarray | None
    x_test: np.ndarray
    y_test: np.ndarray | None
    extra: dict = field(default_factory=dict)
    # around every optimizer step (cli/optimizing.py); total_steps is set once it is known
    clip: float | None = None
    lr_schedule: str = "constant"
    warmup: int = 0
    total_steps: int = 1
    activation_checkpointing: bool = False

    def make_model(self, device):
        wr.manual_seed(self.seed)  # same initial weights in every layout
        return self.build(device)

    def loss(self, out, y):
        if out.ndim == 3:  # gpt: [B, T, V] logits, [B, T] targets
            out = out.reshape(-1, out.shape[-1])
            y = y.reshape(-1)
        return F.cross_entropy(out, y)

    def make_optimizer(self, params, clip: bool = True, group=None, counted_elsewhere=()):
        """The optimizer over ``params`` at the scheduled rate, clipping to --clip unless the
        caller clips (``clip=False``: pipeline stages share one norm)."""
        cls = {"sgd": optim.SGD, "adam": optim.Adam, "adamw": optim.AdamW}[self.optimizer]
        opt = cls(params, lr=self.lr, momentum=0.9) if self.optimizer == "sgd" else \
            cls(params, lr=self.lr)
        return TrainOptimizer(opt, self.lr_schedule, self.warmup, self.total_steps,
                              self.clip if clip else None, group, counted_elsewhere)

    def steps_per_epoch(self, batch: int) -> int:
        n = len(self.x_train) if self.name != "gpt" else len(self.x_train) // self.units_per_sample
        return max(1, n // batch)

    def batch(self, step: int, batch: int):
        """Global batch number ``step``: a function of (seed, step) only."""
        if self.name == "gpt":
            return _windows(self.x_train, self.units_per_sample,
                            np.random.default_rng([self.seed, step]), batch)
        per_epoch = self.steps_per_epoch(batch)
        epoch, k = divmod(step, per_epoch)
        perm = np.random.default_rng([self.seed, epoch]).permutation(len(self.x_train))
        idx = perm[k * batch:(k + 1) * batch]
        return self.x_train[idx], self.y_train[idx]

    def evaluate(self, trainer) -> dict:
        """Held-out figures from the trained weights (trainer.predict runs forward only)."""
        if self.name != "gpt":
            logits = trainer.predict(self.x_test)
            return {"accuracy": float((logits.argmax(axis=1) == self.y_test).mean())}
        x, y = _windows(self.x_test, self.units_per_sample, np.random.default_rng(TEST_SPLIT_SEED),
                        16)
        logits = trainer.predict(x).astype(np.float64)
        logp = logits - logits.max(-1, keepdims=True)
        logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
        eval_loss = float(-np.take_along_axis(logp, y[..., None], -1).mean())
        return {"eval_loss": eval_loss, "sample": self.sample(trainer, 48)}

    def sample(self, trainer, n: int) -> str:
        """Greedy continuation of the first characters of the held-out text."""
        itos = self.extra["itos"]
        T = self.units_per_sample
        ctx = list(self.x_test[:T])
        out = []
        for _ in range(n):
            logits = trainer.predict(np.array([ctx[-T:]], np.int32))
            nxt = int(logits[0, -1].argmax())
            out.append(itos[nxt])
            ctx.append(nxt)
        return "".join(out)


def _windows(ids, T: int, rng, n: int) -> tuple:
    """``n`` random windows of ``T`` ids and their next-character targets."""
    starts = rng.integers(0, len(ids) - T - 1, size=n)
    return (np.stack([ids[s:s + T] for s in starts]).astype(np.int32),
            np.stack([ids[s + 1:s + T + 1] for s in starts]).astype(np.int32))


def build(cfg) -> Task:
    lr = cfg.lr or DEFAULT_LR[cfg.optimizer]
    task = _digits_task(cfg, lr) if cfg.model in ("mlp", "cnn") else _gpt_task(cfg, lr)
    task.clip, task.lr_schedule, task.warmup = cfg.clip, cfg.lr_schedule, cfg.warmup
    task.activation_checkpointing = cfg.activation_checkpointing
    return task


def _digits_task(cfg, lr) -> Task:
    x, y = load_digits()  # float32 [n, 64] pixel counts 0..16, int32 labels
    x = x / 16.0
    perm = np.random.default_rng(TEST_SPLIT_SEED).permutation(len(x))
    test, train = perm[:300], perm[300:]
    if cfg.model == "cnn":
        x = x.reshape(-1, 1, 8, 8)
    build_fn = _mlp if cfg.model == "mlp" else _cnn
    return Task(cfg.model, "samples", 1, 200, lr, cfg.optimizer, cfg.seed,
                {"model": cfg.model}, build_fn, x[train], y[train], x[test], y[test])


def _mlp(device):
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(),
                         nn.Linear(128, 10)).to(device)


def _cnn(device):
    return nn.Sequential(
        nn.Conv2d(1, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),   # 16 x 4 x 4
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),  # 32 x 2 x 2
        nn.Flatten(), nn.Linear(128, 64), nn.ReLU(), nn.Linear(64, 10)).to(device)


def _gpt_task(cfg, lr) -> Task:
    corpus = CharCorpus()
    chars, ids = corpus.chars, corpus.encode(corpus.text)
    cut = int(len(ids) * 0.9)
    g = cfg.gpt
    longest = len(ids) - cut - 2  # a window plus its next character fits in the held-out text
    if g["block_size"] > longest:
        raise UsageError(f"--block-size {g['block_size']} is longer than the text allows: the "
                         f"held-out part has {len(ids) - cut} characters, so use --block-size "
                         f"{longest} or less")
    conf = {"model": "gpt", "vocab_size": len(chars), **g}

    def build_fn(device):
        return nn.GPT(vocab_size=len(chars), block_size=g["block_size"], n_layer=g["n_layer"],
                      n_head=g["n_head"], n_embd=g["n_embd"]).to(device)

    return Task("gpt", "tokens", g["block_size"], 300, lr, cfg.optimizer, cfg.seed, conf,
                build_fn, ids[:cut], None, ids[cut:], None, {"itos": chars})
