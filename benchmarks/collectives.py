"""All-reduce bandwidth of wgrumus.distributed, per strategy and backend, against references.

    python benchmarks/collectives.py                  # threads backend, 2/4/8 ranks, 1 KB..256 MB
    python benchmarks/collectives.py --backend mpi    # starts mpiexec -n 2/4/8 itself
    python benchmarks/collectives.py --backend comm   # GPU buffers: CommThread per device
    python benchmarks/collectives.py --backend processes --ranks 2,4   # a process per adapter:
        # device all-reduce vs the bound at 16/64 MB, and the latency table (4 KB-16 MB)
    python benchmarks/collectives.py --backend comm --ranks 2 --chunks 1,2,4,8,16
    python benchmarks/collectives.py --backend comm --ranks 2 --chunks 2,4,8 --inflight 3,8 \
        --helper-mb 0.5,4 --spin-us 50   # the engine's and the barrier's constants, swept
    python benchmarks/collectives.py --backend comm --ranks 2 --blocking-waits   # A/B the waits
    python benchmarks/collectives.py --backend shm-host --ranks 2,4 --direct 0,4   # the
        # processes backend's host step alone: host-array all-reduce (f32, f16) and its round
        # split, 1-16 MB, each round reduce-scattered in a slot (0) or reduced by every rank (4)
    python benchmarks/collectives.py --quick          # a few sizes, 2 and 4 ranks
    python benchmarks/collectives.py --json           # one JSON object per measurement

algbw (GB/s) = bytes of the array / wall time of one all-reduce (the NCCL-tests definition);
busbw = algbw * 2(n-1)/n is what each rank's links carry in a ring. The comm backend all-reduces
device buffers in place (pipelined download through staging, barrier reduction, upload; 1-256 MB),
one rank per device: one per adapter, several logical devices per adapter when ranks outnumber
adapters; next to it the one-way staging rates measured in the same run, the bound they give and
the ratio algbw / bound. Each point is the slowest rank's mean over enough iterations to run
~0.2 s, after a warm-up call. References measured in the
same run: numpy memcpy (one copy of the array; the bound for a shared-memory reduction) and, when
torch is importable, torch.distributed gloo all-reduce between processes.

The processes backend (``dist.spawn(..., backend="processes")``, one process per adapter, shared
memory between them) gets two tables: device all-reduce bandwidth against the same bound as the
comm backend, min(down, up, mem / 4R), and against its own, min(down, up, mem / T): a
process cannot read another's mapped staging, so each element is also copied into the shared
slots. T counts the bytes touched over all ranks per byte: where each rank reduces every slot into
its upload buffer (up to WGRUMUS_SHM_DIRECT_RANKS ranks, default 2) down 1 + copy in 2 + reduce
R + 1 + up 1 per rank, T = R (R + 5); else each reduces a slice in a slot and copies the result
out, down 1 + copy in 2 + reduce (R + 1)/R + copy out 2 + up 1, T = 7R + 1; and latency
per size: send/recv one way (ping-pong between rank pairs, all pairs at once)
and all-reduce, with the host copy and the one-way device<->host copies of the same size measured
in the same run, and each transfer split into submit / fence wait / map / host copy / waiting for
the peer (runtime.staging.TransferPhases, per transfer, summed over both ends).
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wgrumus import distributed as dist  # noqa: E402

STRATEGIES = ["native", "ring", "tree", "centralized"]
FULL_SIZES = [1 << k for k in range(10, 29, 2)]  # 1 KB .. 256 MB
QUICK_SIZES = [1 << 10, 1 << 16, 1 << 20, 1 << 24]


def fmt_size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("KB", 1 << 10)):
        if n >= div:
            return f"{n // div} {unit}"
    return f"{n} B"


def iterations(seconds_per_call: float, budget: float = 0.2) -> int:
    return int(min(50, max(2, budget / max(seconds_per_call, 1e-7))))


WARMUP = 3


def time_all_reduce(g, nbytes: int, strategy: str) -> float:
    """Seconds per all-reduce on this rank (mean after warm-up calls); every rank runs the same
    iteration count (agreed through a broadcast)."""
    x = np.full(nbytes // 4, g.rank + 1, dtype=np.float32)
    for _ in range(WARMUP):  # the first calls of a size fault in fresh pages (~15x slower)
        t0 = time.perf_counter()
        g.all_reduce(x, "sum", strategy=strategy)
        warm = time.perf_counter() - t0  # the last one sizes the loop
    n = int(g.broadcast(np.array([iterations(warm)], np.int64), root=0)[0])
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        g.all_reduce(x, "sum", strategy=strategy)
    g.barrier()
    return (time.perf_counter() - t0) / n


def sweep(g, sizes, strategies, max_bytes_total) -> list[dict]:
    rows = []
    for s in strategies:
        for nbytes in sizes:
            if nbytes * g.world_size * 3 > max_bytes_total:
                continue
            sec = time_all_reduce(g, nbytes, s)
            worst = max(g.all_gather_object(sec))
            algbw = nbytes / worst / 1e9
            rows.append({"backend": g.backend, "strategy": s, "ranks": g.world_size,
                         "bytes": nbytes, "seconds": worst, "algbw_GBps": algbw,
                         "busbw_GBps": algbw * 2 * (g.world_size - 1) / g.world_size})
    return rows


def memcpy_reference(sizes) -> list[dict]:
    rows = []
    for nbytes in sizes:
        src = np.ones(nbytes // 4, np.float32)
        dst = np.empty_like(src)
        np.copyto(dst, src)
        n = iterations(1e-6 + nbytes / 5e9)
        t0 = time.perf_counter()
        for _ in range(n):
            np.copyto(dst, src)
        sec = (time.perf_counter() - t0) / n
        rows.append({"backend": "numpy", "strategy": "memcpy", "ranks": 1, "bytes": nbytes,
                     "seconds": sec, "algbw_GBps": nbytes / sec / 1e9, "busbw_GBps": None})
    return rows


def gloo_reference(sizes, worlds) -> list[dict]:
    """torch.distributed gloo all-reduce between processes, when torch is importable."""
    try:
        import torch.multiprocessing as mp
    except ImportError:
        return []
    rows = []
    for world in worlds:
        q = mp.get_context("spawn").SimpleQueue()
        mp.spawn(_gloo_worker, args=(world, sizes, q), nprocs=world, join=True)
        while not q.empty():
            rows.append(q.get())
    return rows


def _gloo_worker(rank, world, sizes, q):
    import torch
    import torch.distributed as tdist
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    for nbytes in sizes:
        x = torch.ones(nbytes // 4)
        tdist.all_reduce(x)
        n = iterations(1e-4 + nbytes / 1e9)
        tdist.barrier()
        t0 = time.perf_counter()
        for _ in range(n):
            tdist.all_reduce(x)
        tdist.barrier()
        sec = torch.tensor([(time.perf_counter() - t0) / n], dtype=torch.float64)
        tdist.all_reduce(sec, op=tdist.ReduceOp.MAX)
        if rank == 0:
            a = nbytes / sec.item() / 1e9
            q.put({"backend": "torch", "strategy": "gloo", "ranks": world, "bytes": nbytes,
                   "seconds": sec.item(), "algbw_GBps": a,
                   "busbw_GBps": a * 2 * (world - 1) / world})
    tdist.destroy_process_group()


def run_threads(args, sizes, worlds) -> list[dict]:
    rows = []
    for w in worlds:
        res = dist.spawn(lambda g: sweep(g, sizes, args.strategies, args.max_memory), w,
                         timeout=600)
        rows.extend(res[0])
    return rows


def run_mpi(args, sizes, worlds) -> list[dict]:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    mpiexec = str(mpiexec) if mpiexec.exists() else shutil.which("mpiexec")
    if mpiexec is None:
        print("mpiexec not found: pip install 'wgrumus[mpi]'", file=sys.stderr)
        return []
    rows = []
    for w in worlds:
        cmd = [mpiexec, "-n", str(w), sys.executable, __file__, "--mpi-worker",
               "--sizes", ",".join(map(str, sizes)), "--strategies", ",".join(args.strategies),
               "--max-memory", str(args.max_memory)]
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        if p.returncode != 0:
            print(f"mpiexec -n {w} failed:\n{p.stderr[-2000:]}", file=sys.stderr)
            continue
        rows.extend(json.loads(line) for line in p.stdout.splitlines() if line.startswith("{"))
    return rows


COMM_SIZES = [1 << k for k in range(20, 29, 2)]  # 1 MB .. 256 MB


def comm_devices(n):
    """n runtime Devices: one per adapter, several logical devices per adapter beyond that."""
    import wgpu

    from wgrumus.runtime.device import Device
    adapters = wgpu.gpu.enumerate_adapters_sync()
    hw = [a for a in adapters if a.info.get("adapter_type", "").lower() != "cpu"
          and "llvmpipe" not in a.summary.lower()]
    native = [a for a in hw if a.info.get("backend_type", "").lower() != "opengl"]
    adapters = native or hw or adapters[:1]  # one adapter per GPU: skip GL twins of Vulkan ones
    if not adapters:
        return [], 0
    return ([Device(i, adapters[i % len(adapters)], logical=i // len(adapters))
             for i in range(n)], len(adapters))


def on_all(devs, fn):
    """Run fn(rank) on one thread per device, started together; seconds until the last ends."""
    import threading
    start, ends, errs = threading.Barrier(len(devs) + 1), [0.0] * len(devs), []

    def body(r):
        start.wait()
        try:
            fn(r)
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errs.append(e)
        ends[r] = time.perf_counter()

    ts = [threading.Thread(target=body, args=(r,)) for r in range(len(devs))]
    for t in ts:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    if errs:
        raise errs[0]
    return max(ends) - t0


def one_way(dev, buf, nbytes, down: bool):
    """One copy of the whole buffer between the device and a mapped staging buffer, through the
    engine's staging (runtime/staging.py), until its map completes: the link's one-way rate
    with no chunking overhead."""
    from wgrumus.runtime.staging import staging_of
    st, deadline = staging_of(dev), time.monotonic() + 600
    sb = st.reader(nbytes) if down else st.writer(nbytes, deadline)
    sb.unmap()  # a writer comes mapped (ready to fill)
    copy = (buf, 0, sb.buffer, 0, nbytes) if down else (sb.buffer, 0, buf, 0, nbytes)
    st.submit([copy], [sb])
    sb.wait(deadline)  # a reader's map resolves once the copy is done
    if down:
        sb.unmap()
    else:
        dev.synchronize()  # a writer's map does not wait for the copy out of it: wait here
    st.give_back(sb)


def mapped_touch(dev, nbytes: int, k: int = 5) -> dict:
    """Median seconds to copy ``nbytes`` out of a READ staging buffer just mapped (first touch)
    and once more (same mapping), and into a WRITE one: first much slower than again means each
    map faults its pages in anew, which every staged chunk pays in its host copy."""
    from wgrumus.runtime.staging import staging_of
    st, deadline = staging_of(dev), time.monotonic() + 600
    host = np.ones(nbytes, np.uint8)
    times = {"read_first_s": [], "read_again_s": [], "write_first_s": [], "write_again_s": []}
    for _ in range(k):
        r = st.reader(nbytes)
        st.submit([], [r])
        r.wait(deadline)
        w = st.writer(nbytes, deadline)
        for name, sb, copy in (("read", r, lambda a: np.copyto(host, a)),
                               ("write", w, lambda a: np.copyto(a, host))):
            a = sb.array(np.uint8, nbytes)
            for when in ("first", "again"):
                t0 = time.perf_counter()
                copy(a)
                times[f"{name}_{when}_s"].append(time.perf_counter() - t0)
            del a
        r.unmap()
        st.give_back(r)
        st.give_back(w)
    return {key: float(np.median(v)) for key, v in times.items()}


def host_memory_rate(nbytes: int = 256 << 20) -> float:
    """GB/s of host memory traffic (bytes read + written) of a large copy split over the
    staging's copy threads, best of three: what the DMA engines and the host reduction share."""
    from wgrumus.runtime.staging import par_copy
    src, dst = np.ones(nbytes, np.uint8), np.ones(nbytes, np.uint8)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        par_copy(dst, src)
        best = min(best, time.perf_counter() - t0)
    return 2 * nbytes / best / 1e9


