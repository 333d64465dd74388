"""Runs under ``mpiexec -n N python tests/_mpi_pipeline_worker.py LAYOUTS_JSON|fault CONFIG`` for
tests/test_mpi_pipeline.py: trains the small GPT over MPI in each layout and prints, on world
rank 0, one ``LOSSES <layout json> <losses json>`` line per layout (or injects a fault)."""
import json
import os
import sys
import time

from wgrumus import distributed as dist
from wgrumus.distributed import CollectiveError
from wgrumus.distributed.parallel3d import GPTConfig, train_3d

t0 = time.monotonic()


def fault(g, cfg, timeout):
    """Pipeline stage 1 of 3 raises at micro-batch 2 of the second step, its neighbours
    mid-transfer: each other rank prints ``COLLECTIVE_ERROR <rank> <seconds> <message>``."""
    from wgrumus.distributed import parallel3d as p3d
    real = p3d._RankWork.forward
    step = [0]

    def forward(self, a, k, x):
        if g.rank == 1 and step[0] == 1 and a.mb == 2:
            raise RuntimeError("injected stage failure")
        return real(self, a, k, x)

    def on_step(rank, s):
        step[0] = s
        if s == 1:
            global t0
            t0 = time.monotonic()
    p3d._RankWork.forward = forward
    try:
        train_3d(cfg, 1, 1, 3, steps=3, batch_size=8, micro_batches=4, backend="mpi",
                 timeout=timeout, on_step=on_step)
    except CollectiveError as e:
        msg = str(e).replace("\n", " ")
        sys.stdout.write(f"COLLECTIVE_ERROR {g.rank} {time.monotonic() - t0:.3f} {msg}\n")
        sys.stdout.flush()
        return
    sys.stdout.write(f"RETURNED {g.rank}\n")


def main():
    cfg = GPTConfig(**json.loads(sys.argv[2]))
    timeout = float(os.environ.get("WGRUMUS_TEST_TIMEOUT", "30"))
    g = dist.init_process_group("mpi", timeout=timeout)
    if sys.argv[1] == "fault":
        return fault(g, cfg, timeout)
    layouts = json.loads(sys.argv[1])
    for lay in layouts:
        losses = train_3d(cfg, lay["dp"], lay["tp"], lay["pp"], steps=lay["steps"],
                          batch_size=lay["batch"], micro_batches=lay["m"],
                          schedule=lay["schedule"], backend="mpi", timeout=timeout)
        if g.rank == 0:
            sys.stdout.write(f"LOSSES {json.dumps(lay)} {json.dumps(losses)}\n")
            sys.stdout.flush()
    sys.stdout.write(f"OK {g.rank}\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
