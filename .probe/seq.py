import os, sys, statistics
sys.path.insert(0, "benchmarks")
import kernel_profile as kp, train_step as ts
import wgrumus as wr
dev = wr.devices()[0]
step, loss, _ = ts.wgrumus_step("gpt", ts.QUICK["gpt"], dev)
for _ in range(3): step()
loss()
R = 5
got = kp.eager_dispatch_seconds(dev, step, R)
n = len(got) // R
for i in range(n):
    print(f"{i:3d} {1e6*statistics.median(got[r*n+i][1] for r in range(R)):7.1f} {got[i][0]}")
