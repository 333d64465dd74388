"""Tensor parallel: one GPT transformer block with its attention heads and MLP columns split
over 2 devices (Megatron-style), checked against the same dense block on one device.

    python examples/tensor_parallel_block.py --steps 20
"""
import argparse
import os

os.environ.setdefault("WGRUMUS_DEVICES", "2")

import numpy as np  # noqa: E402

import wgrumus as wr  # noqa: E402
from wgrumus import distributed as dist  # noqa: E402
from wgrumus import nn
from wgrumus.distributed.tensor_parallel import ParallelMLP, ParallelSelfAttention  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=20)
args = p.parse_args()

E, H, B, T, TP = 32, 4, 4, 8, 2
rng = np.random.default_rng(0)
x_np = rng.standard_normal((B, T, E)).astype(np.float32)
target_np = rng.standard_normal((B, T, E)).astype(np.float32)


def train(block_forward, params, device):
    """A few SGD steps of mse(block(x), target); returns the losses."""
    x, target = wr.tensor(x_np, device=device), wr.tensor(target_np, device=device)
    opt = wr.optim.SGD(params, lr=0.05)
    losses = []
    for _ in range(args.steps):
        loss = nn.functional.mse_loss(block_forward(x), target)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def tp_rank(group):
    """Runs on each of the TP ranks (a thread per device)."""
    dense = nn.TransformerBlock(E, H, seed=0, device=group.device)  # same weights everywhere
    attn = ParallelSelfAttention.from_dense(dense.attn, group)  # my heads only: H / TP
    mlp = ParallelMLP.from_dense(dense.mlp, group)              # my MLP columns only
    print(f"rank {group.rank}: attention holds {attn.qkv_weight.shape[0] // 3 // (E // H)} of "
          f"{H} heads, MLP fc holds {mlp.fc1.weight.shape[0]} of {4 * E} columns")

    def forward(x):  # the same pre-LN block, with one all-reduce in attention and one in MLP
        x = x + attn(dense.ln1(x))
        return x + mlp(dense.ln2(x))

    params = list(attn.parameters()) + list(mlp.parameters()) + \
        list(dense.ln1.parameters()) + list(dense.ln2.parameters())
    return train(forward, params, group.device)


devices = wr.devices()[:TP]
tp_losses = dist.spawn(tp_rank, TP, devices=devices)[0]
dense = nn.TransformerBlock(E, H, seed=0, device=devices[0])
dense_losses = train(dense, dense.parameters(), devices[0])
for step in range(0, args.steps, max(1, args.steps // 5)):
    print(f"step {step + 1:3d}  tensor parallel {tp_losses[step]:.6f}  "
          f"dense {dense_losses[step]:.6f}")
assert np.allclose(tp_losses, dense_losses, rtol=1e-4, atol=1e-5), "TP and dense disagree"
print("tensor-parallel training matches the dense block")
