"""Tuning sweep for CPU adapters (lavapipe): matmul_cpu.wgsl block shapes and workgroup
layouts next to the GPU tiled kernel and numpy, the CPU map and AdamW chunks next to their GPU
kernels, and whole training steps, measured in the same run. Prints one JSON line per
measurement; the winners go into kernels/matmul_cpu.py (_cpu_tile) and runtime/profile.py
(CPU_MAP_CHUNK, CPU_UPDATE_CHUNK).

    PYTHONPATH=$PWD python benchmarks/_cpu_sweep.py [--sizes 256,512,1024x256x64]
        [--layouts nn,tn,nt] [--tiles 16x16x4x4,8x8x8x1t,...] [--rounds 5]
    PYTHONPATH=$PWD python benchmarks/_cpu_sweep.py --adam [--chunks 1,4,8,16,32] [--rounds 5]
    PYTHONPATH=$PWD python benchmarks/_cpu_sweep.py --map [--chunks 1,4,8,16,32] [--rounds 5]
    PYTHONPATH=$PWD python benchmarks/_cpu_sweep.py --step [--rounds 5]

Sizes: N (square) or MxKxN. Tiles TMxTNxWGXxWGY, a trailing t: A and B read from textures
(TUNING.matmul_textures), ts: and A's rows shared over the subgroup
(TUNING.matmul_subgroup_rows). Each tile runs
once a round (rounds interleaved); medians.
--adam: AdamW steps over the parameters of the MLP 784-512-512-10 with each elements-per-
invocation chunk of entry `cpu` of shaders/adam_multi.wgsl (chunk 1: its GPU entry `main`), the
variants interleaved round by round in one process; medians.
--map: the elementwise ops of a GPT step at its shapes (copies, a transpose, a broadcast add,
GELU, a 3-way cat) with each outputs-per-invocation chunk of shaders/map_cpu.wgsl (chunk 1:
map.wgsl), interleaved the same way.
--step: an AdamW training step of the MLP 784-512-512-10 (batch 256) and of `wgrumus train
gpt`'s default model (2 layers, width 64, 32 x 32 tokens) now against before, step by step
interleaved; before (--step-base): matmul operands in storage buffers instead of textures
(storage, TUNING.matmul_textures False), or (chunks) the GPU-shaped map and Adam kernels (chunk
1) and matmul's 16-wide blocks from 128-long sides (CPU_SIDE16).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import timeit  # noqa: E402

from wgrumus.runtime.tuning import TUNING  # noqa: E402

GPU_TILE = (4, 16, 0)  # the shared-memory tiled kernel the CPU adapters ran before
TILES = "8x8x4x4,8x8x8x8,4x8x8x8,8x4x8x8,4x4x8x8,8x16x4x4,16x8x4x4,8x8x2x2,8x8x16x4"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,512", help="N or MxKxN list, comma separated")
    p.add_argument("--layouts", default="nn")
    p.add_argument("--tiles", default=TILES, help="TMxTNxWGXxWGY list, comma separated")
    p.add_argument("--no-gpu-kernel", action="store_true", help="skip the tiled GPU kernel")
    p.add_argument("--adam", action="store_true", help="sweep the AdamW update instead")
    p.add_argument("--map", action="store_true", help="sweep the elementwise map instead")
    p.add_argument("--step", action="store_true", help="time whole training steps instead")
    p.add_argument("--step-base", choices=("storage", "chunks"), default="storage",
                   help="--step's before: storage-operand matmuls, or the GPU-shaped map/Adam")
    p.add_argument("--chunks", default="1,4,8,16,32")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    import wgrumus as wr
    dev = wr.devices()[0]
    print(json.dumps({"what": "adapter", "device": dev.adapter_info.get("device"),
                      "load": os.getloadavg()}), flush=True)
    if args.adam:
        return _adam(wr, dev, [int(c) for c in args.chunks.split(",")], args.rounds)
    if args.step:
        return _step(wr, dev, args.rounds, args.step_base)
    if args.map:
        return _map(wr, dev, [int(c) for c in args.chunks.split(",")], args.rounds)
    mm = importlib.import_module("wgrumus.kernels.matmul")
    # a trailing "t": operands in textures (TUNING.matmul_textures), else in storage buffers;
    # "ts": textures with A's rows shared over the subgroup (TUNING.matmul_subgroup_rows)
    tiles = [tuple(int(x) for x in t.rstrip("ts").split("x")) + (0, "t" in t, t.endswith("s"))
             for t in args.tiles.split(",") if t]
    if not args.no_gpu_kernel:
        tiles.append(GPU_TILE)
    orig = mm.launch
    rng = np.random.default_rng(0)
    for size in args.sizes.split(","):
        m, k, n = [int(x) for x in size.split("x")] if "x" in size else [int(size)] * 3
        an = rng.standard_normal((m, k)).astype(np.float32)
        bn = rng.standard_normal((k, n)).astype(np.float32)
        t_np = timeit(lambda: an @ bn)
        flop = 2 * m * k * n
        print(json.dumps({"what": "numpy", "n": size, "gflops": flop / t_np / 1e9}), flush=True)
        for layout in args.layouts.split(","):  # t: the operand is stored transposed
            ta = wr.tensor(an.T.copy()).transpose(0, 1) if layout[0] == "t" else wr.tensor(an)
            tb = wr.tensor(bn.T.copy()).transpose(0, 1) if layout[1] == "t" else wr.tensor(bn)
            want = an @ bn
            times, rows = {t: [] for t in tiles}, {}
            for _ in range(args.rounds):  # every tile once a round; medians
                for tile in tiles:
                    if tile in rows and "error" in rows[tile]:
                        continue
                    mm.launch = lambda *x, tile=tile, **kw: orig(*x, tile=tile, **kw)
                    try:
                        rows.setdefault(tile, {"max_err": float(np.abs(
                            (ta @ tb).numpy() - want).max())})
                        times[tile].append(timeit(lambda: ta @ tb, dev.synchronize))
                    except Exception as e:  # a variant that does not build: report, go on
                        rows[tile] = {"error": str(e)[:300]}
                    finally:
                        mm.launch = orig
            for tile in tiles:
                row = rows[tile]
                if times[tile]:
                    dt = float(np.median(times[tile]))
                    row = {"ms": round(dt * 1e3, 2), "gflops": round(flop / dt / 1e9, 3),
                           "vs_numpy": round(t_np / dt, 4), **row}
                print(json.dumps({"what": "matmul", "n": size, "layout": layout,
                                  "tile": "x".join(map(str, tile[:4]))
                                  + "t" * (tile[5:6] == (True,)) + "s" * (tile[6:] == (True,)),
                                  **row,
                                  "load": os.getloadavg()[0]}), flush=True)
    return 0


def _adam(wr, dev, chunks, rounds) -> int:
    """AdamW steps per chunk size, interleaved; every variant's parameters are checked against
    chunk ``chunks[0]``'s after the same steps (same start, same gradients)."""
    dims = (784, 512, 512, 10)
    shapes = [s for i, o in zip(dims, dims[1:]) for s in ((o, i), (o,))]
    rng = np.random.default_rng(0)
    init = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    grads = [wr.tensor(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    runs, cur = {}, {}
    for c in chunks:
        ps = [wr.tensor(x) for x in init]
        runs[c] = (ps, wr.optim.AdamW(ps, lr=1e-3), dict(zip(ps, grads)))

    def set_chunk(c):
        TUNING.update_chunk = c
        cur["run"] = runs[c]
    try:
        t = _interleaved({"adamw": lambda: cur["run"][1].step(cur["run"][2])}, set_chunk,
                         chunks, rounds, dev.synchronize)
    finally:
        TUNING.update_chunk = None
    n = sum(x.size for x in init)
    base = runs[chunks[0]][0]
    for c, (ps, _, _) in runs.items():
        err = max(float(np.abs(a.numpy() - b.numpy()).max()) for a, b in zip(ps, base))
        dt = t["adamw", c]
        print(json.dumps({"what": "adamw", "params": n, "chunk": c, "ms": round(dt * 1e3, 2),
                          "Mparams_per_s": round(n / dt / 1e6, 2),
                          f"speedup_vs_chunk_{chunks[0]}": round(t["adamw", chunks[0]] / dt, 3),
                          "max_diff": err, "load": os.getloadavg()[0]}), flush=True)
    return 0


def _interleaved(fns: dict, set_variant, variants, rounds, sync) -> dict:
    """Median seconds of each (name, variant): every round runs every variant of every fn."""
    import statistics
    import time
    times = {(n, v): [] for n in fns for v in variants}
    for v in variants:  # compile and warm up
        set_variant(v)
        for fn in fns.values():
            fn()
        sync()
    for _ in range(rounds):
        for v in variants:
            set_variant(v)
            for n, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                sync()
                times[n, v].append(time.perf_counter() - t0)
    return {k: statistics.median(t) for k, t in times.items()}


def _map(wr, dev, chunks, rounds) -> int:
    """GPT-step elementwise ops (batch 32 x 32 tokens, width 64, MLP 256) per map chunk."""
    from wgrumus.nn import functional as F
    x, h = wr.randn((1024, 64), seed=1), wr.randn((1024, 256), seed=2)
    bias, y = wr.randn((256,), seed=3), wr.randn((1024, 64), seed=4)
    q = wr.randn((32, 4, 32, 16), seed=5)
    fns = {"add 1024x64": lambda: x + y,
           "add bias 1024x256": lambda: h + bias,
           "gelu 1024x256": lambda: F.gelu(h, approximate="tanh"),
           "transpose copy 32x4x32x16": lambda: q.transpose(1, 2).contiguous(),
           "cat 3 x 1024x64": lambda: wr.cat([x, y, x], dim=1)}
    want = {n: fn().numpy() for n, fn in fns.items()}
    got = {}
    for c in chunks:
        TUNING.map_chunk = c
        got[c] = {n: float(np.abs(fn().numpy() - want[n]).max()) for n, fn in fns.items()}

    def set_chunk(c):
        TUNING.map_chunk = c
    try:
        t = _interleaved(fns, set_chunk, chunks, rounds, dev.synchronize)
    finally:
        TUNING.map_chunk = None
    for n in fns:
        for c in chunks:
            print(json.dumps({"what": "map", "op": n, "chunk": c, "ms": round(t[n, c] * 1e3, 3),
                              f"speedup_vs_chunk_{chunks[0]}": round(t[n, chunks[0]] / t[n, c], 3),
                              "max_diff": got[c][n], "load": os.getloadavg()[0]}), flush=True)
    return 0


def _step(wr, dev, rounds, base) -> int:
    from wgrumus import nn
    mm = importlib.import_module("wgrumus.kernels.matmul_cpu")
    side16 = mm.CPU_SIDE16
    rng = np.random.default_rng(0)
    mlp = nn.Sequential(nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                        nn.Linear(512, 10))
    gpt = nn.GPT(vocab_size=65, block_size=32, n_layer=2, n_head=4, n_embd=64)
    data = {"mlp": (mlp, wr.tensor(rng.standard_normal((256, 784)).astype(np.float32)),
                    wr.tensor(rng.integers(0, 10, 256).astype(np.int32))),
            "gpt": (gpt, wr.tensor(rng.integers(0, 65, (32, 32)).astype(np.int32)),
                    wr.tensor(rng.integers(0, 65, 32 * 32).astype(np.int32)))}

    def stepper(model, x, y):
        opt = wr.optim.AdamW(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            out = model(x)
            nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y).backward()
            opt.step()
        return step

    fns = {n: stepper(*d) for n, d in data.items()}

    def set_variant(v):
        if base == "chunks":
            TUNING.map_chunk = TUNING.update_chunk = None if v == "now" else 1
            mm.CPU_SIDE16 = side16 if v == "now" else 128
        else:
            TUNING.matmul_textures = None if v == "now" else False
    try:
        t = _interleaved(fns, set_variant, ["before", "now"], rounds, dev.synchronize)
    finally:
        TUNING.map_chunk = TUNING.update_chunk = TUNING.matmul_textures = None
        mm.CPU_SIDE16 = side16
    for n in fns:
        print(json.dumps({"what": "train step", "model": n,
                          "ms_before": round(t[n, "before"] * 1e3, 1),
                          "ms_now": round(t[n, "now"] * 1e3, 1),
                          "speedup": round(t[n, "before"] / t[n, "now"], 3),
                          "load": os.getloadavg()[0]}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
