"""Several processes (one per adapter, or per host) with MPI: data-parallel training where each
process holds one replica and gradients are all-reduced between processes.

    mpiexec -n 2 python examples/mpi_data_parallel.py --steps 50
    mpiexec -n 4 -hosts node1,node2 python examples/mpi_data_parallel.py   # across hosts

Needs `pip install -e ".[mpi]"` (mpi4py and the mpich wheel, which provides `mpiexec`).
"""
import argparse

import wgrumus as wr
from wgrumus import distributed as dist
from wgrumus import nn
from wgrumus.data import load_digits
from wgrumus.parallel import DataParallel

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=50)
args = p.parse_args()

group = dist.init_process_group("mpi")     # rank and world size from mpiexec
devices = wr.devices()
device = devices[group.rank % len(devices)]  # this process's device
x, y = load_digits()
x = x / 16.0

wr.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 10))
ddp = DataParallel(model, [device], backend="mpi", group=group)  # weights broadcast from rank 0
opt = wr.optim.AdamW(ddp.parameters(), lr=3e-3)

batch = 64  # the global batch: every process passes the same rows and keeps its own share
for step in range(args.steps):
    lo = (step * batch) % (len(x) - batch)
    loss = ddp.train_step(x[lo:lo + batch], y[lo:lo + batch], nn.functional.cross_entropy, opt)
    if group.rank == 0 and ((step + 1) % 10 == 0 or step + 1 == args.steps):
        print(f"step {step + 1:4d}  loss {loss:.4f}  ({group.world_size} processes)")

same = group.all_gather_object(float(ddp.parameters()[0].numpy().sum()))
if group.rank == 0:
    print("replicas identical across processes:", len(set(same)) == 1)
ddp.close()
