"""3D-parallel GPT training: tokens/s per dp x tp x pp layout, and the communication volume per
step of each group (DP, TP, PP) measured by the process groups, against the analytic volume.

    python benchmarks/parallel3d.py                 # the layouts of 8 devices, small GPT
    python benchmarks/parallel3d.py --quick         # fewer steps, tiny GPT
    python benchmarks/parallel3d.py --json          # one JSON object per layout
    python benchmarks/parallel3d.py --schedule zb-h1   # any pipeline schedule (default 1f1b)

Volumes are payload bytes as each rank's ProcessGroup records them (all-reduce: the array;
all-gather / reduce-scatter: this rank's input; send and recv: the array), summed over all
ranks, per optimizer step. The analytic model, per micro-batch of mb sequences of T tokens:
every transformer block all-reduces [mb, T, E] floats over TP twice forward (attention and MLP
outputs) and twice backward (their inputs); the embedding once forward; the LM head once
backward plus the vocab-parallel cross-entropy's [tp, 3, mb*T] statistics (each rank's row max,
sum of exponentials and target logit, gathered as one all-reduce of zero-padded rows); each
stage boundary carries [mb, T, E] forward and back; DP all-reduces every rank's shard of the
gradients once per step (and the 8-byte loss on the last stage).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

LAYOUTS = [(1, 1, 1), (8, 1, 1), (1, 8, 1), (1, 1, 8), (2, 2, 2), (4, 2, 1), (2, 4, 1),
           (1, 2, 4), (2, 1, 4)]


def analytic(cfg, dp, tp, pp, batch, m, schedule="1f1b") -> dict:
    """Payload bytes per step, summed over all ranks, per group."""
    from wgrumus.distributed.parallel3d import (
        chunks_per_stage,
        dense_gpt_state,
        gpt_shard_plan,
        stage_blocks,
    )
    from wgrumus.distributed.tensor_parallel.shard import shard_array
    E, T = cfg.n_embd, cfg.block_size
    mb = batch // dp // m
    act = 4 * mb * T * E  # one [mb, T, E] float32 activation
    N = mb * T
    out = {"dp": 0, "tp": 0, "pp": 0}
    blocks = stage_blocks(cfg.n_layer, pp)
    dense = dense_gpt_state(cfg, 0)
    for s in range(pp):
        first, last = s == 0, s == pp - 1
        if tp > 1:
            per_mb = 4 * act * len(blocks[s])
            if first:
                per_mb += act
            if last:
                per_mb += act + 12 * N * tp
            out["tp"] += per_mb * m * tp * dp
        if dp > 1:
            names = ([n for n in dense if n.startswith(("wte", "wpe"))] if first else [])
            names += [n for n in dense if any(n.startswith(f"blocks.{i}.") for i in blocks[s])]
            names += [n for n in dense if n.startswith(("ln_f", "lm_head"))] if last else []
            plan = gpt_shard_plan(names)
            shard = sum(shard_array(dense[n], plan[n], tp, 0, is_bias=n.endswith("bias"),
                                    num_heads=cfg.n_head).size for n in names)
            out["dp"] += (4 * shard + (8 if last else 0)) * tp * dp
    # every boundary between virtual stages (interleaved: 2 chunks per rank), each way,
    # counted at the sender and at the receiver
    out["pp"] = 4 * (pp * chunks_per_stage(schedule) - 1) * act * m * tp * dp
    return out


def measure(cfg, layout, steps, batch, m, devices, schedule="1f1b"):
    from wgrumus.distributed.parallel3d import train_3d
    dp, tp, pp = layout
    kw = dict(batch_size=batch, micro_batches=m, devices=devices[:dp * tp * pp],
              return_details=True, timeout=300, schedule=schedule)
    train_3d(cfg, dp, tp, pp, steps=1, **kw)  # compiles kernels, fills the buffer pools
    out = train_3d(cfg, dp, tp, pp, steps=steps, **kw)
    measured = {g: sum(r["stats"][g]["bytes"] for r in out["ranks"]) / steps
                for g in ("dp", "tp", "pp")}
    comm_s = max(sum(r["stats"][g]["seconds"] for g in ("dp", "tp", "pp"))
                 for r in out["ranks"]) / steps
    return {"layout": out["layout"], "tokens_per_s": out["tokens_per_s"],
            "step_ms": 1e3 * out["seconds"] / steps, "comm_ms_per_step": 1e3 * comm_s,
            "measured_bytes_per_step": measured,
            "analytic_bytes_per_step": analytic(cfg, dp, tp, pp, batch, m, schedule),
            "final_loss": out["losses"][-1]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="tiny GPT, 2 steps, batch 8, 4 layouts")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--micro-batches", type=int, default=None, help="default: pp")
    p.add_argument("--layouts", default=None, help="e.g. 2x2x2,1x2x4 (dp x tp x pp)")
    p.add_argument("--schedule", default="1f1b", help="gpipe | 1f1b | interleaved | zb-h1")
    p.add_argument("--json", action="store_true")
    p.add_argument("--devices", type=int, default=8,
                   help="WGRUMUS_DEVICES when unset: logical devices on one adapter (default 8)")
    args = p.parse_args(argv)
    os.environ.setdefault("WGRUMUS_DEVICES", str(args.devices))
    import wgrumus as wr
    from wgrumus.distributed.parallel3d import GPTConfig
    devices = wr.devices()
    if args.quick:
        cfg = GPTConfig(vocab_size=16, block_size=8, n_layer=4, n_head=4, n_embd=16)
        steps = args.steps or 2
        args.batch = min(args.batch, 8)
        layouts = [(1, 1, 1), (2, 2, 2), (1, 2, 4), (2, 4, 1)]
    else:
        cfg = GPTConfig(vocab_size=256, block_size=64, n_layer=8, n_head=8, n_embd=128)
        steps = args.steps or 5
        layouts = LAYOUTS
    if args.layouts:
        layouts = [tuple(int(v) for v in s.split("x")) for s in args.layouts.split(",")]
    layouts = [lay for lay in layouts if lay[0] * lay[1] * lay[2] <= len(devices)]
    rows = []
    for lay in layouts:
        m = args.micro_batches or lay[2]
        row = measure(cfg, lay, steps, args.batch, m, devices, args.schedule)
        rows.append(row)
        if args.json:
            print(json.dumps(row), flush=True)
    if not args.json:
        print_table(rows, cfg, devices[0], args.schedule)
    return 0


def print_table(rows, cfg, dev, schedule):
    print(f"GPT vocab {cfg.vocab_size}, T {cfg.block_size}, {cfg.n_layer} layers, "
          f"{cfg.n_head} heads, d {cfg.n_embd}; schedule {schedule}; "
          f"device: {dev.name}")
    print("volumes: payload KiB per optimizer step summed over ranks; '!' marks a measured "
          "volume that differs from the analytic one")
    print(f"{'dp x tp x pp':>12} {'tokens/s':>10} {'step ms':>9} {'comm ms':>8} "
          + " ".join(f"{g + ' KiB meas/analytic':>22}" for g in ("dp", "tp", "pp")))
    for r in rows:
        lay = r["layout"]
        cols = []
        for g in ("dp", "tp", "pp"):
            a, b = r["measured_bytes_per_step"][g], r["analytic_bytes_per_step"][g]
            cols.append(f"{a / 2**10:>10.1f}/{b / 2**10:<10.1f}{'' if a == b else '!':1}")
        print(f"{lay['dp']:>4} x{lay['tp']:>2} x{lay['pp']:>2}  {r['tokens_per_s']:>10.0f} "
              f"{r['step_ms']:>9.1f} {r['comm_ms_per_step']:>8.1f} " + " ".join(cols))


if __name__ == "__main__":
    sys.exit(main())
