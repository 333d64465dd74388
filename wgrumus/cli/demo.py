"""`wgrumus demo`: a short data + pipeline parallel run on logical devices of any adapter."""
from __future__ import annotations

import argparse

import wgrumus as wr

from ..distributed.pipeline import get_schedule, render
from .common import console, positive
from .config import config_from_args
from .train import add_arguments


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="a short data + pipeline parallel training run",
                       description="Train a small MLP on the 8x8 digits with 2 data-parallel "
                       "replicas x 2 pipeline stages (1F1B) on 4 devices: logical devices on "
                       "one adapter unless you have more; about 95% held-out accuracy. How "
                       "long it takes: README.md, 'How long the commands take'.")
    p.add_argument("--steps", type=positive(), default=60, help="optimizer steps (default 60)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=run)


def run(args) -> int:
    from . import loop  # the run's machinery (task, report, checkpoints): not for --help
    # The demo is `wgrumus train mlp --dp 2 --pp 2 ...` with fixed, sensible settings.
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("model")
    add_arguments(p)
    targs = p.parse_args(["mlp", "--dp", "2", "--pp", "2", "--micro-batches", "4",
                          "--schedule", "1f1b", "--devices", "4", "--batch-size", "64",
                          "--optimizer", "adamw", "--lr", "0.01",
                          "--steps", str(args.steps), "--seed", str(args.seed)]
                         + (["--json"] if args.json else []))
    targs.title = "wgrumus demo"
    cfg = config_from_args(targs)
    if not args.json:
        _intro(cfg)
    return loop.train(cfg)


def _intro(cfg) -> None:
    """What is about to run, and the schedule each replica's pipeline follows."""
    con = console()
    devs = wr.devices()[:cfg.layout.world]
    adapters = sorted({d.adapter_info.get("device", "?") for d in devs})
    con.print(f"[bold]wgrumus demo[/]: an MLP learns the 8x8 handwritten digits with "
              f"{cfg.layout.dp} data-parallel replicas x {cfg.layout.pp} pipeline stages on "
              f"{len(devs)} devices ({', '.join(adapters)}).")
    con.print(f"Each replica's pipeline runs this {cfg.layout.schedule} schedule every step "
              f"(F/B = forward/backward of micro-batch k):")
    con.print(render(get_schedule(cfg.layout.schedule, cfg.layout.pp,
                                  cfg.layout.micro_batches)), markup=False, highlight=False)
