"""Pipeline parallel: the model cut into stages, one per device, each micro-batch's activations
flowing forward and its gradients backward in the 1F1B order printed below.

    python examples/pipeline_1f1b.py --steps 50
"""
import argparse
import os

os.environ.setdefault("WGRUMUS_DEVICES", "4")

import wgrumus as wr  # noqa: E402
from wgrumus import nn  # noqa: E402
from wgrumus.data import load_digits  # noqa: E402
from wgrumus.distributed.pipeline import PipelineExecutor, PipelineStage, get_schedule, render  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
p.add_argument("--steps", type=int, default=50)
p.add_argument("--micro-batches", type=int, default=8)
args = p.parse_args()

# The schedule is plain data: print it before anything runs.
print(render(get_schedule("1f1b", 4, args.micro_batches)))

x, y = load_digits()
x = x / 16.0
wr.manual_seed(0)
dev = wr.devices()
# Stage s holds its layers on device s. (split_sequential(model, p, devices) cuts an existing
# nn.Sequential into p stages balanced by parameter count.)
stages = [PipelineStage(nn.Sequential(nn.Linear(64, 128), nn.ReLU()), dev[0]),
          PipelineStage(nn.Sequential(nn.Linear(128, 128), nn.ReLU()), dev[1]),
          PipelineStage(nn.Sequential(nn.Linear(128, 128), nn.ReLU()), dev[2]),
          PipelineStage(nn.Linear(128, 10), dev[3])]
pipe = PipelineExecutor(stages, args.micro_batches, schedule="1f1b")
opts = [wr.optim.AdamW(s.parameters(), lr=3e-3) for s in stages]  # one per stage

batch = 64
for step in range(args.steps):
    lo = (step * batch) % (len(x) - batch)
    # run() splits the batch into micro-batches, scales each loss by 1/m and steps each
    # stage's optimizer once the whole pipeline has finished
    loss, _ = pipe.run(x[lo:lo + batch], y[lo:lo + batch], nn.functional.cross_entropy,
                       optimizers=opts)
    if (step + 1) % 10 == 0 or step + 1 == args.steps:
        print(f"step {step + 1:4d}  loss {loss:.4f}")

trace = pipe.last_trace  # what really ran, with timestamps
print("measured bubble per stage:", [f"{b:.0%}" for b in trace.stage_bubble_fractions()])
