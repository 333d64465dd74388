"""Data parallel: one replica of the model per device, the batch split between them, gradients
averaged in buckets while backward is still running (like PyTorch DDP).

On one GPU-less machine this makes logical devices on the one adapter:

    WGRUMUS_DEVICES=2 python examples/data_parallel.py --steps 100
"""
import argparse
import os

os.environ.setdefault("WGRUMUS_DEVICES", "2")  # before wgrumus creates its devices

import wgrumus as wr  # noqa: E402
from wgrumus import nn  # noqa: E402
from wgrumus.data import load_digits  # noqa: E402
from wgrumus.parallel import DataParallel  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=100)
args = p.parse_args()

devices = wr.devices()
x, y = load_digits()
x = x / 16.0

wr.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
ddp = DataParallel(model, devices)          # replicas broadcast from device 0
# one optimizer per replica; they stay identical because every replica gets the same gradients
opts = [wr.optim.SGD(r.parameters(), lr=0.1, momentum=0.9) for r in ddp.replicas]

batch = 64 * len(devices)                   # the global batch; each replica takes 64 rows
for step in range(args.steps):
    lo = (step * batch) % (len(x) - batch)
    loss = ddp.train_step(x[lo:lo + batch], y[lo:lo + batch],
                          nn.functional.cross_entropy, opts)  # forward, backward, sync, step
    if (step + 1) % 25 == 0 or step + 1 == args.steps:
        print(f"step {step + 1:4d}  loss {loss:.4f}")

print(f"{len(devices)} replicas identical: {ddp.replicas_identical()}")
ddp.close()
