"""`wgrumus train`: train mlp / cnn / gpt on one device or with dp x tp x pp parallelism (the
same seed gives the same weights and data order in every layout: config.py checks the
arguments, loop.py runs the steps, models.py builds the task)."""
from __future__ import annotations

import argparse

from .common import positive
from .config import OPTIMIZERS, SCHEDULES, config_from_args
from .optimizing import SCHEDULES as LR_SCHEDULES


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Training options, shared by `train` and `demo`."""
    pos = positive()
    g = p.add_argument_group("length and optimisation")
    g.add_argument("--steps", type=pos, metavar="N",
                   help="optimizer steps (default: 200 for mlp/cnn, 300 for gpt)")
    g.add_argument("--epochs", type=positive(float), metavar="E",
                   help="passes over the training set (instead of --steps)")
    g.add_argument("--batch-size", type=pos, metavar="B",
                   help="global batch, split over dp replicas and micro-batches (default 64; "
                   "gpt 32)")
    g.add_argument("--lr", type=positive(float), metavar="LR",
                   help="learning rate, a finite number > 0 (default: 0.1 for sgd, 0.003 for "
                   "adam/adamw); a run whose loss turns NaN or infinite stops there (exit 1)")
    g.add_argument("--optimizer", choices=OPTIMIZERS, default="adamw", help="default adamw")
    g.add_argument("--clip", type=positive(float), metavar="NORM",
                   help="clip the gradients to this global norm (over every shard and stage)")
    g.add_argument("--lr-schedule", choices=LR_SCHEDULES, default="constant",
                   help="constant, or cosine decay to 0 over the run (default constant)")
    g.add_argument("--warmup", type=int, default=0, metavar="STEPS",
                   help="linear learning-rate warmup from 0 over this many steps (default 0)")
    g.add_argument("--activation-checkpointing", action="store_true",
                   help="gpt: recompute each block's activations in backward instead of "
                   "keeping them (less memory, one more forward per block)")
    g.add_argument("--seed", type=int, default=0,
                   help="weights and data order, the same in every layout (default 0)")
    g.add_argument("--precision", choices=("f32", "f16"), default="f32",
                   help="f16: mixed precision (autocast matmul/linear/conv/attention to f16, "
                   "dynamic loss scaling, f32 master weights; needs shader-f16). Default f32")
    g.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True,
                   help="replay each step from wr.jit captures: no Python per op, the same "
                   "losses, in every --dp/--tp/--pp layout (each rank or stage replays its "
                   "device's work; communication runs between the replayed segments; f16 loss "
                   "scaling stays on the device). Default on; --no-jit runs every step eagerly")
    g = p.add_argument_group("gradient synchronisation (data parallel)")
    g.add_argument("--grad-comm", choices=("f32", "f16"), default="f32",
                   help="f16: send gradients as float16 (cast on the device, half the bytes on "
                   "the wire; close to exact, not equal). Default f32 (exact)")
    g.add_argument("--grad-accum", type=pos, default=1, metavar="K",
                   help="run each step's batch as K micro-steps with one all-reduce (the same "
                   "losses, the memory of a K-times smaller batch). Default 1")
    g.add_argument("--sync-every", type=pos, metavar="H",
                   help="post-local SGD: after --local-sgd-warmup exact steps each replica steps "
                   "alone and the replicas' parameters are averaged every H steps (default: "
                   "exact data parallel every step)")
    g.add_argument("--local-sgd-warmup", type=int, metavar="N",
                   help="exact data-parallel steps before --sync-every starts (default 0)")
    g = p.add_argument_group("parallel layout")
    g.add_argument("--dp", type=pos, default=1, metavar="N", help="data-parallel replicas")
    g.add_argument("--tp", type=pos, default=1, metavar="N", help="tensor-parallel ranks (gpt)")
    g.add_argument("--pp", type=pos, default=1, metavar="N", help="pipeline stages")
    g.add_argument("--micro-batches", type=pos, metavar="M",
                   help="pipeline micro-batches per step (default 2 x pp)")
    g.add_argument("--schedule", choices=SCHEDULES, default="1f1b",
                   help="pipeline schedule (default 1f1b)")
    g.add_argument("--tp-chunks", type=pos, metavar="C",
                   help="--tp: all-reduce each row-parallel output in C token chunks, each "
                   "overlapping the next chunk's matmul (default 1: one all-reduce)")
    g.add_argument("--tp-overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="--tp: reduce the column-parallel input gradient while the weight "
                   "gradient is computed (default on); --no-tp-overlap waits for it at once")
    g.add_argument("--devices", type=pos, metavar="N",
                   help="devices to create, logical ones sharing an adapter when N exceeds the "
                   "adapters; overrides WGRUMUS_DEVICES (default: WGRUMUS_DEVICES, else one "
                   "per adapter)")
    g.add_argument("--backend", choices=("auto", "threads", "processes", "mpi"), default="auto",
                   help="processes: one process per device, started by wgrumus, collectives "
                   "through shared memory (replicas do not take turns on one interpreter); "
                   "threads: one process, one thread per device; mpi: one process per rank "
                   "under mpiexec; auto (default): mpi under mpiexec, processes when the "
                   "layout has a physical GPU adapter per device, threads otherwise (logical "
                   "devices, CPU adapters)")
    g = p.add_argument_group(
        "gpt size", "The defaults are sized for a CPU adapter (how long a run takes: README.md, "
        "'How long the commands take'). GPU sizes: --n-layer 4 --n-embd 128, or 256 with "
        "--block-size 128.")
    g.add_argument("--n-layer", type=pos, default=2, metavar="N",
                   help="transformer blocks (default 2)")
    g.add_argument("--n-embd", type=pos, default=64, metavar="N",
                   help="embedding width (default 64)")
    g.add_argument("--n-head", type=pos, default=4, metavar="N",
                   help="attention heads (default 4)")
    g.add_argument("--block-size", type=pos, default=32, metavar="T",
                   help="context length in characters (default 32)")
    g = p.add_argument_group("output")
    g.add_argument("--checkpoint", metavar="DIR",
                   help="save a training checkpoint there (atomically) every --checkpoint-every "
                   "steps, at the end and on Ctrl-C")
    g.add_argument("--checkpoint-every", type=pos, default=50, metavar="N",
                   help="steps between checkpoints (default 50)")
    g.add_argument("--resume", action="store_true", help="continue from --checkpoint DIR")
    g.add_argument("--overwrite", action="store_true",
                   help="start over in a --checkpoint DIR that already holds a checkpoint, "
                   "replacing it (without this or --resume such a DIR is refused)")
    g.add_argument("--plot", metavar="PNG",
                   help="loss curve file when matplotlib is installed (pip install "
                   "matplotlib); .png is added when PNG has no extension (default: "
                   "wgrumus-<model>-loss.png in the checkpoint directory or here); without "
                   "matplotlib a plot is drawn in the terminal")
    g.add_argument("--json", action="store_true", help="print one JSON object, nothing else")


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="train mlp | cnn | gpt, on one device or in parallel",
                       description="Train a model on one device or with data (--dp), tensor "
                       "(--tp) and pipeline (--pp) parallelism.")
    p.add_argument("model", help="mlp (8x8 digits), cnn (8x8 digits) or gpt (character-level "
                   "text)")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args) -> int:
    from . import loop  # the run's machinery (task, report, checkpoints): not for --help
    cfg = config_from_args(args)
    if cfg.layout.backend == "processes":
        from ..distributed import processes  # multiprocessing and /dev/shm: only for a run
        if not processes.launched():  # torchrun's model: this command again, once per rank
            return processes.run_command(args.argv, cfg.layout.world)
    return loop.train(cfg)
