"""Pipeline schedules measured: bubble per stage and peak activation memory, against theory.

    python benchmarks/pipeline.py                       # p=4, m=4 and 8, every schedule
    python benchmarks/pipeline.py --stages 2 --micro-batches 2 4 8 --width 256
    python benchmarks/pipeline.py --json                # one JSON object per configuration

Each configuration runs an MLP (``--layers`` nn.Linear+ReLU layers per stage, ``--width`` wide,
``--mb-size`` rows per micro-batch) through ``PipelineExecutor`` on ``p`` devices (logical
devices of one adapter when there are fewer adapters; set WGRUMUS_DEVICES), once to warm up and
``--repeats`` times measured; the run with the median makespan is reported.

Columns:
  theory   bubble of the schedule's formula ((p-1)/(m+p-1) for GPipe and 1F1B, (p-1)/(vm+p-1)
           interleaved, (p-1)/(3m+p-1) ZB-H1 with f = bi = bw);
  sim      ``simulate()`` of the same action lists with the mean F/B/BI/BW times measured in this
           run (no communication cost): the theory for this model's actual action times;
  measured 1 - busy/makespan per stage from the executor's timestamps, averaged over stages
           (busy excludes time blocked on a channel; ``synchronize=True`` so GPU work is inside
           the action that issued it);
  peak act per stage: the most activation bytes (inputs, outputs and tensors saved for backward
           of the micro-batches in flight; no parameters) each stage held, and in brackets the
           schedule's peak number of in-flight micro-batches on that stage.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stages", "-p", type=int, default=4)
    ap.add_argument("--micro-batches", "-m", type=int, nargs="+", default=[4, 8])
    ap.add_argument("--schedules", nargs="+", default=["gpipe", "1f1b", "interleaved", "zb_h1"])
    ap.add_argument("--chunks", "-v", type=int, default=2,
                    help="model chunks per stage (interleaved)")
    ap.add_argument("--layers", type=int, default=4, help="linear layers per stage")
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--mb-size", type=int, default=32, help="rows per micro-batch")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    return ap.parse_args(argv)


def theory_bubble(name: str, p: int, m: int, v: int) -> float:
    if name == "interleaved":
        return (p - 1) / (v * m + p - 1)
    if name in ("zb_h1", "zb-h1"):
        return (p - 1) / (3 * m + p - 1)
    return (p - 1) / (m + p - 1)


def build(args, name: str, p: int, wr):
    """p * v pieces of ``layers / v`` Linear+ReLU layers each; piece k on device k mod p."""
    from wgrumus.distributed.pipeline import PipelineStage
    nn = wr.nn
    devs = wr.devices()
    v = args.chunks if name == "interleaved" else 1
    per_piece = max(1, args.layers // v)
    stages = []
    for k in range(p * v):
        layers = []
        for i in range(per_piece):
            layers += [nn.Linear(args.width, args.width, seed=k * 100 + i), nn.ReLU()]
        stages.append(PipelineStage(nn.Sequential(*layers), devs[(k % p) % len(devs)]))
    return stages, v


def run_config(args, name: str, p: int, m: int):
    import wgrumus as wr
    from wgrumus.distributed.pipeline import PipelineExecutor, peak_in_flight, simulate
    stages, v = build(args, name, p, wr)
    ex = PipelineExecutor(stages, m, schedule=name, num_chunks=v if v > 1 else None,
                          timeout=120)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((m * args.mb_size, args.width)).astype(np.float32)
    t = rng.standard_normal((m * args.mb_size, args.width)).astype(np.float32)

    mse = wr.nn.functional.mse_loss
    ex.run(x, t, mse)  # warm-up: pipelines compiled, buffers pooled
    traces = []
    for _ in range(args.repeats):
        ex.run(x, t, mse)
        traces.append(ex.last_trace)
    traces.sort(key=lambda tr: tr.makespan)
    tr = traces[len(traces) // 2]
    durs = tr.mean_durations()
    f = durs.get("F", 1e-9)
    kw = {"f_time": f}
    if "B" in durs:
        kw["b_time"] = durs["B"]
    else:
        kw.update(b_time=durs["BI"] + durs["BW"], bi_time=durs["BI"],
                  bw_time=max(durs["BW"], 1e-9))
    sim = simulate(ex.schedule, **kw)
    return {
        "schedule": ex.schedule.name, "p": p, "m": m, "v": v,
        "theory_bubble": theory_bubble(name, p, m, v),
        "sim_bubble": sim.bubble_fraction,
        "measured_bubble": tr.bubble_fraction,
        "measured_stage_bubbles": list(tr.stage_bubble_fractions()),
        "makespan_s": tr.makespan,
        "makespans_s": [t_.makespan for t_ in traces],
        "mean_action_s": durs,
        "peak_activation_bytes": list(tr.peak_activation_bytes()),
        "peak_in_flight": list(peak_in_flight(ex.schedule)),
        "device": stages[0].device.name,
    }


def fmt_row(r) -> str:
    peaks = " ".join(f"{b / 2**20:.2f}({n})" for b, n in
                     zip(r["peak_activation_bytes"], r["peak_in_flight"]))
    d = r["mean_action_s"]
    acts = " ".join(f"{k}={1e3 * v:.1f}" for k, v in sorted(d.items()))
    return (f"{r['schedule']:<12} {r['p']:>2} {r['m']:>3} {r['v']:>2} "
            f"{100 * r['theory_bubble']:>7.1f}% {100 * r['sim_bubble']:>7.1f}% "
            f"{100 * r['measured_bubble']:>8.1f}% {1e3 * r['makespan_s']:>9.1f}  {acts:<28} "
            f"{peaks}")


def main(argv=None) -> int:
    args = parse_args(argv)
    need = args.stages
    os.environ.setdefault("WGRUMUS_DEVICES", str(max(need, 1)))
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    import wgrumus as wr
    devs = wr.devices()
    if not args.json:
        print(f"device: {devs[0].name}; {len(devs)} device(s); MLP width {args.width}, "
              f"{args.layers} layers/stage, {args.mb_size} rows/micro-batch, median of "
              f"{args.repeats} runs")
        print(f"{'schedule':<12} {'p':>2} {'m':>3} {'v':>2} {'theory':>8} {'sim':>8} "
              f"{'measured':>9} {'step ms':>9}  {'mean action ms':<28} peak act MB per stage "
              f"(in flight)")
    for m in args.micro_batches:
        for name in args.schedules:
            if name == "interleaved" and m % args.stages:
                continue
            r = run_config(args, name, args.stages, m)
            print(json.dumps(r) if args.json else fmt_row(r), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
