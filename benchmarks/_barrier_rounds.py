"""Host-only cost of one CollectiveBarrier exchange round (the comm engine's host step per chunk),
per round size, this tree against another git revision in the same run (alternated).

    python benchmarks/_barrier_rounds.py                       # against main, 2 ranks
    python benchmarks/_barrier_rounds.py --against HEAD~1 --sizes 4,1024,4096 --helpers 0,4
    python benchmarks/_barrier_rounds.py --spin 0,20,50,200 --helper-mb 1,4   # tune this tree

Each rank brings its own input array and its own output array (numpy arrays standing in for the
mapped download and upload buffers), the round sums them: exactly what pipelined.py asks of the
barrier per chunk. Prints per size the microseconds per round and the rate (bytes of one rank's
chunk / round time: the algbw the host step alone would allow). The smallest size's round time
is the fixed cost per round (a line fit is useless here: small rounds run from cache, large ones
from memory).
"""
from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from wgrumus.distributed import barrier as this_barrier  # noqa: E402


def barrier_at(rev: str):
    """wgrumus/distributed/barrier.py as of git ``rev`` (or the file at path ``rev``: a copy
    made with ``git show REV:wgrumus/distributed/barrier.py > FILE`` where no git history
    travels), loaded as a module of this package."""
    if Path(rev).is_file():
        src = Path(rev).read_text()
    else:
        src = subprocess.run(["git", "show", f"{rev}:wgrumus/distributed/barrier.py"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout
    name = f"wgrumus.distributed._barrier_{abs(hash(rev))}"
    spec = importlib.util.spec_from_loader(name, loader=None)
    mod = importlib.util.module_from_spec(spec)
    mod.__package__ = "wgrumus.distributed"
    exec(compile(src, f"{rev}:barrier.py", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def time_rounds(mod, ranks: int, nbytes: int, helpers, budget: float = 0.3) -> float:
    """Seconds per exchange round (sum) of ``nbytes`` per rank, ``ranks`` threads."""
    n = max(1, nbytes // 4)
    ins = [np.full(n, r + 1, np.float32) for r in range(ranks)]
    outs = [np.empty(n, np.float32) for _ in range(ranks)]
    kw = {} if helpers is None else {"helpers": helpers}
    bar = mod.CollectiveBarrier(ranks, timeout=60, **kw)
    count = [8]
    took = [0.0]
    start = threading.Barrier(ranks)

    def body(r):
        start.wait()
        for _ in range(count[0]):
            bar.exchange(n, np.float32, r, ins[r], 0, outs[r], 0, "sum")

    def run():
        ts = [threading.Thread(target=body, args=(r,)) for r in range(ranks)]
        t0 = time.perf_counter()
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        return time.perf_counter() - t0

    run()  # warm-up: pages faulted in, threads started
    count[0] = int(min(5000, max(8, budget / max(run() / count[0], 1e-7))))
    took[0] = run()
    assert (outs[0] == ranks * (ranks + 1) / 2).all(), "wrong sum"
    close = getattr(bar, "close", None)
    if close is not None:
        close()
    return took[0] / count[0]


class _Tuned:
    """This tree's barrier module with SPIN_S (us) / HELPER_BYTES (MiB) set while it is used."""

    def __init__(self, mod, spin_us, helper_mb):
        self.mod, self.spin_us, self.helper_mb = mod, spin_us, helper_mb

    def CollectiveBarrier(self, *a, **k):  # noqa: N802 - stands in for the class
        if self.spin_us is not None:
            self.mod.SPIN_S = self.spin_us * 1e-6
        if self.helper_mb is not None:
            self.mod.HELPER_BYTES = int(self.helper_mb * (1 << 20))
        return self.mod.CollectiveBarrier(*a, **k)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--against", default="main",
                   help="git revision, or a barrier.py file, to compare ('' for none)")
    p.add_argument("--sizes", default="4,64,256,1024,2048,4096,8192,16384",
                   help="round sizes per rank in KiB")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--helpers", default="default",
                   help="comma-separated helper counts to try ('default': the barrier's own)")
    p.add_argument("--repeats", type=int, default=2, help="alternations of the A/B pair")
    p.add_argument("--spin", default=None,
                   help="comma-separated SPIN_S values (us) of this tree to compare")
    p.add_argument("--helper-mb", default=None,
                   help="comma-separated HELPER_BYTES values (MiB) of this tree to compare")
    args = p.parse_args(argv)
    sizes = [int(float(s) * 1024) for s in args.sizes.split(",")]
    impls = [("this tree", this_barrier)]
    spins = [float(v) for v in args.spin.split(",")] if args.spin else [None]
    hmbs = [float(v) for v in args.helper_mb.split(",")] if args.helper_mb else [None]
    if len(spins) * len(hmbs) > 1:
        impls = [(("" if v is None else f"spin{v:g}") + ("" if m is None else f" h{m:g}M"),
                  _Tuned(this_barrier, v, m)) for v in spins for m in hmbs]
    if args.against:
        impls.append((args.against, barrier_at(args.against)))
    helpers = [None if h == "default" else int(h) for h in args.helpers.split(",")]
    print(f"{args.ranks} ranks, exchange rounds (sum) on host arrays; us per round / GB/s "
          f"(one rank's bytes per round time); {args.repeats} alternated runs each")
    for h in helpers:
        res = {name: {s: [] for s in sizes} for name, _ in impls}
        for _ in range(args.repeats):
            for s in sizes:
                for name, mod in impls:
                    res[name][s].append(time_rounds(mod, args.ranks, s, h))
        hname = "default" if h is None else h
        head = f"{'helpers ' + str(hname):14} {'impl':12} | " + " ".join(
            f"{(str(s // 1024) + ' KiB'):>17}" for s in sizes)
        print(head)
        print("-" * len(head))
        for name, _ in impls:
            best = [min(res[name][s]) for s in sizes]
            cells = " ".join(f"{t * 1e6:8.0f} {s / t / 1e9:8.2f}" for s, t in zip(sizes, best))
            print(f"{'':14} {name[:12]:12} | {cells}")
        for name, _ in impls:
            runs = " ".join("/".join(f"{t * 1e6:.0f}" for t in res[name][s]) for s in sizes)
            print(f"{'':14} {name[:12]:12} runs (us): {runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
