"""What bounds the comm engine between two logical devices of one adapter (issue 19), in three
tables from one run:

1. copies: one staging copy (copy -> map -> wait -> unmap, as the engine's chunks) on one device
   alone vs on two logical devices at once: a second device (its own VkDevice / context) on the
   same GPU adds a fixed cost per copy if the GPU time-slices the two contexts;
2. memory: host rates of copies and adds into mapped upload staging, out of mapped download
   staging and between host arrays, by thread count (upload staging in the GPU's BAR memory
   shows as writes capped at the link's rate while host-to-host copies keep scaling);
3. host step: the engine's reduction of two ranks' chunks on that memory (download staging in,
   each rank's upload staging out) through CollectiveBarrier.exchange, against a plain thread
   pool doing the same with a cached temporary ("tmp") or adding straight into each output
   ("twice").

    WGRUMUS_DEVICES=2 python benchmarks/_staging_probe.py [--parts copies,memory,host]
"""
from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT.parent))
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WGRUMUS_DEVICES", "2")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

from collectives import comm_devices, on_all, one_way  # noqa: E402

MB = 1 << 20


_KEEP: list = []  # the staging buffers behind the views below: collected, they unmap


def mapped_pair(dev, nbytes, fill):
    """(download staging view holding ``fill``, mapped upload staging view) of ``dev``."""
    from wgrumus.runtime.staging import staging_of
    st, deadline = staging_of(dev), time.monotonic() + 60
    buf = dev.alloc(nbytes)
    dev.write(buf, np.full(nbytes // 4, fill, np.float32))
    dev.synchronize()
    rd = st.reader(nbytes)
    st.submit([(buf, 0, rd.buffer, 0, nbytes)], [rd])
    rd.wait(deadline)
    wr_ = st.writer(nbytes, deadline)
    _KEEP.extend([buf, rd, wr_])
    return rd.array(np.float32, nbytes), wr_.array(np.float32, nbytes)


def copies(devs, reps=40):
    print("\n1. one staging copy (ms per copy; GB/s of all devices together)")
    bufs = [d.alloc(16 * MB) for d in devs]

    def loop(r, nbytes, down):
        for _ in range(reps):
            one_way(devs[r], bufs[r], nbytes, down)
    for down in (True, False):
        for nb in (MB, 2 * MB, 4 * MB, 16 * MB):
            loop(0, nb, down)
            loop(1, nb, down)  # staging buffers made
            alone = min(on_all(devs[:1], lambda r: loop(r, nb, down)) for _ in range(3)) / reps
            both = min(on_all(devs, lambda r: loop(r, nb, down)) for _ in range(3)) / reps
            print(f"{'down' if down else 'up':4} {nb // MB:3d} MB | one device {alone * 1e3:6.3f} "
                  f"ms ({nb / alone / 1e9:5.1f} GB/s) | two at once {both * 1e3:6.3f} ms each "
                  f"({2 * nb / both / 1e9:5.1f} GB/s)", flush=True)


def pool_seconds(fn, n, threads, piece, reps=4):
    """Best seconds of fn(lo, hi) over [0, n) in ``piece``-byte pieces dealt to threads."""
    p = piece // 4
    groups = [[(lo, min(lo + p, n)) for lo in range(0, n, p)][i::threads]
              for i in range(threads)]
    with ThreadPoolExecutor(threads) as ex:
        best = float("inf")
        for _ in range(reps):
            t0 = time.perf_counter()
            list(ex.map(lambda g: [fn(lo, hi) for lo, hi in g], groups))
            best = min(best, time.perf_counter() - t0)
    return best


def memory(dev, nbytes=64 * MB):
    print(f"\n2. host memory rates, GB/s of the destination ({nbytes // MB} MB, 1 MB pieces)")
    n = nbytes // 4
    src, host = np.ones(n, np.float32), np.zeros(n, np.float32)
    down, up = mapped_pair(dev, nbytes, 1.0)
    cases = {"copy host -> host": lambda lo, hi: np.copyto(host[lo:hi], src[lo:hi]),
             "copy host -> upload staging": lambda lo, hi: np.copyto(up[lo:hi], src[lo:hi]),
             "copy download staging -> host": lambda lo, hi: np.copyto(host[lo:hi], down[lo:hi]),
             "add host + host -> upload staging":
                 lambda lo, hi: np.add(src[lo:hi], host[lo:hi], out=up[lo:hi]),
             "add download staging + host -> host":
                 lambda lo, hi: np.add(down[lo:hi], src[lo:hi], out=host[lo:hi])}
    threads = (1, 2, 4, 8, 12)
    print(f"{'':36}" + "".join(f"{f'{t} thr':>8}" for t in threads))
    for name, fn in cases.items():
        print(f"{name:36}" + "".join(f"{nbytes / pool_seconds(fn, n, t, MB) / 1e9:8.1f}"
                                     for t in threads), flush=True)


def host_step(devs, sizes=(16 * MB, 4 * MB), reps=20):
    from wgrumus.distributed import barrier as bmod
    print("\n3. the host step of one chunk, two ranks, real staging memory (ms per chunk)")
    for nb in sizes:
        pairs = [mapped_pair(d, nb, r + 1.0) for r, d in enumerate(devs[:2])]
        ins, outs = [p[0] for p in pairs], [p[1] for p in pairs]
        n = nb // 4

        def barrier_ms(helper_bytes, piece):
            keep, bmod.HELPER_BYTES = bmod.HELPER_BYTES, helper_bytes
            bar = bmod.CollectiveBarrier(2, timeout=60, chunk_bytes=piece)

            def fn(r):
                for _ in range(reps):
                    bar.exchange(n, np.float32, r, ins[r], 0, outs[r], 0, "sum")
            best = float("inf")
            for _ in range(3):
                th = [threading.Thread(target=fn, args=(r,)) for r in range(2)]
                t0 = time.perf_counter()
                for t in th:
                    t.start()
                for t in th:
                    t.join()
                best = min(best, (time.perf_counter() - t0) / reps)
            bar.close()
            bmod.HELPER_BYTES = keep
            assert outs[0][0] == outs[1][-1] == 3.0
            return best * 1e3

        def tmp(lo, hi):
            t = np.add(ins[0][lo:hi], ins[1][lo:hi])
            np.copyto(outs[0][lo:hi], t)
            np.copyto(outs[1][lo:hi], t)

        def twice(lo, hi):
            np.add(ins[0][lo:hi], ins[1][lo:hi], out=outs[0][lo:hi])
            np.add(ins[0][lo:hi], ins[1][lo:hi], out=outs[1][lo:hi])
        print(f"-- {nb // MB} MB chunks")
        for hb in (4 * MB, MB):
            for piece in (MB, 256 << 10):
                print(f"barrier (helper per {hb // 1024}K, {piece // 1024}K pieces): "
                      f"{barrier_ms(hb, piece):6.3f}", flush=True)
        for t in (4, 8, 12):
            row = [f"{name} {pool_seconds(fn, n, t, MB, 10) * 1e3:6.3f}"
                   for name, fn in (("tmp", tmp), ("twice", twice))]
            print(f"pool {t:2d} threads, 1 MB pieces: " + "  ".join(row), flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--parts", default="copies,memory,host")
    parts = ap.parse_args().parts.split(",")
    devs, _ = comm_devices(2)
    if len(devs) < 2:
        print("needs two devices (WGRUMUS_DEVICES=2)", file=sys.stderr)
        return 1
    print(f"{devs[0].name} x {len(devs)} logical devices; {os.cpu_count()} CPUs")
    if "copies" in parts:
        copies(devs)
    if "memory" in parts:
        memory(devs[0])
    if "host" in parts:
        host_step(devs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
