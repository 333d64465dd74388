"""What `wgrumus train` and `wgrumus demo` were asked to do: the parallel layout and the run's
settings, every argument checked before any GPU work (each problem one UsageError line)."""
from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field

import wgrumus as wr

from ..runtime import adapters
from .checkpoint import FILE
from .common import UsageError

MODELS = ("mlp", "cnn", "gpt")
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zb-h1")
OPTIMIZERS = ("sgd", "adam", "adamw")


@dataclass
class Layout:
    dp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    micro_batches: int = 1
    backend: str = "threads"

    @property
    def world(self) -> int:
        return self.dp * self.tp * self.pp

    def product(self) -> str:
        """How the rank count comes about, for error messages that name the flags to change."""
        return f"--dp {self.dp} x --tp {self.tp} x --pp {self.pp} = {self.world}"

    def describe(self) -> str:
        s = f"dp={self.dp} tp={self.tp} pp={self.pp}"
        if self.pp > 1:
            s += f" schedule={self.schedule} micro-batches={self.micro_batches}"
        return s + f" on {self.world} device(s) ({self.backend})"


@dataclass
class TrainConfig:
    model: str
    steps: int | None
    epochs: float | None
    batch_size: int
    lr: float | None
    optimizer: str
    seed: int
    layout: Layout
    gpt: dict = field(default_factory=dict)
    checkpoint: str | None = None
    checkpoint_every: int = 50
    resume: bool = False
    plot: str | None = None
    json: bool = False
    title: str = "wgrumus train"
    clip: float | None = None
    lr_schedule: str = "constant"
    warmup: int = 0
    activation_checkpointing: bool = False
    precision: str = "f32"
    jit: bool = True
    grad_comm: str = "f32"
    grad_accum: int = 1
    sync_every: int | None = None
    local_sgd_warmup: int = 0
    tp_chunks: int | None = None  # TUNING.tp_chunks / tp_overlap while it trains (None: as is)
    tp_overlap: bool | None = None


def config_from_args(args) -> TrainConfig:
    """Check every argument before any GPU work; each problem is one UsageError line."""
    model = args.model.lower()
    _check_flags(args, model)
    gpt = {"n_layer": args.n_layer, "n_embd": args.n_embd, "n_head": args.n_head,
           "block_size": args.block_size}
    if model == "gpt":
        _check_gpt_sizes(args)
    m = args.micro_batches or (2 * args.pp if args.pp > 1 else 1)
    layout = Layout(args.dp, args.tp, args.pp, args.schedule, m,
                    _backend(args, model, args.dp * args.tp * args.pp))
    _check_devices(args, layout, create=False)  # a device shortfall is the first thing to fix
    batch = args.batch_size or (32 if model == "gpt" else 64)
    k = getattr(args, "grad_accum", 1)
    if batch % (args.dp * m * k):
        accum = f" x --grad-accum {k} micro-steps" if k > 1 else ""
        raise UsageError(f"--batch-size {batch} must split evenly into --dp {args.dp} replicas "
                         f"x {m} micro-batches{accum} (a multiple of {args.dp * m * k})")
    sync_every, warmup = _local_sgd(args)
    if args.schedule == "interleaved" and args.pp > 1 and m % args.pp:
        raise UsageError(f"the interleaved schedule needs --micro-batches divisible by --pp "
                         f"({m} by {args.pp})")
    _check_devices(args, layout)
    _check_outputs(args)
    grad_comm = getattr(args, "grad_comm", "f32")
    if args.precision == "f16":
        _check_f16(layout, "--precision f16", "use --precision f32")
    if grad_comm == "f16" and layout.dp > 1:
        _check_f16(layout, "--grad-comm f16", "use --grad-comm f32")
    return TrainConfig(model, args.steps, args.epochs, batch, args.lr, args.optimizer, args.seed,
                       layout, gpt, args.checkpoint, args.checkpoint_every, args.resume,
                       args.plot, args.json, getattr(args, "title", "wgrumus train"),
                       args.clip, args.lr_schedule, args.warmup,
                       args.activation_checkpointing, args.precision, args.jit,
                       grad_comm, k, sync_every, warmup or 0,
                       getattr(args, "tp_chunks", None), getattr(args, "tp_overlap", None))


