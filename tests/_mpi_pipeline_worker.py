"""Runs under ``mpiexec -n N python tests/_mpi_pipeline_worker.py LAYOUTS_JSON`` for
tests/test_mpi_pipeline.py: trains the small GPT over MPI in each layout and prints, on world
rank 0, one ``LOSSES <layout json> <losses json>`` line per layout."""
import json
import os
import sys

from wgrumus import distributed as dist
from wgrumus.distributed.parallel3d import GPTConfig, train_3d


def main():
    layouts = json.loads(sys.argv[1])
    cfg = GPTConfig(**json.loads(sys.argv[2]))
    timeout = float(os.environ.get("WGRUMUS_TEST_TIMEOUT", "30"))
    g = dist.init_process_group("mpi", timeout=timeout)
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
