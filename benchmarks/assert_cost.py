"""Cost of the device-side index asserts (runtime/asserts.py) on a GPT-mini training step.

    python benchmarks/assert_cost.py --before /path/to/old/tree [--after .] [--rounds 5]

Runs the same step loop (GPT-mini, ids and targets held on the device, so every step arms the
check, and ``loss.item()`` read every step, so every step pays the flag copy) under two source
trees, alternating fresh processes round by round so that load drift on a shared machine hits
both alike, and prints the median ms/step of each and the ratio after / before.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

STEP = r"""
import json, os, sys, time
import numpy as np
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
import wgrumus as wr
from wgrumus.nn import functional as F
cfg = json.loads(sys.argv[1])
rng = np.random.default_rng(0)
model = wr.nn.GPT(cfg["vocab"], cfg["seq"], n_layer=cfg["layers"], n_head=cfg["heads"],
                  n_embd=cfg["d"], seed=0)
ids = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"] + 1))
x = wr.tensor(ids[:, :-1].astype(np.int32))
y = wr.tensor(ids[:, 1:].reshape(-1).astype(np.int32))
opt = wr.optim.AdamW(model.parameters(), lr=1e-3)

def step():
    out = model(x)
    loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
    opt.step(wr.autograd.backward(loss))
    return loss.item()

for _ in range(cfg["warmup"]):
    step()
t = time.perf_counter()
for _ in range(cfg["steps"]):
    step()
print(json.dumps({"ms": 1e3 * (time.perf_counter() - t) / cfg["steps"]}))
"""

CFG = dict(batch=4, seq=32, vocab=65, layers=2, d=64, heads=4, warmup=10, steps=40)


def run(tree: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.path.abspath(tree), WGRUMUS_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", STEP, json.dumps(CFG)], env=env, check=True,
                         capture_output=True, text=True, cwd=os.path.abspath(tree), timeout=600)
    return json.loads(out.stdout.strip().splitlines()[-1])["ms"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", required=True, help="source tree without the asserts")
    ap.add_argument("--after", default=".", help="source tree with them (default: here)")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    res = {"before": [], "after": []}
    for r in range(args.rounds):
        for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
            res[name].append(run(getattr(args, name)))
    b, a = statistics.median(res["before"]), statistics.median(res["after"])
    print(f"GPT-mini step (batch {CFG['batch']}, seq {CFG['seq']}, d {CFG['d']}, "
          f"{CFG['layers']} layers; loss.item() every step), {args.rounds} rounds x "
          f"{CFG['steps']} steps")
    print(f"{'tree':8} {'median ms/step':>15} {'all rounds':>40}")
    for name, m in (("before", b), ("after", a)):
        print(f"{name:8} {m:15.2f} {' '.join(f'{v:.2f}' for v in res[name]):>40}")
    print(f"after / before: {a / b:.4f}")


if __name__ == "__main__":
    main()
