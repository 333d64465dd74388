"""The fixed cost of one small staged transfer on one device, call by call: what every send,
receive and all-reduce between adapters pays before bandwidth matters (WebGPU has no peer copy,
so each moves device -> mapped staging -> host -> staging -> device).

    python benchmarks/staging_pieces.py              # 4 KB and 1 MB, 300 rounds each
    python benchmarks/staging_pieces.py --sizes 4096 --rounds 1000
    python benchmarks/staging_pieces.py --host-copies 1,4,16,64   # only the host-copy table

Rows (median and p90 in us after a tenth of the rounds as warm-up): recording the copy, the
flush (command buffer finished and submitted), the map request, the wait until the staging is
mapped (polling or blocking waits, as ``TUNING.blocking_waits`` picks for the device), reading
it, unmapping; a whole download and a whole upload; wgpu-py's own calls beside ours. Reference
of the same run where PyTorch sees a CUDA device: the same download and upload through pinned
host memory, each synchronised.

``--host-copies MB,...``: what splitting a host copy or a two-input sum over threads gains at
each size (the thresholds ``runtime.staging.PAR_COPY_MIN`` and ``shm_rounds.PAR_MIN``): one
thread against the split wgrumus uses (``par_ranges``: copies over up to COPY_THREADS threads,
sums over 2, 4 and 8).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _row(name: str, us: list[float], warm: int) -> str:
    v = us[warm:]
    return f"  {name:<44} {statistics.median(v):9.1f} {np.percentile(v, 90):9.1f}"


def measure(dev, nbytes: int, rounds: int) -> dict[str, list[float]]:
    """Microseconds of each piece, one list per row, ``rounds`` times."""
    import wgrumus as wr
    from wgrumus.runtime.native import MAP_READ, api
    from wgrumus.runtime.staging import staging_of
    a, st = api(), staging_of(dev)
    src = wr.tensor(np.ones(nbytes // 4, np.float32), device=dev).buffer_slice()
    host = np.empty(nbytes, np.uint8)
    out: dict[str, list[float]] = {}

    def tick(key: str, t0: float) -> float:
        t1 = time.perf_counter()
        out.setdefault(key, []).append((t1 - t0) * 1e6)
        return t1

    for _ in range(rounds):
        r = st.reader(nbytes)
        t = t0 = time.perf_counter()
        dev.copy(src.buffer, src.offset, r.buffer, 0, nbytes)
        t = tick("download: record the copy", t)
        dev.flush()
        t = tick("download: flush (finish + submit)", t)
        r.req = a.map_async(r.buffer, MAP_READ, r.size, dev.last_submission)
        t = tick("download: map request", t)
        r.wait(time.monotonic() + 10)
        t = tick("download: wait until mapped", t)
        np.copyto(host, r.array(np.uint8, nbytes))
        t = tick("download: host copy out", t)
        r.unmap()
        st.give_back(r)
        t = tick("download: unmap", t)
        tick("download, whole", t0)
        t = time.perf_counter()
        w = st.writer(nbytes, time.monotonic() + 10, spare=2)
        t = tick("upload: a mapped staging buffer", t)
        w.array(np.uint8, nbytes)[:] = host
        t = tick("upload: host copy in", t)
        w.unmap()
        st.submit([(w.buffer, 0, src.buffer, src.offset, nbytes)], [w])
        st.give_back(w)
        tick("upload: unmap + copy + submit + map request", t)
        t = time.perf_counter()
        enc = dev.wgpu.create_command_encoder()
        dev.queue.submit([enc.finish()])
        t = tick("wgpu-py: empty command buffer submitted", t)
        dev.synchronize()
        tick("device synchronize (a 4-byte read back)", t)
    return out


def torch_reference(nbytes: int, rounds: int) -> dict[str, list[float]] | None:
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    d = torch.ones(nbytes // 4, device="cuda")
    h = torch.empty(nbytes // 4, pin_memory=True)
    out: dict[str, list[float]] = {}
    for _ in range(rounds):
        torch.cuda.synchronize()
        t = time.perf_counter()
        h.copy_(d, non_blocking=True)
        torch.cuda.synchronize()
        out.setdefault("torch: download to pinned memory", []).append(
            (time.perf_counter() - t) * 1e6)
        t = time.perf_counter()
        d.copy_(h, non_blocking=True)
        torch.cuda.synchronize()
        out.setdefault("torch: upload from pinned memory", []).append(
            (time.perf_counter() - t) * 1e6)
    return out


def host_copies(megabytes) -> None:
    from wgrumus.distributed.host_reduce import reduce_into
    from wgrumus.runtime.staging import COPY_THREADS, par_ranges

    def us(fn, k=20):
        fn()
        t0 = time.perf_counter()
        for _ in range(k):
            fn()
        return (time.perf_counter() - t0) / k * 1e6

    print(f"\nhost copy and two-input float32 sum, us (GB/s of the output); split copy: "
          f"{COPY_THREADS} threads")
    print(f"{'size':>6} | {'copy, 1':>15} {'split':>15} | {'sum, 1':>15} {'2 threads':>15} "
          f"{'4':>15} {'8':>15}")
    for mb in megabytes:
        n = mb << 20
        a, b = np.ones(n // 4, np.float32), np.ones(n // 4, np.float32)
        o = np.empty_like(a)
        au, ou = a.view(np.uint8), o.view(np.uint8)
        cells = [us(lambda: np.copyto(ou, au)),
                 us(lambda: par_ranges(lambda x, y: np.copyto(ou[x:y], au[x:y]), n, 1)),
                 us(lambda: reduce_into(o, [a, b], "sum", 2))]
        for threads in (2, 4, 8):
            cells.append(us(lambda t=threads: par_ranges(
                lambda x, y: reduce_into(o[x:y], [a[x:y], b[x:y]], "sum", 2), a.size,
                -(-a.size // t))))
        print(f"{mb:>4}MB | " + " ".join(f"{c:8.0f} ({n / c / 1e3:4.1f})" for c in cells[:2])
              + " | " + " ".join(f"{c:8.0f} ({n / c / 1e3:4.1f})" for c in cells[2:]))


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4096,1048576", help="comma-separated byte sizes")
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--host-copies", default=None, metavar="MB,...",
                   help="only the host copy and sum table, at these sizes in MB")
    a = p.parse_args(argv)
    if a.host_copies:
        host_copies([int(x) for x in a.host_copies.split(",")])
        return
    import wgrumus as wr
    dev = wr.devices()[0]
    warm = a.rounds // 10
    print(f"{dev}, blocking waits: {dev.blocking_waits}")
    for n in (int(s) for s in a.sizes.split(",")):
        if n <= 0 or n % 4:
            raise SystemExit(f"--sizes: {n} is not a positive multiple of 4 bytes")
        print(f"\n{n:,} bytes, {a.rounds} rounds\n  {'':<44} {'median us':>9} {'p90 us':>9}")
        rows = measure(dev, n, a.rounds)
        rows.update(torch_reference(n, a.rounds) or {})
        for name, us in rows.items():
            print(_row(name, us, warm))


if __name__ == "__main__":
    main()
