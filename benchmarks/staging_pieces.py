"""The fixed cost of one small staged transfer on one device, call by call: what every send,
receive and all-reduce between adapters pays before bandwidth matters (WebGPU has no peer copy,
so each moves device -> mapped staging -> host -> staging -> device).

    python benchmarks/staging_pieces.py              # 4 KB and 1 MB, 300 rounds each
    python benchmarks/staging_pieces.py --sizes 4096 --rounds 1000

Rows (median and p90 in us after a tenth of the rounds as warm-up): recording the copy, the
flush (command buffer finished and submitted), the map request, the wait until the staging is
mapped (polling or blocking waits, as ``TUNING.blocking_waits`` picks for the device), reading
it, unmapping; a whole download and a whole upload; wgpu-py's own calls beside ours. Reference
of the same run where PyTorch sees a CUDA device: the same download and upload through pinned
host memory, each synchronised.
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


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="4096,1048576", help="comma-separated byte sizes")
    p.add_argument("--rounds", type=int, default=300)
    a = p.parse_args(argv)
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