def run_comm(args, sizes, worlds) -> list[dict]:
    """GPU buffers all-reduced in place by one CommThread per device, next to the one-way staging
    rates of the same devices and sizes measured in the same run (one whole-buffer copy per
    direction, all ranks at once, so a shared link is shared here too) and the host's memory
    rate. bound = min(down, up, mem / 4R): the all-reduce moves each rank's bytes down once and
    up once, and can at best overlap the two directions completely; and through host memory
    every element of each of the R ranks is touched four times (written by the download, read
    and written by the reduction, read by the upload), so R ranks' all-reduce of B bytes moves
    4RB bytes of host memory."""
    from wgrumus.distributed.comm import CommThread
    devs, n_adapters = comm_devices(max(worlds))
    if not devs:
        print("no WebGPU adapter: comm backend skipped", file=sys.stderr)
        return []
    from wgrumus.distributed import barrier as barrier_mod
    from wgrumus.distributed import host_reduce
    label = f"comm:{n_adapters}ad"
    sizes = [s for s in sizes if s >= 1 << 20] if not args.sizes else sizes
    if args.spin_us is not None:
        barrier_mod.SPIN_S = args.spin_us * 1e-6
    mem = host_memory_rate()
    rows = []
    for w, chunk, inflight, helper in itertools.product(worlds, args.chunks, args.inflight,
                                                        args.helper_mb):
        if helper is not None:
            host_reduce.HELPER_BYTES = helper
        tag = "".join([f" i{inflight}" if inflight else "",
                       f" h{helper / (1 << 20):g}M" if helper is not None else ""])
        comms = [CommThread(d, rank=i, chunk_bytes=chunk, **(
            {"inflight": inflight} if inflight else {})) for i, d in enumerate(devs[:w])]
        for nbytes in sizes:
            if nbytes > min(d.max_binding for d in devs[:w]) or \
                    nbytes * w * 4 > args.max_memory:
                continue
            row = _comm_point(devs[:w], comms, nbytes, chunk, label, mem)
            row["strategy"] += tag
            rows.append(row)
        for c in comms:
            c.close()
    return rows


