"""Probe: a staging download's latency per size (submit, blocking poll, callback), and whether a
blocking poll on one thread holds up another thread's submit to the same device (wgpu-core keeps
the device's fence lock while it waits; runtime/native.py BLOCKING_WAIT chooses the wait).

    python3 benchmarks/_map_wait_probe.py
"""
from __future__ import annotations

import os
import statistics
import threading
import time

os.environ.setdefault("WGRUMUS_DEVICES", "1")


def main() -> None:
    import wgrumus as wr
    from wgrumus.runtime import native
    from wgrumus.runtime.staging import staging_of
    dev = wr.devices()[0]
    api, st = native.api(), staging_of(dev)

    def download(n: int):
        """Submit a copy of an n-byte buffer into a staging buffer; its map request."""
        sb = st.reader(n)
        st.submit([(src[n]._storage.buffer, 0, sb.buffer, 0, n)], [sb])
        return sb

    def done(sb) -> None:
        sb.mapped, sb.req = True, None
        sb.unmap()
        st.give_back(sb)

    sizes = [1 << 16, 1 << 20, 4 << 20, 16 << 20, 64 << 20]
    src = {n: wr.zeros(n // 4, device=dev) for n in sizes}
    print(f"staging download on {dev.name}: median of 25 (after 5), microseconds")
    print(f"{'bytes':>10} {'submit':>8} {'blocking poll':>14} {'callback after':>15}")
    for n in sizes[:-1]:
        rows = []
        for _ in range(30):
            t0 = time.perf_counter()
            sb = download(n)
            t1 = time.perf_counter()
            api.wait_index(dev.wgpu, sb.req.index)
            t2 = time.perf_counter()
            while sb.req.status is None:
                api.poll(dev.wgpu)
            rows.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
            done(sb)
        med = [1e6 * statistics.median(r[k] for r in rows[5:]) for k in range(3)]
        print(f"{n:>10,} {med[0]:8.1f} {med[1]:14.1f} {med[2]:15.1f}")
    small = wr.zeros(1024, device=dev)
    for mode in ("blocking", "polling"):
        lat = []
        for _ in range(8):
            sb = download(sizes[-1])
            req = sb.req

            def waiter(req=req):
                if mode == "blocking":
                    api.wait_index(dev.wgpu, req.index)
                while req.status is None:
                    api.poll(dev.wgpu)
                    time.sleep(2e-5)
            th = threading.Thread(target=waiter)
            th.start()
            time.sleep(2e-4)
            t0 = time.perf_counter()
            small + 1.0
            dev.flush()
            t1 = time.perf_counter()
            th.join()
            lat.append((t1 - t0, time.perf_counter() - t0))
            done(sb)
        print(f"{mode} wait on a 64 MB download: another thread's op + submit to the same device "
              f"took {1e6 * statistics.median(x[0] for x in lat):.0f} us (the download was done "
              f"after {1e6 * statistics.median(x[1] for x in lat):.0f} us)")


if __name__ == "__main__":
    main()