def _check_flags(args, model: str) -> None:
    """The flags that contradict each other or the model, whatever the devices."""
    if model not in MODELS:
        raise UsageError(f"unknown model {args.model!r}; choose one of: {', '.join(MODELS)}")
    if args.steps is not None and args.epochs is not None:
        raise UsageError("give --steps or --epochs, not both")
    if args.resume and not args.checkpoint:
        raise UsageError("--resume needs --checkpoint DIR (the directory to resume from)")
    if args.resume and args.overwrite:
        raise UsageError("give --resume (continue the checkpoint) or --overwrite (replace it), "
                         "not both")
    if args.tp > 1 and model != "gpt":
        raise UsageError(f"--tp {args.tp}: tensor parallelism splits attention heads and MLP "
                         f"columns of the gpt model; use --dp/--pp for {model}")
    tp_chunks, tp_overlap = getattr(args, "tp_chunks", None), getattr(args, "tp_overlap", None)
    if (tp_chunks is not None or tp_overlap is not None) and args.tp == 1:
        flag = "--tp-chunks" if tp_chunks is not None else "--[no-]tp-overlap"
        raise UsageError(f"{flag} tunes tensor parallelism's all-reduces; add --tp N (N > 1) "
                         f"or drop {flag}")
    if args.warmup < 0:
        raise UsageError(f"--warmup {args.warmup}: the warmup is a number of steps >= 0")
    if args.activation_checkpointing and model != "gpt":
        raise UsageError(f"--activation-checkpointing recomputes the gpt model's transformer "
                         f"blocks; {model} has no blocks to checkpoint")


def _local_sgd(args) -> tuple:
    """(--sync-every, --local-sgd-warmup), checked."""
    sync_every, warmup = getattr(args, "sync_every", None), getattr(args, "local_sgd_warmup", None)
    if warmup is not None and sync_every is None:
        raise UsageError("--local-sgd-warmup sets when --sync-every's local steps start; give "
                         "--sync-every H too (or drop --local-sgd-warmup)")
    if warmup is not None and warmup < 0:
        raise UsageError(f"--local-sgd-warmup {warmup}: the warmup is a number of steps >= 0")
    return sync_every, warmup


def _check_outputs(args) -> None:
    """The checkpoint folder and plot file can be written (before any training)."""
    if args.checkpoint:
        _check_writable(args.checkpoint)
        if not args.resume and not args.overwrite:
            _refuse_existing(args.checkpoint)
    if args.plot:
        _check_plot_folder(args.plot)


def _check_f16(layout: Layout, flag: str, fix: str) -> None:
    """float16 on the device needs the adapter feature shader-f16 (this process's devices; under
    mpi each rank's adapter is checked when it opens)."""
    if layout.backend != "threads":
        return
    for d in wr.devices()[:layout.world]:
        if "shader-f16" not in d.features:
            raise UsageError(f"{flag} needs the adapter feature shader-f16, which {d.name} does "
                             f"not have; {fix}")