def _comm_point(devs, comms, nbytes, chunk, label, mem) -> dict:
    from wgrumus.distributed.comm import BufferSlice, async_allreduce
    w = len(devs)
    bufs = [d.alloc(nbytes) for d in devs]
    for i, (d, b) in enumerate(zip(devs, bufs)):
        d.write(b, np.full(nbytes // 4, i + 1, np.float32))
        d.synchronize()
    barrier = dist.CollectiveBarrier(w, timeout=600)
    slices = [BufferSlice(d, b, 0, nbytes, np.float32) for d, b in zip(devs, bufs)]

    def once():
        hs = [async_allreduce(c, s, barrier, "sum") for c, s in zip(comms, slices)]
        for h in hs:
            h.wait()
        for d in devs:
            d.synchronize()  # the uploads have landed

    def rate(fn):
        on_all(devs, fn)  # warm-up: staging buffers are made on the first call
        n = iterations(on_all(devs, fn))
        return nbytes * n / sum(on_all(devs, fn) for _ in range(n)) / 1e9

    down = rate(lambda r: one_way(devs[r], bufs[r], nbytes, True))
    up = rate(lambda r: one_way(devs[r], bufs[r], nbytes, False))
    reduce = rate(_host_reduction(w, nbytes, chunk))
    for _ in range(WARMUP):  # staging buffers are made and mapped on the first calls
        t0 = time.perf_counter()
        once()
    n = iterations(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(n):
        once()
    sec = (time.perf_counter() - t0) / n
    barrier.close()
    a = nbytes / sec / 1e9
    bound = min(down, up, mem / (4 * w))
    return {"backend": label, "strategy": f"pipe{fmt_size(chunk).replace(' ', '')}", "ranks": w,
            "bytes": nbytes, "seconds": sec, "algbw_GBps": a, "busbw_GBps": a * 2 * (w - 1) / w,
            "down_GBps": down, "up_GBps": up, "reduce_GBps": reduce, "mem_GBps": mem,
            "bound_GBps": bound, "ratio": a / bound}


def _host_reduction(w, nbytes, chunk):
    """fn(rank) reducing nbytes the way the engine's host step does (one exchange round per
    chunk, into a second array), on host arrays: whether the reduction keeps up with the link."""
    n = min(chunk, nbytes) // 4
    ins = [np.full(n, r + 1, np.float32) for r in range(w)]
    outs = [np.empty(n, np.float32) for _ in range(w)]
    barrier = dist.CollectiveBarrier(w, timeout=600)

    def fn(r):
        for _ in range(max(1, nbytes // (n * 4))):
            barrier.exchange(n, np.float32, r, ins[r], 0, outs[r], 0, "sum")
    return fn  # its barrier's helpers end once fn is dropped


def print_comm_table(rows):
    rows = [r for r in rows if "bound_GBps" in r and "table" not in r]
    if not rows:
        return
    print("\ncomm: algbw vs the bound from the one-way staging rates and the host memory rate "
          "measured in the same run (GB/s per rank, all ranks at once; mem = host memory "
          "traffic of a parallel copy; bound = min(down, up, mem / 4R); reduce = the host step "
          "alone on host arrays)")
    head = (f"{'backend':9} {'chunk':17} {'ranks':>5} {'size':>8} | {'algbw':>7} {'down':>7} "
            f"{'up':>7} {'reduce':>7} {'mem':>7} {'bound':>7} {'ratio':>6}")
    print(head)
    print("-" * len(head))
    for r in sorted(rows, key=lambda r: (r["ranks"], r["strategy"], r["bytes"])):
        print(f"{r['backend']:9} {r['strategy']:17} {r['ranks']:>5} {fmt_size(r['bytes']):>8} | "
              f"{r['algbw_GBps']:7.3f} {r['down_GBps']:7.3f} {r['up_GBps']:7.3f} "
              f"{r['reduce_GBps']:7.3f} {r.get('mem_GBps', 0):7.1f} {r['bound_GBps']:7.3f} "
              f"{r['ratio']:6.2f}")


BW_SIZES = [16 << 20, 64 << 20]
LAT_SIZES = [4 << 10, 16 << 10, 64 << 10, 256 << 10, 512 << 10, 1 << 20, 4 << 20, 16 << 20]
PHASES = ("submit", "fence", "map", "copy", "peer")


def run_processes(args, worlds) -> list[dict]:
    """One process per adapter (several on one adapter only where there are fewer adapters)."""
    from functools import partial
    bw = [int(x) for x in args.sizes.split(",")] if args.sizes else BW_SIZES
    mem = host_memory_rate()
    rows = []
    lat = [int(x) for x in args.latency_sizes.split(",")] if args.latency_sizes else LAT_SIZES
    for w, chunk, direct in itertools.product(
            worlds, args.chunks if args.chunks_given else [None], args.direct or [None]):
        if chunk is not None:  # the ranks read it when they all-reduce
            os.environ["WGRUMUS_SHM_CHUNK"] = str(chunk)
        if direct is not None:
            os.environ["WGRUMUS_SHM_DIRECT_RANKS"] = str(direct)
        res = dist.spawn(partial(_processes_rank, bw, lat, mem), w, backend="processes",
                         timeout=600)
        for r in res[0]:
            r["chunk"], r["direct"] = chunk, direct
        rows.extend(res[0])
        os.environ.pop("WGRUMUS_SHM_DIRECT_RANKS", None)
    os.environ.pop("WGRUMUS_SHM_CHUNK", None)
    return rows


def _agreed_loop(g, fn, budget=0.2) -> tuple[float, int]:
    """Seconds per call of ``fn`` (every rank the same count), the slowest rank's."""
    for _ in range(WARMUP):
        t0 = time.perf_counter()
        fn()
        warm = time.perf_counter() - t0
    n = int(g.broadcast(np.array([iterations(warm, budget)], np.int64), root=0)[0])
    g.barrier()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    g.device.synchronize()
    sec = (time.perf_counter() - t0) / n
    return max(g.all_gather_object(sec)), n


def _phase_delta(g, before) -> dict:
    after = g._t.phases.snapshot() if g._t.phases is not None else {}
    return {k: after.get(k, (0.0, 0))[0] - before.get(k, (0.0, 0))[0] for k in PHASES}


def _snapshot(g) -> dict:
    return g._t.phases.snapshot() if g._t.phases is not None else {}


def shm_touches(R: int) -> int:
    """Bytes touched over all ranks per byte of a device all-reduce through the shared slots."""
    from wgrumus.distributed.transport.shm_rounds import DIRECT_RANKS
    direct = int(os.environ.get("WGRUMUS_SHM_DIRECT_RANKS", DIRECT_RANKS))
    return R * (R + 5) if R <= direct else 7 * R + 1


def _processes_rank(bw_sizes, lat_sizes, mem, g) -> list[dict]:
    import wgrumus as wr
    dev, R = g.device, g.world_size
    label = f"processes:{dev.adapter_info.get('device', '?')[:20]}"
    rows = []

    def rates(x, nbytes):
        buf = x.buffer_slice().buffer
        out = []
        for down in (True, False):
            sec, _ = _agreed_loop(g, lambda: one_way(dev, buf, nbytes, down))
            out.append(nbytes / sec / 1e9)
        return out

    for nbytes, dtype in itertools.product(bw_sizes, (np.float32, np.float16)):
        # float16: the same values in half the bytes (--grad-comm f16's gradients)
        box = [wr.tensor(np.full(nbytes // 4, g.rank + 1, dtype), device=dev)]
        if dtype is np.float32:
            down, up = rates(box[0], nbytes)

        def ar():
            box[0] = g.all_reduce(box[0], "mean")
        sec, _ = _agreed_loop(g, ar)
        size = nbytes // 4 * np.dtype(dtype).itemsize
        a = size / sec / 1e9
        bound, bound_shm = min(down, up, mem / (4 * R)), min(down, up, mem / shm_touches(R))
        rows.append({"backend": label, "strategy": "device all-reduce", "ranks": R,
                     "bytes": size, "dtype": np.dtype(dtype).name, "seconds": sec,
                     "algbw_GBps": a, "busbw_GBps": a * 2 * (R - 1) / R, "down_GBps": down,
                     "up_GBps": up, "mem_GBps": mem, "bound_GBps": bound, "ratio": a / bound,
                     "bound_shm_GBps": bound_shm, "ratio_shm": a / bound_shm, "table": "bw"})
    partner = g.rank ^ 1
    for nbytes in lat_sizes:
        box = [wr.tensor(np.full(nbytes // 4, g.rank + 1, np.float32), device=dev)]

        def pingpong():
            if partner >= R:
                return
            if g.rank % 2 == 0:
                g.send(box[0], partner)
                box[0] = g.recv(partner, device=dev)
            else:
                box[0] = g.recv(partner, device=dev)
                g.send(box[0], partner)
        before = _snapshot(g)
        sec, n = _agreed_loop(g, pingpong)
        split_p2p = {k: v / n for k, v in _phase_delta(g, before).items()}  # 1 send + 1 recv

        def ar():
            box[0] = g.all_reduce(box[0], "mean")
        before = _snapshot(g)
        sec_ar, n_ar = _agreed_loop(g, ar)
        split_ar = {k: v / n_ar for k, v in _phase_delta(g, before).items()}
        refs = _one_rank_references(g, dev, box[0], nbytes)
        rows.append({"backend": label, "strategy": "latency", "ranks": R, "bytes": nbytes,
                     "seconds": sec / 2, "sendrecv_s": sec / 2, "allreduce_s": sec_ar,
                     "algbw_GBps": nbytes / sec_ar / 1e9, "busbw_GBps": None,
                     "split_sendrecv": split_p2p, "split_allreduce": split_ar, **refs,
                     "table": "latency"})
    return rows


SHM_HOST_SIZES = [1 << 20, 4 << 20, 16 << 20]


def run_shm_host(args, worlds) -> list[dict]:
    """The processes backend's host step alone: all-reduce of host arrays through the shared
    slots (what a device all-reduce does between its download and its upload)."""
    from functools import partial
    sizes = [int(x) for x in args.sizes.split(",")] if args.sizes else SHM_HOST_SIZES
    mem = host_memory_rate()
    rows = []
    for w, direct in itertools.product(worlds, args.direct or [None]):
        if direct is not None:  # the ranks read it at each round
            os.environ["WGRUMUS_SHM_DIRECT_RANKS"] = str(direct)
        res = dist.spawn(partial(_shm_host_rank, sizes, mem), w, backend="processes",
                         timeout=600)
        for r in res[0]:
            r["direct"] = direct
        rows.extend(res[0])
    os.environ.pop("WGRUMUS_SHM_DIRECT_RANKS", None)
    return rows


def _shm_host_rank(sizes, mem, g) -> list[dict]:
    from wgrumus.runtime.staging import TransferPhases
    t, R = g._t, g.world_size
    rows = []
    for dtype, nbytes in itertools.product((np.float32, np.float16), sizes):
        x = np.full(nbytes // np.dtype(dtype).itemsize, g.rank + 1, dtype)
        out = np.empty_like(x)
        sec, n = _agreed_loop(g, lambda: g.all_reduce(x, "sum"))
        # the device path's round alone: into a reused output, one slot-sized chunk a round
        per = t._per_chunk(dtype)

        def rounds(ph=None):
            for lo in range(0, x.size, per):
                hi = min(lo + per, x.size)
                t.reduce_chunk(x[lo:hi], out[lo:hi], "sum", time.monotonic() + 60, ph)
        sec_r, n_r = _agreed_loop(g, rounds)
        ph = TransferPhases()
        for _ in range(n_r):
            rounds(ph)
        split = {k: ph.seconds[k] / n_r for k in ("copy", "peer")}
        want = R * (R + 1) / 2
        if not np.all(out == want):
            raise AssertionError(f"rank {g.rank}: all-reduce of {dtype.__name__} gave "
                                 f"{out[:4]}..., not {want}")
        rows.append({"backend": "processes:host", "strategy": "shm-host", "ranks": R,
                     "bytes": nbytes, "dtype": np.dtype(dtype).name, "seconds": sec,
                     "algbw_GBps": nbytes / sec / 1e9, "round_s": sec_r,
                     "round_GBps": nbytes / sec_r / 1e9, "split": split, "mem_GBps": mem,
                     "table": "shm-host"})
    return rows


def print_shm_host_table(rows):
    rows = [r for r in rows if r.get("table") == "shm-host"]
    if not rows:
        return
    print(f"\nprocesses backend, host step (host memory "
          f"{rows[0]['mem_GBps']:.1f} GB/s for one copy)")
    print(f"{'ranks':>5} {'direct':>6} {'dtype':>7} {'size':>7} {'all_reduce ms':>14} {'GB/s':>6} "
          f"{'round ms':>9} {'GB/s':>6} {'copy+reduce ms':>15} {'peer ms':>8}")
    for r in rows:
        d = "-" if r.get("direct") is None else r["direct"]
        print(f"{r['ranks']:>5} {d:>6} {r['dtype']:>7} {fmt_size(r['bytes']):>7} "
              f"{r['seconds'] * 1e3:>14.3f} {r['algbw_GBps']:>6.2f} {r['round_s'] * 1e3:>9.3f} "
              f"{r['round_GBps']:>6.2f} {r['split']['copy'] * 1e3:>15.3f} "
              f"{r['split']['peer'] * 1e3:>8.3f}")


def _one_rank_references(g, dev, x, nbytes) -> dict:
    """Rank 0 alone (the others wait): host copy, device->host and host->device of nbytes."""
    out = {}
    if g.rank == 0:
        src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
        buf = x.buffer_slice().buffer

        def best(fn, k=20):
            fn()
            ts = []
            for _ in range(k):
                t0 = time.perf_counter()
                fn()
                ts.append(time.perf_counter() - t0)
            return float(np.median(ts))
        out = {"hostcopy_s": best(lambda: np.copyto(dst, src)),
               "down_s": best(lambda: one_way(dev, buf, nbytes, True)),
               "up_s": best(lambda: one_way(dev, buf, nbytes, False)),
               **mapped_touch(dev, nbytes)}
    g.barrier()
    keys = ("hostcopy_s", "down_s", "up_s", "read_first_s", "read_again_s", "write_first_s",
            "write_again_s")
    vals = g.broadcast(np.array([out.get(k, 0.0) for k in keys]), root=0)
    return dict(zip(keys, vals.tolist()))


def _chunk(r) -> str:
    c = fmt_size(r["chunk"]).replace(" ", "") if r.get("chunk") else "slot"
    return c if r.get("direct") is None else f"{c}/d{r['direct']}"  # --direct: the setting


def _values(r) -> int:
    return r["bytes"] // np.dtype(r.get("dtype", "float32")).itemsize


def print_processes_tables(rows):
    bw = [r for r in rows if r.get("table") == "bw"]
    lat = [r for r in rows if r.get("table") == "latency"]
    if bw:
        print("\nprocesses: device all-reduce, one process per adapter, vs the bounds from the "
              "one-way staging rates and the host memory rate of the same run (GB/s; bound = "
              "min(down, up, mem / 4R) as for comm; shm bound = min(down, up, mem / T), "
              "T = R (R + 5) where each rank reduces every slot, else 7R + 1; float16 rows: "
              "the same values as the float32 row above them, summed on the device, against the "
              "same bounds)")
        head = (f"{'ranks':>5} {'chunk':>7} {'dtype':>7} {'size':>8} | {'algbw':>7} {'down':>7} "
                f"{'up':>7} {'mem':>6} {'bound':>7} {'ratio':>6} {'shm bd':>7} {'ratio':>6} "
                f"{'ms':>8}")
        print(head)
        print("-" * len(head))
        for r in sorted(bw, key=lambda r: (r["ranks"], r.get("chunk") or 0, r.get("direct") or 0,
                                             _values(r), r.get("dtype") == "float16")):
            print(f"{r['ranks']:>5} {_chunk(r):>7} {r.get('dtype', 'float32'):>7} "
                  f"{fmt_size(r['bytes']):>8} | "
                  f"{r['algbw_GBps']:7.3f} "
                  f"{r['down_GBps']:7.3f} {r['up_GBps']:7.3f} {r['mem_GBps']:6.1f} "
                  f"{r['bound_GBps']:7.3f} {r['ratio']:6.2f} {r['bound_shm_GBps']:7.3f} "
                  f"{r['ratio_shm']:6.2f} {r['seconds'] * 1e3:8.3f}")
    if lat:
        print("\nprocesses: latency in us (send/recv one way, pairs of ranks at once; all-reduce "
              "over all ranks; references of the same run on one rank: host copy, "
              "device->host, host->device of the same size). split = submit/fence/map/copy/"
              "peer per transfer, both ends summed (send/recv) or per rank (all-reduce)")
        head = (f"{'ranks':>5} {'chunk':>7} {'size':>8} | {'send':>8} {'allred':>8} | {'host':>7} "
                f"{'d->h':>7} {'h->d':>7} | {'send/recv split':>32} | {'all-reduce split':>32}")
        print(head)
        print("-" * len(head))
        for r in sorted(lat, key=lambda r: (r["ranks"], r.get("chunk") or 0, r.get("direct") or 0,
                                             r["bytes"])):
            sp = "/".join(f"{r['split_sendrecv'][k] * 1e6:.0f}" for k in PHASES)
            sa = "/".join(f"{r['split_allreduce'][k] * 1e6:.0f}" for k in PHASES)
            print(f"{r['ranks']:>5} {_chunk(r):>7} {fmt_size(r['bytes']):>8} | "
                  f"{r['sendrecv_s'] * 1e6:8.1f} "
                  f"{r['allreduce_s'] * 1e6:8.1f} | {r['hostcopy_s'] * 1e6:7.1f} "
                  f"{r['down_s'] * 1e6:7.1f} {r['up_s'] * 1e6:7.1f} | {sp:>32} | {sa:>32}")
        touched = [r for r in lat if "read_first_s" in r and r["ranks"] == lat[0]["ranks"]]
        if touched:
            print("\nmapped staging, host copy of the whole size (us): first touch after a map "
                  "vs once more (first >> again: each map faults its pages in anew)")
            print(f"{'size':>8} | {'read 1st':>9} {'again':>9} | {'write 1st':>9} {'again':>9}")
            for r in touched:
                print(f"{fmt_size(r['bytes']):>8} | {r['read_first_s'] * 1e6:9.1f} "
                      f"{r['read_again_s'] * 1e6:9.1f} | {r['write_first_s'] * 1e6:9.1f} "
                      f"{r['write_again_s'] * 1e6:9.1f}")


def mpi_worker(args):
    g = dist.init_process_group("mpi", timeout=600)
    rows = sweep(g, [int(s) for s in args.sizes.split(",")], args.strategies, args.max_memory)
    if g.rank == 0:
        for r in rows:
            print(json.dumps(r), flush=True)


def load_rows(paths) -> list[dict]:
    """Rows from files written with --json (to print one table for several runs)."""
    return [json.loads(line) for p in paths for line in Path(p).read_text().splitlines()
            if line.startswith("{")]


def print_table(rows):
    if not rows:
        return
    sizes = sorted({r["bytes"] for r in rows})
    keys = sorted({(r["backend"], r["strategy"], r["ranks"]) for r in rows},
                  key=lambda k: (k[0] != "numpy", k[0], k[2], k[1]))
    by = {(r["backend"], r["strategy"], r["ranks"], r["bytes"]): r for r in rows}
    head = f"{'backend':8} {'strategy':12} {'ranks':>5} | " + " ".join(
        f"{fmt_size(s):>8}" for s in sizes)
    print("algbw GB/s (bytes per all-reduce / wall time)")
    print(head)
    print("-" * len(head))
    for b, s, n in keys:
        cells = []
        for size in sizes:
            r = by.get((b, s, n, size))
            cells.append(f"{r['algbw_GBps']:8.3f}" if r else f"{'-':>8}")
        print(f"{b:8} {s:12} {n:>5} | " + " ".join(cells))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["threads", "mpi", "comm", "processes", "shm-host",
                                         "both", "all", "none"],
                   default="threads",
                   help="both = threads + mpi; all = threads + mpi + comm + processes; none = "
                   "references")
    p.add_argument("--ranks", default="2,4,8", help="comma-separated world sizes")
    p.add_argument("--strategies", default=",".join(STRATEGIES))
    p.add_argument("--sizes", default=None, help="comma-separated byte sizes")
    p.add_argument("--quick", action="store_true", help="4 sizes, 2 and 4 ranks")
    p.add_argument("--json", action="store_true", help="print one JSON object per point")
    p.add_argument("--no-reference", action="store_true", help="skip memcpy/gloo references")
    p.add_argument("--chunks", default=None,
                   help="comm / processes backend: comma-separated chunk sizes in MiB to "
                        "compare (default: the engine's CHUNK_BYTES / a shared slot)")
    p.add_argument("--inflight", default=None,
                   help="comm backend: comma-separated chunk downloads in flight to compare "
                        "(default: the engine's)")
    p.add_argument("--helper-mb", default=None,
                   help="comm backend: comma-separated host_reduce.HELPER_BYTES values in MiB to "
                        "compare (a helper thread joins a round per this many bytes)")
    p.add_argument("--spin-us", type=float, default=None,
                   help="comm backend: barrier.SPIN_S in microseconds (polling before blocking)")
    p.add_argument("--blocking-waits", action="store_true",
                   help="map waits block in wgpuDevicePoll, as on CPU adapters (default on a "
                        "GPU: they poll; runtime/tuning.py blocking_waits)")
    p.add_argument("--direct", default=None,
                   help="processes / shm-host backend: comma-separated WGRUMUS_SHM_DIRECT_RANKS "
                   "values to compare (0: every round reduce-scatters into a slot and copies "
                   "out; >= ranks: each rank reduces every slot into its output)")
    p.add_argument("--latency-sizes", default=None,
                   help="processes backend: comma-separated byte sizes of the latency table "
                   "(default 4 KB .. 16 MB)")
    p.add_argument("--max-memory", type=int, default=None,
                   help="bytes of host memory the arrays may use (default: half of RAM)")
    p.add_argument("--table", nargs="+", metavar="JSONL",
                   help="print the table of earlier --json outputs and exit")
    p.add_argument("--mpi-worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.blocking_waits:  # (the environment reaches ranks in other processes)
        os.environ["WGRUMUS_BLOCKING_WAITS"] = "1"
        from wgrumus.runtime.tuning import TUNING
        TUNING.blocking_waits = True
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.chunks_given = bool(args.chunks)
    if args.chunks:
        args.chunks = [int(float(c) * (1 << 20)) for c in args.chunks.split(",")]
    else:
        from wgrumus.distributed.staged_collectives import CHUNK_BYTES
        args.chunks = [CHUNK_BYTES]
    args.inflight = [int(v) for v in args.inflight.split(",")] if args.inflight else [None]
    args.direct = [int(v) for v in args.direct.split(",")] if args.direct else None
    args.helper_mb = ([int(float(v) * (1 << 20)) for v in args.helper_mb.split(",")]
                      if args.helper_mb else [None])
    if args.max_memory is None:
        args.max_memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2
    if args.mpi_worker:
        return mpi_worker(args)
    if args.table:
        rows = load_rows(args.table)
        print_table([r for r in rows if "table" not in r])
        print_comm_table(rows)
        print_shm_host_table(rows)
        return print_processes_tables(rows)
    sizes = ([int(s) for s in args.sizes.split(",")] if args.sizes
             else QUICK_SIZES if args.quick else COMM_SIZES if args.backend == "comm"
             else FULL_SIZES)
    worlds = [2, 4] if args.quick else [int(w) for w in args.ranks.split(",")]
    rows = []
    if not args.no_reference:
        rows += memcpy_reference(sizes)
    if args.backend in ("threads", "both", "all"):
        rows += run_threads(args, sizes, worlds)
    if args.backend in ("mpi", "both", "all"):
        rows += run_mpi(args, sizes, worlds)
    if args.backend in ("comm", "all"):
        rows += run_comm(args, sizes, worlds)
    if args.backend in ("processes", "all"):
        rows += run_processes(args, worlds)
    if args.backend == "shm-host":
        rows += run_shm_host(args, worlds)
    if not args.no_reference:
        rows += gloo_reference(sizes, worlds)
    if args.json:
        for r in rows:
            print(json.dumps(r))
    else:
        print_table([r for r in rows if "table" not in r])
        print_comm_table(rows)
        print_processes_tables(rows)
        print_shm_host_table(rows)
        if not args.no_reference and not any(r["strategy"] == "gloo" for r in rows):
            print("(torch not importable: no gloo reference)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
