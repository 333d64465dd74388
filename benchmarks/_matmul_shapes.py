"""Every matmul variant on the products a GPT-2-width training step is made of, in their real
layouts (weight gradients x^T @ g over K = tokens, g @ W^T, batched attention products), plus
square 512 / 1024 products, next to torch (CUDA, TF32 off) in the same run. Each case is warmed
up for 0.25 s before it is timed (an idle GPU starts at low clocks), checked against the table's
choice, and timed with timestamp queries. "default" is what ops/matmul.py's rules pick.

    python3 benchmarks/_matmul_shapes.py [--variants t128k16ak,t128x64,...]
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import time

import numpy as np

os.environ.setdefault("WGRUMUS_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _kernel_sweep import cuda_event_seconds  # noqa: E402

NAMES = ["default", "t128k16ak", "t128e", "t128x64", "t64e", "t128s2", "t128s2ak", "t128s4",
         "t64s2", "t64s4", "t64s4ak", "t64x128"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variants", default=",".join(NAMES[1:]))
    ap.add_argument("--cases", default="", help="only cases whose label contains one of these "
                    "comma-separated words")
    args = ap.parse_args()
    import wgrumus as wr
    from wgrumus.runtime.gpu_timer import GpuTimer
    mm = importlib.import_module("wgrumus.kernels.matmul_gpu")
    from wgrumus.runtime.tuning import TUNING
    dev = wr.devices()[0]
    rng = np.random.default_rng(0)
    try:
        import torch
        torch.backends.cuda.matmul.allow_tf32 = False
        torch = torch if torch.cuda.is_available() else None
    except ImportError:
        torch = None

    def warm_seconds(fn, sync, timed):
        fn()
        sync()
        t0, k = time.perf_counter(), 0
        while time.perf_counter() - t0 < 0.25:
            for _ in range(10):
                fn()
            sync()
            k += 10
        return timed(fn, max(10, k))

    def ours(fn, n):
        with GpuTimer(dev) as tm:
            for _ in range(n):
                fn()
        return tm.seconds / n

    # (label, A, B): numpy bases, each optionally transposed in its last two dims ("T")
    shapes = {"x": (4096, 768), "g3": (4096, 3072), "g23": (4096, 2304), "x2": (4096, 768),
              "w": (768, 3072), "w2": (3072, 768), "w23": (768, 2304), "h": (96, 512, 64),
              "s": (96, 512, 512),
              "s5a": (512, 512), "s5b": (512, 512), "s1a": (1024, 1024), "s1b": (1024, 1024),
              "s4a": (4096, 4096), "s4b": (4096, 4096), "wa": (1536, 4096), "wb": (4096, 2816),
             "wc": (4096, 1408), "wd": (4096, 2944)}
    base = {k: rng.standard_normal(v).astype(np.float32) for k, v in shapes.items()}
    cases = [("xT@g 768x3072x4096", "xT", "g3"), ("gT@x 3072x768x4096", "g3T", "x"),
             ("xT@g 768x2304x4096", "xT", "g23"), ("xT@g 768x768x4096", "xT", "x2"),
             ("g@wT 4096x768x3072", "g3", "wT"), ("a@w 4096x768x3072", "g3", "w2"),
             ("a@w 4096x3072x768", "x", "w"), ("a@w 4096x2304x768", "x", "w23"),
             ("g@wT 4096x768x2304", "g23", "w23T"), ("g@wT 4096x3072x768", "x", "w2T"),
             ("b sT@h 96x512x64x512", "sT", "h"),
             ("b s@h 96x512x64x512", "s", "h"), ("b q@kT 96x512x512x64", "h", "hT"),
             ("sq 512", "s5a", "s5b"), ("sq 512 A@B.T", "s5a", "s5bT"),
             ("sq 1024", "s1a", "s1b"), ("sq 4096", "s4a", "s4b"),
             # 132 / 264 / 276 tiles of 128x128 (K 4096): workgroups resident per SM
             ("wave 1536x1408x4096", "wa", "wc"), ("wave 1536x2816x4096", "wa", "wb"),
             ("wave 1536x2944x4096", "wa", "wd")]
    if args.cases:
        cases = [c for c in cases if any(w in c[0] for w in args.cases.split(","))]
    ours_t = {k: wr.tensor(v, device=dev) for k, v in base.items()}
    torch_t = {k: torch.from_numpy(v).cuda() for k, v in base.items()} if torch else {}

    def operand(tensors, name):
        x = tensors[name.rstrip("T")]
        return x.transpose(-1, -2) if name.endswith("T") else x
    names = ["default"] + args.variants.split(",")
    print(f"TFLOP/s on {dev.name}; torch {'CUDA ' + torch.__version__ if torch else 'absent'}")
    print("case".ljust(22) + "".join(n.rjust(10) for n in names) + "torch".rjust(10))
    keep = mm._pick_variant
    for label, an, bn in cases:
        a, b = operand(ours_t, an), operand(ours_t, bn)
        ref = (a @ b).numpy()
        flop = 2 * ref.size * a.shape[-1]
        row = []
        for n in names:
            v = None if n == "default" else mm.VARIANTS[n]
            if v is not None:
                mm._pick_variant = lambda *z, v=v: v
                TUNING.cpu_matmul = False
            try:
                err = float(np.abs((a @ b).numpy() - ref).max() / np.abs(ref).max())
                s_ = warm_seconds(lambda: a @ b, dev.synchronize, ours)
                row.append(f"{flop / s_ / 1e12:10.2f}" if err < 1e-4 else "ERR".rjust(10))
            except Exception:  # a variant that does not build for this product
                row.append("x".rjust(10))
            finally:
                mm._pick_variant, TUNING.cpu_matmul = keep, None
        ref_t = "-"
        if torch is not None:
            ta, tb = operand(torch_t, an), operand(torch_t, bn)
            sec = warm_seconds(lambda: ta @ tb, torch.cuda.synchronize,
                               lambda f, n: cuda_event_seconds(torch, f, n))
            ref_t = f"{flop / sec / 1e12:.2f}"
        print(label.ljust(22) + "".join(row) + ref_t.rjust(10), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
