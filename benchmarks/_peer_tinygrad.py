"""Peer row: tinygrad's WebGPU backend (Dawn) on the same adapter, next to wgrumus and numpy in
the same run: fp32 matmul and the MLP 784-512-512-10 batch 256 AdamW step of train_step.py.
Optional: prints why and exits 0 when tinygrad or its WebGPU backend is not importable.
tinygrad loads Dawn's libwebgpu_dawn from WEBGPU_PATH; the ``peer`` extra installs tinygrad and
dawn-python (which ships that library), and this script points WEBGPU_PATH at it. The MLP step
runs twice per framework: eager, and captured (wr.jit / tinygrad's TinyJit).

    pip install -e .[peer]
    PYTHONPATH=$PWD python benchmarks/_peer_tinygrad.py [--sizes 256,512] [--device WEBGPU]
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ops import timeit  # noqa: E402


def _dawn_library() -> str | None:
    """dawn-python's libwebgpu_dawn for this machine, where that package is installed."""
    import importlib.util
    import platform
    spec = importlib.util.find_spec("pydawn")
    if spec is None or not spec.submodule_search_locations:
        return None
    arch = {"arm64": "aarch64"}.get(platform.machine().lower(), platform.machine().lower())
    ext = {"darwin": "dylib", "win32": "dll"}.get(sys.platform, "so")
    alias = "arm64" if arch == "aarch64" else arch
    names = ["libwebgpu_dawn.dll"] if ext == "dll" else [
        f"libwebgpu_dawn_{arch}.{ext}", f"libwebgpu_dawn_{alias}.{ext}"]
    for name in names:
        path = os.path.join(spec.submodule_search_locations[0], "lib", name)
        if os.path.isfile(path):
            return path
    return None


def _tinygrad(device: str):
    """(tinygrad module, device name) or (None, why)."""
    if "WEBGPU_PATH" not in os.environ and (lib := _dawn_library()):
        os.environ["WEBGPU_PATH"] = lib
    try:
        import tinygrad
        from tinygrad import Device, Tensor
        Tensor.ones(4, device=device).realize()
        return tinygrad, Device[device]
    except Exception as e:  # absent, or its backend library is missing: no peer row
        return None, f"{type(e).__name__}: {str(e)[:200]}"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,512")
    p.add_argument("--device", default="WEBGPU", help="tinygrad device (default WEBGPU)")
    p.add_argument("--no-mlp", action="store_true")
    p.add_argument("--mlp", default="256:784,512,512,10", help="batch:dims of the MLP step")
    args = p.parse_args(argv)
    tg, tdev = _tinygrad(args.device)
    if tg is None:
        print(f"tinygrad peer skipped ({args.device}): {tdev}")
        return 0
    from tinygrad import Tensor

    import wgrumus as wr
    dev = wr.devices()[0]
    tsync = tdev.synchronize
    from importlib.metadata import version
    print(f"wgrumus on {dev.adapter_info.get('device')}; tinygrad {version('tinygrad')} on "
          f"{args.device}")
    print(f"{'bench':<10}{'size':>6}{'wgrumus':>10}{'tinygrad':>10}{'numpy':>10}"
          f"{'x tinygrad':>12}{'x numpy':>9}")
    for n in [int(s) for s in args.sizes.split(",")]:
        a, b = wr.randn((n, n), seed=1), wr.randn((n, n), seed=2)
        an, bn = a.numpy(), b.numpy()
        ta = Tensor(an, device=args.device).realize()
        tb = Tensor(bn, device=args.device).realize()
        ours = timeit(lambda: a @ b, dev.synchronize)
        peer = timeit(lambda: (ta @ tb).realize(), tsync)
        ref = timeit(lambda: an @ bn)
        g = lambda t: 2 * n ** 3 / t / 1e9
        print(f"{'matmul':<10}{n:>6}{g(ours):>10.3f}{g(peer):>10.3f}{g(ref):>10.3f}"
              f"{peer / ours:>12.2f}{ref / ours:>9.3f}   GFLOP/s")
    if not args.no_mlp:
        import train_step as ts
        from tinygrad import Context, TinyJit
        from tinygrad import nn as tnn
        batch, dims = args.mlp.split(":")
        cfg = {"batch": int(batch), "dims": tuple(int(d) for d in dims.split(","))}
        xh, yh = ts.mlp_data(cfg)
        dims = cfg["dims"]
        layers = [tnn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:])]
        params = [p for lay in layers for p in (lay.weight, lay.bias)]
        for q in params:
            q.replace(q.to(args.device)).realize()
        opt = tnn.optim.AdamW(params, lr=ts.LR)
        x, y = Tensor(xh, device=args.device), Tensor(yh.astype(np.int32), device=args.device)

        def tstep():
            with Context(TRAINING=1):
                h = x
                for i, lay in enumerate(layers):
                    h = lay(h)
                    h = h.relu() if i < len(layers) - 1 else h
                loss = h.sparse_categorical_crossentropy(y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                return loss.realize()
        np_step = ts.numpy_mlp_step(cfg)
        ref = timeit(np_step, min_n=3)
        # Ours first: once tinygrad has run its steps, Dawn's threads slow llvmpipe for others.
        ours = {}
        for jit in (False, True):
            step, _, _ = ts.wgrumus_step("mlp", cfg, dev, jit=jit)
            for _ in range(2):  # the eager warm-up and the capture
                step()
            ours[jit] = timeit(step, dev.synchronize, min_n=3)
        for label, jit, peer_step in (("mlp step", False, tstep),
                                      ("mlp +jit", True, TinyJit(tstep))):
            for _ in range(2 if jit else 0):  # TinyJit captures on its second call
                peer_step()
            peer = timeit(peer_step, tsync, min_n=3)
            print(f"{label:<10}{cfg['batch']:>6}{ours[jit] * 1e3:>10.1f}{peer * 1e3:>10.1f}"
                  f"{ref * 1e3:>10.1f}{peer / ours[jit]:>12.2f}{ref / ours[jit]:>9.3f}   ms/step")
    print(f"load average {os.getloadavg()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
