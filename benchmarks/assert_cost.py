"""Cost of the device-side index asserts (runtime/asserts.py) on a GPT-mini training step.

    python benchmarks/assert_cost.py [--full] [--blocks 10] [--before OLD_TREE --rounds 5]

The step: GPT-mini with ids and targets held on the device (so every step arms the check) and
``loss.item()`` read every step (so every step pays the flag copy). In one process, blocks of
steps alternate between the check armed as shipped and arming switched off (the kernels still
bind the flag buffer and compare indices: that part is in both), and the medians of wall and
process-CPU ms/step are compared. With ``--before``, the same step also runs under an older
source tree without any of it, alternating fresh processes round by round so that load drift
on a shared machine hits both alike.
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

def block():
    t, c = time.perf_counter(), time.process_time()
    for _ in range(cfg["steps"]):
        step()
    return (1e3 * (time.perf_counter() - t) / cfg["steps"],
            1e3 * (time.process_time() - c) / cfg["steps"])

res = {"on": [], "off": []}
if cfg["blocks"]:
    from wgrumus.runtime.asserts import DeviceAsserts
    arm = DeviceAsserts.arm
    for b in range(cfg["blocks"]):
        for mode in (("on", "off") if b % 2 == 0 else ("off", "on")):
            DeviceAsserts.arm = arm if mode == "on" else (lambda self: None)
            res[mode].append(block())
    DeviceAsserts.arm = arm
else:
    res["on"].append(block())
print(json.dumps(res))
"""

CFG = dict(batch=4, seq=32, vocab=65, layers=2, d=64, heads=4, warmup=10, steps=10)
FULL = dict(CFG, batch=16, seq=128, layers=4, d=256, steps=50)  # train_step.py's full GPT-mini


def run(tree: str, blocks: int) -> dict:
    path = [os.path.abspath(tree)] + [os.environ["PYTHONPATH"]] * bool(os.environ.get("PYTHONPATH"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), WGRUMUS_DEVICES="1")
    out = subprocess.run([sys.executable, "-c", STEP, json.dumps(dict(CFG, blocks=blocks))],
                         env=env, check=True, capture_output=True, text=True,
                         cwd=os.path.abspath(tree), timeout=1800)
    return json.loads(out.stdout.strip().splitlines()[-1])


def table(title: str, rows: dict) -> None:
    """rows: name -> list of (wall ms, cpu ms) per block; the last row is compared to the first."""
    print(title)
    print(f"{'':10} {'wall ms/step':>13} {'cpu ms/step':>12}  blocks")
    med = {k: [statistics.median(v[i] for v in r) for i in (0, 1)] for k, r in rows.items()}
    for k, (w, c) in med.items():
        print(f"{k:10} {w:13.2f} {c:12.2f}  {len(rows[k])}")
    first, last = list(med.values())[0], list(med.values())[-1]
    print(f"ratio {list(med)[-1]} / {list(med)[0]}: wall {last[0] / first[0]:.4f}, "
          f"cpu {last[1] / first[1]:.4f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--full", action="store_true", help="full GPT-mini sizes (GPUs)")
    ap.add_argument("--blocks", type=int, default=10, help="in-process blocks per mode")
    ap.add_argument("--before", help="also compare with this source tree (no asserts)")
    ap.add_argument("--rounds", type=int, default=5, help="processes per tree with --before")
    args = ap.parse_args()
    if args.full:
        CFG.update(FULL)
    head = (f"GPT-mini step (batch {CFG['batch']}, seq {CFG['seq']}, d {CFG['d']}, "
            f"{CFG['layers']} layers; loss.item() every step), {CFG['steps']} steps per block")
    res = run(".", args.blocks)
    table(head + "; one process, arming off / on alternating",
          {"off": res["off"], "on": res["on"]})
    if args.before:
        trees = {"before": [], "after": []}
        for r in range(args.rounds):
            for name in (("before", "after") if r % 2 == 0 else ("after", "before")):
                trees[name] += run(args.before if name == "before" else ".", 0)["on"]
        table(f"\n{head}; fresh processes, {args.before} vs this tree", trees)


if __name__ == "__main__":
    main()