def _backend(args, model: str, world: int) -> str:
    """--backend, with auto resolved: mpi under an MPI launcher; processes for data parallelism
    alone over 4+ replicas or with --sync-every when every rank gets its own physical GPU
    adapter; threads otherwise. On 4 x H200 (BENCHMARKS.md, multi-adapter training) processes
    were faster only there: their ranks do not share an interpreter, but their shared-memory
    all-reduce is slower than the threads' engine, and pipeline / tensor-parallel messages are
    faster between threads."""
    from ..distributed import processes  # multiprocessing and /dev/shm: only for a run
    if args.backend != "auto":
        if args.backend in ("processes", "mpi") and model != "gpt" and args.pp > 1:
            raise UsageError(f"--backend {args.backend} runs --pp for the gpt model; for mlp/cnn "
                             f"use it with --dp only, or --pp with --backend threads")
        return args.backend
    if processes.launched():
        return "processes"
    if any(k in os.environ for k in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")):
        return "mpi"
    if world == 1 or args.devices is not None or os.environ.get("WGRUMUS_DEVICES") or \
            args.precision == "f16" or (model != "gpt" and args.pp > 1):
        return "threads"
    if args.tp > 1 or args.pp > 1 or (args.dp < 4 and getattr(args, "sync_every", None) is None):
        return "threads"
    gpus = [a for a in adapters.select_adapters()
            if str(a.info.get("adapter_type", "")).lower() != "cpu"]
    return "processes" if len(gpus) >= world else "threads"


def _check_gpt_sizes(args) -> None:
    """The gpt's shapes must split evenly: heads over the width and over tp, layers over pp."""
    if args.n_embd % args.n_head:
        raise UsageError(f"--n-embd {args.n_embd} is not divisible by --n-head {args.n_head}; "
                         f"choose a width that is a multiple of the head count")
    if args.n_head % args.tp:
        raise UsageError(f"--n-head {args.n_head} is not divisible by --tp {args.tp}; choose "
                         f"a --tp that divides the head count")
    if args.pp > args.n_layer:
        raise UsageError(f"--pp {args.pp} stages need at least {args.pp} layers "
                         f"(--n-layer is {args.n_layer})")


def _check_devices(args, layout: Layout, create: bool = True) -> None:
    """Enough devices (or MPI processes) for the layout; ``create``: --devices N makes them."""
    if layout.backend == "mpi":
        size = _mpi_size()
        if size != layout.world:
            raise UsageError(f"{layout.product()} ranks, but mpiexec started {size} "
                             f"process(es); run mpiexec -n {layout.world}")
    elif layout.backend == "processes":
        _check_processes(args, layout)
    elif args.devices is not None:
        if args.devices < layout.world:
            raise UsageError(f"{layout.product()} devices needed, but --devices is "
                             f"{args.devices}; pass --devices {layout.world} or more")
        # --devices overrides WGRUMUS_DEVICES (whose devices are then never made)
        ctx = getattr(wr.MultiGpuContext, "_instance", None)
        if create and (ctx is None or len(ctx.devices) != args.devices):
            wr.MultiGpuContext.reset(count=args.devices)
    elif layout.world > (have := len(wr.devices())):
        raise UsageError(f"{layout.product()} devices needed, but this process has {have}; pass "
                         f"--devices {layout.world} (logical devices share an adapter) or set "
                         f"WGRUMUS_DEVICES={layout.world}")


def _check_processes(args, layout: Layout) -> None:
    """One process per rank: each opens its own adapter, or shares the one adapter where
    logical devices were asked for (--devices, WGRUMUS_DEVICES). No device is made here."""
    from ..distributed import processes  # multiprocessing and /dev/shm: only for a run
    if processes.launched():
        size = int(os.environ.get(processes.ENV_WORLD, "0"))
        if size != layout.world:
            raise UsageError(f"{layout.product()} ranks, but this launch started {size}")
        return
    if args.devices is not None:
        if args.devices < layout.world:
            raise UsageError(f"{layout.product()} devices needed, but --devices is "
                             f"{args.devices}; pass --devices {layout.world} or more")
        return
    if os.environ.get("WGRUMUS_DEVICES"):
        return
    if layout.world > (have := len(adapters.select_adapters())):
        raise UsageError(f"{layout.product()} processes need as many adapters, but there are "
                         f"{have}; pass --devices {layout.world} (processes then share an "
                         f"adapter) or use fewer ranks")


def _mpi_size() -> int:
    try:
        from mpi4py import MPI  # optional, and importing it starts MPI: only under --backend mpi
    except ImportError:
        raise UsageError("--backend mpi needs mpi4py and an MPI launcher: pip install "
                         "'wgrumus[mpi]', then mpiexec -n N wgrumus train --backend mpi ...") \
            from None
    return MPI.COMM_WORLD.Get_size()


def _refuse_existing(folder: str) -> None:
    """A new run must not silently replace the checkpoint of an earlier one."""
    if os.path.exists(os.path.join(folder, FILE)):
        raise UsageError(f"--checkpoint {folder!r} already holds a checkpoint; pass --resume to "
                         f"continue it or --overwrite to start over and replace it")


def _check_plot_folder(path: str) -> None:
    """--plot names a file in a folder that exists (checked before training, with or without
    matplotlib, rather than after the run)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise UsageError(f"--plot {path!r}: folder {folder!r} does not exist; create it or "
                         f"pass a path in an existing folder")
    if not os.access(folder, os.W_OK):
        raise UsageError(f"--plot {path!r}: folder {folder!r} is not writable; pass a path in a "
                         f"folder you can write")


def _check_writable(path: str) -> None:
    try:
        os.makedirs(path, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f"--checkpoint {path!r} is not a writable directory "
                         f"({e.strerror or e})") from None
