"""Peak device memory of one training step (the buffer pool's live bytes, high-water mark),
before/after the memory-saving modes:

    checkpoint  GPT on one device, plain vs --activation-checkpointing (wgrumus.utils.checkpoint
                per block): peak live bytes of forward + backward + AdamW step.
    zero1       DataParallel with N replicas, plain vs shard_optimizer_state=True (ZeRO-1): the
                optimizer state bytes per replica and the peak live bytes per replica.
    fsdp        FSDP over N ranks, whole-model wrapping vs per-block wrapping: peak live bytes per
                rank of a forward + backward, with the parameter bytes for reference.

    python benchmarks/memory.py                        # GPT-mini (4 x 256, T=128), N=4
    python benchmarks/memory.py --quick                # small shapes (lavapipe, CI)
    WGRUMUS_DEVICES=4 python benchmarks/memory.py --only fsdp

"live" counts buffers handed out by the device's pool (tensors, optimizer state, gathered
parameters), not the pool's cached free buffers: the figure PyTorch calls
max_memory_allocated. Each row is measured after one warm-up step so that one-time buffers
(position ids, kernel constants) are already live in both columns. Prints one table.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WGRUMUS_DEVICES", "4")

MB = 1 << 20


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", choices=["checkpoint", "zero1", "fsdp"], action="append")
    ap.add_argument("--ranks", type=int, default=4, help="replicas / FSDP ranks (default 4)")
    ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--quick", action="store_true", help="small shapes (lavapipe, CI)")
    a = ap.parse_args(argv)
    if a.quick:
        a.n_layer, a.n_embd, a.n_head, a.block, a.vocab, a.batch = 4, 64, 2, 32, 128, 4
    return a


def gpt(a, device, checkpoint=False):
    import wgrumus as wr
    return wr.nn.GPT(a.vocab, a.block, n_layer=a.n_layer, n_head=a.n_head, n_embd=a.n_embd,
                     device=device, seed=0, checkpoint=checkpoint)


def tokens(a, n, seed=0):
    return np.random.default_rng(seed).integers(0, a.vocab, (n, a.block + 1)).astype(np.int32)


def lm_loss(logits, y):
    from wgrumus.nn import functional as F
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def peak_of(devices, fn):
    """Run ``fn()`` and return each device's peak live bytes during it."""
    for d in devices:
        d.pool.reset_peak()
    fn()
    for d in devices:
        d.synchronize()
    return [d.pool.peak_live_bytes for d in devices]


def bench_checkpoint(a) -> list:
    import wgrumus as wr
    dev = wr.devices()[0]
    data = tokens(a, a.batch)
    x = wr.tensor(data[:, :-1], device=dev)
    y = wr.tensor(data[:, 1:], device=dev)

    def measure(ck):
        model = gpt(a, dev, checkpoint=ck)
        opt = wr.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            loss = lm_loss(model(x), y)
            opt.step(wr.autograd.backward(loss))
            loss.item()
        step()
        return peak_of([dev], step)[0]

    return [("checkpoint", "GPT, 1 device", "plain", "per block", measure(False),
             measure(True))]


def bench_zero1(a) -> list:
    import wgrumus as wr
    from wgrumus.parallel import DataParallel
    devs = wr.devices()[:a.ranks]
    data = tokens(a, a.batch * len(devs))
    def measure(shard):
        dp = DataParallel(gpt(a, devs[0]), devs, shard_optimizer_state=shard, timeout=600)
        opts = [wr.optim.AdamW(r.parameters(), lr=1e-3) for r in dp.replicas]
        try:
            def step():
                dp.train_step(data[:, :-1], data[:, 1:], lm_loss, opts)
            step()
            peaks = peak_of(devs, step)
            state = [sum(v.numel() * 4 for st in o.state.values() for v in st.values()
                         if isinstance(v, wr.Tensor)) for o in opts]
            return max(state), max(peaks)
        finally:
            dp.close()

    res = {shard: measure(shard) for shard in (False, True)}
    n = f"DataParallel x{len(devs)}"
    return [("zero1", n + " opt state", "full", "ZeRO-1", res[False][0], res[True][0]),
            ("zero1", n + " peak", "full", "ZeRO-1", res[False][1], res[True][1])]


def bench_fsdp(a) -> list:
    import wgrumus as wr
    from wgrumus import distributed as dist
    from wgrumus.distributed import FSDP
    from wgrumus.nn.attention import TransformerBlock
    units = (TransformerBlock, wr.nn.Embedding, wr.nn.LayerNorm, wr.nn.Linear)
    devs = wr.devices()[:a.ranks]
    data = tokens(a, a.batch * len(devs))

    def run(auto_wrap):
        def fn(g):
            f = FSDP(gpt(a, g.device), g, auto_wrap=auto_wrap)
            opt = wr.optim.AdamW(f.parameters(), lr=1e-3)
            rows = data[g.rank * a.batch:(g.rank + 1) * a.batch]
            x = wr.tensor(rows[:, :-1], device=g.device)
            y = wr.tensor(rows[:, 1:], device=g.device)
            try:
                def step():
                    loss = lm_loss(f(x), y)
                    f.zero_grad()
                    loss.backward()
                    opt.step()
                    loss.item()
                step()
                return peak_of([g.device], step)[0]
            finally:
                f.close()
        return max(dist.spawn(fn, len(devs), devices=devs, timeout=600))

    model = gpt(a, devs[0])
    full = sum(p.numel() * 4 for p in model.parameters())
    block = sum(p.numel() * 4 for p in model.blocks[0].parameters())
    del model
    n = len(devs)
    return [("fsdp", f"x{n}: params (model)", "whole", "1 block+1/N",
             full, block + (full - block) / n),
            ("fsdp", f"x{n}: peak per rank", "whole model", "per block", run(None), run(units))]


SECTIONS = {"checkpoint": bench_checkpoint, "zero1": bench_zero1, "fsdp": bench_fsdp}


def main(argv=None):
    a = parse_args(argv)
    import wgrumus as wr
    print(f"# peak live device bytes (MiB) per rank, GPT n_layer={a.n_layer} n_embd={a.n_embd} "
          f"T={a.block} vocab={a.vocab} batch={a.batch}/rank; adapter "
          f"{wr.devices()[0].name}")
    print(f"{'mode':<11} {'setting':<24} {'before':>22} {'after':>22} {'ratio':>6}")
    for name in a.only or list(SECTIONS):
        for mode, setting, bname, aname, b, aft in SECTIONS[name](a):
            print(f"{mode:<11} {setting:<24} {bname + ' ' + f'{b / MB:.2f}':>22} "
                  f"{aname + ' ' + f'{aft / MB:.2f}':>22} {aft / b:>6.2f}")


if __name__ == "__main__":
    main()
