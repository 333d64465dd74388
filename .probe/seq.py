import os, sys
sys.path.insert(0, "benchmarks")
import kernel_profile as kp, train_step as ts
import wgrumus as wr
dev = wr.devices()[0]
step, loss, _ = ts.wgrumus_step("gpt", ts.QUICK["gpt"], dev)
for _ in range(3): step()
loss()
got = kp.eager_dispatch_seconds(dev, step, 1)
for i, (n, s) in enumerate(got): print(f"{i:3d} {1e6*s:7.1f} {n}")
