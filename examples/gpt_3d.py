"""3D parallelism: a character-level GPT trained with data x tensor x pipeline parallelism
(2 x 2 x 2 = 8 devices), and the same model on one device for comparison: the loss curves agree.

    python examples/gpt_3d.py --steps 20
"""
import argparse
import os

os.environ.setdefault("WGRUMUS_DEVICES", "8")  # logical devices when fewer adapters exist

import numpy as np  # noqa: E402

import wgrumus as wr  # noqa: E402
from wgrumus.data import CharCorpus  # noqa: E402
from wgrumus.distributed.parallel3d import GPTConfig, train_3d  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=20)
p.add_argument("--dp", type=int, default=2)
p.add_argument("--tp", type=int, default=2)
p.add_argument("--pp", type=int, default=2)
p.add_argument("--block-size", type=int, default=16)
args = p.parse_args()

corpus = CharCorpus()                          # Shakespeare, shipped with the package
ids = corpus.encode(corpus.text)
T = args.block_size
rows = np.stack([ids[i:i + T + 1] for i in range(0, len(ids) - T - 1, T)])  # [N, T+1]
vocab = -(-corpus.vocab_size // 8) * 8         # padded so tp = 2, 4, 8 can split it
config = GPTConfig(vocab_size=vocab, block_size=T, n_layer=2, n_head=4, n_embd=32)


def adamw(params):
    return wr.optim.AdamW(params, lr=3e-3)


# every rank builds the same dense nn.GPT from the seed and keeps its own shard of its stage
run = train_3d(config, dp=args.dp, tp=args.tp, pp=args.pp, steps=args.steps, batch_size=16,
               micro_batches=4, data=rows, optimizer=adamw, seed=0, return_details=True)
one = train_3d(config, steps=args.steps, batch_size=16, micro_batches=4, data=rows,
               optimizer=adamw, seed=0, devices=wr.devices()[:1])
print(f"layout {run['layout']}: {run['tokens_per_s']:.0f} tokens/s")
for step in range(0, args.steps, max(1, args.steps // 5)):
    print(f"step {step + 1:3d}  3D {run['losses'][step]:.4f}   one device {one[step]:.4f}")
assert np.allclose(run["losses"], one, rtol=1e-3), "3D and single-device runs disagree"
