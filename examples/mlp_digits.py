"""Single device: a two-layer MLP on the 8x8 handwritten digits, written the PyTorch way.

    python examples/mlp_digits.py --steps 300
"""
import argparse

import numpy as np

import wgrumus as wr
from wgrumus import nn
from wgrumus.data import DataLoader, TensorDataset, load_digits

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=300)
args = p.parse_args()

wr.manual_seed(0)                                   # seeded weights, like torch.manual_seed
x_all, y_all = load_digits()                        # 1,797 8x8 images (64 pixels, 0..16)
x_all = x_all / 16.0
train = TensorDataset(x_all[:1500], y_all[:1500])   # the last 297 are held out
loader = DataLoader(train, batch_size=64, shuffle=True, drop_last=True, seed=0)

model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))  # on wr.devices()[0]
opt = wr.optim.AdamW(model.parameters(), lr=1e-2)

step = 0
while step < args.steps:
    for xb, yb in loader:                           # numpy batches, prefetched in a thread
        logits = model(wr.tensor(xb))
        loss = nn.functional.cross_entropy(logits, wr.tensor(yb, dtype=wr.int32))
        opt.zero_grad()
        loss.backward()                             # gradients land in p.grad, as in PyTorch
        opt.step()
        step += 1
        if step % 50 == 0 or step == args.steps:
            print(f"step {step:4d}  loss {loss.item():.4f}")
        if step == args.steps:
            break

with wr.no_grad():                                  # held-out accuracy
    pred = model(wr.tensor(x_all[1500:])).argmax(axis=1).numpy()
print(f"held-out accuracy {np.mean(pred == y_all[1500:]):.1%} on {wr.devices()[0].name}")
