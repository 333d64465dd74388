"""Training step (forward + backward + AdamW) of an MLP and of GPT-mini, next to PyTorch eager
(CUDA, TF32 off; CPU torch where there is no GPU) and numpy (MLP), measured in the same run;
each wgrumus model also as a ``wr.jit`` captured step (row ``<model>+jit``: the same step
replayed from its recording, no Python per op), in each --precision.

    python benchmarks/train_step.py [--quick] [--json] [--models mlp,gpt,gpt2s] [--steps N]
                                    [--no-jit] [--jit-sync] [--precision f32,f16]

Rows: ms/step, samples or tokens per second, ratios (wgrumus throughput / reference
throughput), and per step: dispatches and submits recorded by the device, the host time spent
recording the step (Python + wgpu encoding), the time spent waiting in the final synchronize
(GPU work not hidden behind recording), the host thread's CPU time, and the GPU's own time in
compute passes (timestamp queries, where the adapter has them): host ms well above gpu ms means
the step is host-bound. us/disp: host microseconds per dispatch (host ms / dispatches).

Sizes: MLP 784-512-512-10 batch 256; GPT-mini 4 layers, d=256, 4 heads, seq 128, batch 16,
vocab 65; gpt2s (only when named): GPT-2-small width, 12 layers, d=768, 12 heads, seq 512,
batch 8 (no numpy reference). --quick (the default on a CPU adapter such as lavapipe) keeps
GPT small (2 layers, d=64, seq 32, batch 4).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
os.environ.setdefault("WGRUMUS_DEVICES", "1")

FULL = {"mlp": dict(batch=256, dims=(784, 512, 512, 10)),
        "gpt": dict(batch=16, seq=128, vocab=65, layers=4, d=256, heads=4),
        # GPT-2-small width (12 layers, d=768, 12 heads) at seq 512, batch 8: --models gpt2s
        "gpt2s": dict(batch=8, seq=512, vocab=65, layers=12, d=768, heads=12)}
QUICK = {"mlp": dict(batch=256, dims=(784, 512, 512, 10)),
         "gpt": dict(batch=4, seq=32, vocab=65, layers=2, d=64, heads=4),
         "gpt2s": dict(batch=2, seq=64, vocab=65, layers=2, d=96, heads=2)}
LR = 1e-3


# ----------------------------------------------------------------------------- timing
def measure(step, sync, steps: int, repeats: int, warmup: int, counters=None) -> dict:
    """Median over ``repeats`` of (``steps`` steps recorded back to back, then one sync):
    ms/step, and per step the host recording time, the sync wait and the thread CPU time."""
    for _ in range(warmup):
        step()
    sync()
    runs = []
    for _ in range(repeats):
        c0 = counters() if counters else (0, 0)
        pc0, cpu0, t0 = time.process_time(), time.thread_time(), time.perf_counter()
        for _ in range(steps):
            step()
        t1, cpu1 = time.perf_counter(), time.thread_time()
        sync()
        t2, pc1 = time.perf_counter(), time.process_time()
        c1 = counters() if counters else (0, 0)
        runs.append({"ms": 1e3 * (t2 - t0) / steps, "host_ms": 1e3 * (t1 - t0) / steps,
                     "wait_ms": 1e3 * (t2 - t1) / steps, "cpu_ms": 1e3 * (cpu1 - cpu0) / steps,
                     "proc_cpu_ms": 1e3 * (pc1 - pc0) / steps,
                     "dispatches": (c1[0] - c0[0]) / steps, "submits": (c1[1] - c0[1]) / steps})
    out = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    out["ms_all"] = [round(r["ms"], 3) for r in runs]
    return out


def gpu_ms(step, dev, steps: int):
    """GPU time per step inside compute passes (timestamp queries, one extra run of ``steps``
    steps), or None where the adapter has no timestamp-query."""
    from wgrumus.runtime import GpuTimer
    if "timestamp-query" not in dev.features:
        return None
    with GpuTimer(dev) as t:
        for _ in range(steps):
            step()
    dev.synchronize()
    return 1e3 * t.seconds / steps


# ----------------------------------------------------------------------------- data
def mlp_data(cfg, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((cfg["batch"], cfg["dims"][0])).astype(np.float32)
    y = rng.integers(0, cfg["dims"][-1], cfg["batch"]).astype(np.int32)
    return x, y


def gpt_data(cfg, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"])).astype(np.int32)
    y = rng.integers(0, cfg["vocab"], (cfg["batch"], cfg["seq"])).astype(np.int32)
    return x, y


# ----------------------------------------------------------------------------- wgrumus
def wgrumus_step(name, cfg, dev, precision="f32", jit: bool = False):
    """(step, loss of the last step, initial weights); with ``jit`` the step is a wr.jit
    capture of the same computation (eager warm-up call, capture, then replays; in f16 the
    GradScaler's skip and scale updates are captured with it)."""
    import wgrumus as wr
    from wgrumus.nn import functional as F
    if name == "mlp":
        dims = cfg["dims"]
        layers = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            layers.append(wr.nn.Linear(a, b, device=dev, seed=i + 1))
            if i < len(dims) - 2:
                layers.append(wr.nn.ReLU())
        model = wr.nn.Sequential(*layers)
        xh, yh = mlp_data(cfg)
    else:
        model = wr.nn.GPT(cfg["vocab"], cfg["seq"], n_layer=cfg["layers"], n_head=cfg["heads"],
                          n_embd=cfg["d"], device=dev, seed=0)
        xh, yh = gpt_data(cfg)
        yh = yh.reshape(-1)
    x, y = wr.tensor(xh, device=dev), wr.tensor(yh, device=dev)
    weights = {k: v.numpy() for k, v in model.state_dict().items()}
    opt = wr.optim.AdamW(model.parameters(), lr=LR)
    last = {}
    f16 = precision == "f16"  # autocast + dynamic loss scaling, f32 master weights
    scaler = wr.amp.GradScaler(enabled=f16)

    def body(x, y):
        with wr.autocast(enabled=f16, device=dev):
            out = model(x)
            loss = F.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        scaler.step(opt, wr.autograd.backward(scaler.scale(loss)))
        scaler.update()
        return loss
    fn = wr.jit(body) if jit else body

    def step():
        last["loss"] = fn(x, y)
    return step, lambda: float(last["loss"].item()), weights


# ----------------------------------------------------------------------------- torch
def torch_backend():
    """(torch, device name) or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "torch not importable"
    if torch.cuda.is_available():
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        return torch, "cuda"
    return torch, "cpu"


def torch_step(name, cfg, torch, devname):
    nn = torch.nn
    dev = torch.device(devname)
    torch.manual_seed(0)
    if name == "mlp":
        dims = cfg["dims"]
        mods = []
        for i, (a, b) in enumerate(zip(dims[:-1], dims[1:])):
            mods.append(nn.Linear(a, b))
            if i < len(dims) - 2:
                mods.append(nn.ReLU())
        model = nn.Sequential(*mods).to(dev)
        xh, yh = mlp_data(cfg)
        x, y = torch.from_numpy(xh).to(dev), torch.from_numpy(yh.astype(np.int64)).to(dev)
    else:
        model = _torch_gpt(torch, cfg).to(dev)
        xh, yh = gpt_data(cfg)
        x = torch.from_numpy(xh.astype(np.int64)).to(dev)
        y = torch.from_numpy(yh.reshape(-1).astype(np.int64)).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    last = {}

    def step():
        opt.zero_grad(set_to_none=True)
        out = model(x)
        loss = nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y)
        loss.backward()
        opt.step()
        last["loss"] = loss
    sync = torch.cuda.synchronize if devname == "cuda" else (lambda: None)
    return step, sync, lambda: float(last["loss"].item())


def _torch_gpt(torch, cfg):
    """The same architecture as wgrumus.nn.GPT (pre-LN blocks, packed qkv, GELU-tanh MLP,
    no final bias), with PyTorch's fused causal scaled_dot_product_attention."""
    nn, F = torch.nn, torch.nn.functional
    d, h = cfg["d"], cfg["heads"]

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
            q, k, v = (t.view(B, T, h, d // h).transpose(1, 2) for t in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg["vocab"], d), nn.Embedding(cfg["seq"], d)
            self.blocks = nn.ModuleList(Block() for _ in range(cfg["layers"]))
            self.ln_f, self.head = nn.LayerNorm(d), nn.Linear(d, cfg["vocab"], bias=False)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            return self.head(self.ln_f(x))
    return GPT()


# ----------------------------------------------------------------------------- numpy (MLP)
def numpy_mlp_step(cfg):
    """The MLP step written out in numpy (float32): forward, backward, AdamW."""
    dims = cfg["dims"]
    rng = np.random.default_rng(1)
    params = []
    for a, b in zip(dims[:-1], dims[1:]):
        s = 1.0 / np.sqrt(a)
        params += [rng.uniform(-s, s, (b, a)).astype(np.float32),
                   rng.uniform(-s, s, b).astype(np.float32)]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    x, y = mlp_data(cfg)
    n = len(y)
    t = [0]
    b1, b2, eps, wd = 0.9, 0.999, 1e-8, 0.01

    def step():
        acts, h = [x], x
        nl = len(params) // 2
        for i in range(nl):
            h = h @ params[2 * i].T + params[2 * i + 1]
            if i < nl - 1:
                h = np.maximum(h, 0.0)
            acts.append(h)
        z = h - h.max(1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(1, keepdims=True)
        g = p
        g[np.arange(n), y] -= 1.0
        g /= n
        grads = [None] * len(params)
        for i in reversed(range(nl)):
            grads[2 * i] = g.T @ acts[i]
            grads[2 * i + 1] = g.sum(0)
            if i:
                g = (g @ params[2 * i]) * (acts[i] > 0)
        t[0] += 1
        c1, c2 = 1 - b1 ** t[0], 1 - b2 ** t[0]
        for k, (pp, gg) in enumerate(zip(params, grads)):
            pp *= 1 - LR * wd
            m[k] += (1 - b1) * (gg - m[k])
            v[k] *= b2
            v[k] += (1 - b2) * gg * gg
            pp -= (LR / c1) * m[k] / (np.sqrt(v[k]) / np.sqrt(c2) + eps)
    return step


# ----------------------------------------------------------------------------- numpy (GPT)
def _ln(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    rstd = 1.0 / np.sqrt(x.var(-1, keepdims=True) + eps)
    xh = (x - mu) * rstd
    return xh * w + b, (xh, rstd, w)


def _ln_bwd(g, cache):
    xh, rstd, w = cache
    gw = g * w
    dx = rstd * (gw - gw.mean(-1, keepdims=True) - xh * (gw * xh).mean(-1, keepdims=True))
    return dx, (g * xh).reshape(-1, xh.shape[-1]).sum(0), g.reshape(-1, g.shape[-1]).sum(0)


_C = np.float32(0.7978845608028654)


def _gelu_tanh(u):
    t = np.tanh(_C * (u + 0.044715 * u ** 3))
    return 0.5 * u * (1 + t), t


def _gelu_tanh_grad(u, t):
    return 0.5 * (1 + t) + 0.5 * u * (1 - t * t) * _C * (1 + 3 * 0.044715 * u * u)


def numpy_gpt_step(cfg, weights: dict):
    """GPT-mini's step written out in numpy (float32), from the given initial weights (the
    wgrumus model's, so the losses can be compared): forward, backward, AdamW."""
    P = {k: np.array(v, np.float32) for k, v in weights.items()}
    M = {k: np.zeros_like(v) for k, v in P.items()}
    V = {k: np.zeros_like(v) for k, v in P.items()}
    xi, yi = gpt_data(cfg)
    yi = yi.reshape(-1)
    B, T = xi.shape
    D, H, L = cfg["d"], cfg["heads"], cfg["layers"]
    d = D // H
    mask = np.triu(np.full((T, T), -np.inf, np.float32), 1)
    t = [0]
    last = {}

    def lin(x, w, b=None):
        y = x @ w.T
        return y + b if b is not None else y

    def step():
        G = {}
        x = P["wte.weight"][xi] + P["wpe.weight"][np.arange(T)]
        caches = []
        for i in range(L):
            pre = f"blocks.{i}."
            h1, c1 = _ln(x, P[pre + "ln1.weight"], P[pre + "ln1.bias"])
            qkv = lin(h1, P[pre + "attn.in_proj_weight"], P[pre + "attn.in_proj_bias"])
            q, k, v = (qkv[..., j * D:(j + 1) * D].reshape(B, T, H, d).transpose(0, 2, 1, 3)
                       for j in range(3))
            s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + mask
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            o = (p @ v).transpose(0, 2, 1, 3).reshape(B, T, D)
            x = x + lin(o, P[pre + "attn.out_proj.weight"], P[pre + "attn.out_proj.bias"])
            h2, c2 = _ln(x, P[pre + "ln2.weight"], P[pre + "ln2.bias"])
            u = lin(h2, P[pre + "mlp.fc.weight"], P[pre + "mlp.fc.bias"])
            a, th = _gelu_tanh(u)
            x = x + lin(a, P[pre + "mlp.proj.weight"], P[pre + "mlp.proj.bias"])
            caches.append((h1, c1, q, k, v, p, o, h2, c2, u, a, th))
        hf, cf = _ln(x, P["ln_f.weight"], P["ln_f.bias"])
        logits = lin(hf, P["lm_head.weight"]).reshape(B * T, -1)
        z = logits - logits.max(1, keepdims=True)
        e = np.exp(z)
        sm = e / e.sum(1, keepdims=True)
        n = B * T
        last["loss"] = float(-np.log(sm[np.arange(n), yi]).mean())
        g = sm
        g[np.arange(n), yi] -= 1.0
        g /= n
        G["lm_head.weight"] = g.T @ hf.reshape(n, D)
        gx, G["ln_f.weight"], G["ln_f.bias"] = _ln_bwd((g @ P["lm_head.weight"])
                                                       .reshape(B, T, D), cf)
        for i in reversed(range(L)):
            pre = f"blocks.{i}."
            h1, c1, q, k, v, p, o, h2, c2, u, a, th = caches[i]
            g2 = gx.reshape(n, D)
            G[pre + "mlp.proj.weight"] = g2.T @ a.reshape(n, -1)
            G[pre + "mlp.proj.bias"] = g2.sum(0)
            du = (g2 @ P[pre + "mlp.proj.weight"]) * _gelu_tanh_grad(u, th).reshape(n, -1)
            G[pre + "mlp.fc.weight"] = du.T @ h2.reshape(n, D)
            G[pre + "mlp.fc.bias"] = du.sum(0)
            dh2, G[pre + "ln2.weight"], G[pre + "ln2.bias"] = _ln_bwd(
                (du @ P[pre + "mlp.fc.weight"]).reshape(B, T, D), c2)
            gx = gx + dh2
            g2 = gx.reshape(n, D)
            G[pre + "attn.out_proj.weight"] = g2.T @ o.reshape(n, D)
            G[pre + "attn.out_proj.bias"] = g2.sum(0)
            do = (g2 @ P[pre + "attn.out_proj.weight"]).reshape(B, T, H, d).transpose(0, 2, 1, 3)
            dp = do @ v.transpose(0, 1, 3, 2)
            ds = p * (dp - (dp * p).sum(-1, keepdims=True)) / np.sqrt(d)
            dq, dk, dv = ds @ k, ds.transpose(0, 1, 3, 2) @ q, p.transpose(0, 1, 3, 2) @ do
            dqkv = np.concatenate([t_.transpose(0, 2, 1, 3).reshape(n, D) for t_ in (dq, dk, dv)],
                                  axis=1)
            G[pre + "attn.in_proj_weight"] = dqkv.T @ h1.reshape(n, D)
            G[pre + "attn.in_proj_bias"] = dqkv.sum(0)
            dh1, G[pre + "ln1.weight"], G[pre + "ln1.bias"] = _ln_bwd(
                (dqkv @ P[pre + "attn.in_proj_weight"]).reshape(B, T, D), c1)
            gx = gx + dh1
        gw = np.zeros_like(P["wte.weight"])
        np.add.at(gw, xi.reshape(-1), gx.reshape(n, D))
        G["wte.weight"] = gw
        G["wpe.weight"] = gx.sum(0)
        _adamw(P, G, M, V, t)
    return step, lambda: last["loss"]


def _adamw(P, G, M, V, t, b1=0.9, b2=0.999, eps=1e-8, wd=0.01):
    t[0] += 1
    c1, c2 = 1 - b1 ** t[0], np.sqrt(1 - b2 ** t[0])
    for k, p in P.items():
        g = G[k]
        p *= 1 - LR * wd
        M[k] += (1 - b1) * (g - M[k])
        V[k] *= b2
        V[k] += (1 - b2) * g * g
        p -= (LR / c1) * M[k] / (np.sqrt(V[k]) / c2 + eps)


# ----------------------------------------------------------------------------- main
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small GPT (default on CPU adapters)")
    ap.add_argument("--full", action="store_true", help="full sizes even on a CPU adapter")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--models", default="mlp,gpt", help="comma list of mlp, gpt, gpt2s")
    ap.add_argument("--steps", type=int, default=None, help="steps per timed repeat")
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats (median is used)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps first")
    ap.add_argument("--no-torch", action="store_true", help="skip the PyTorch reference")
    ap.add_argument("--no-numpy", action="store_true", help="skip the numpy reference")
    ap.add_argument("--precision", default="f32",
                    help="comma list of f32, f16 (autocast + GradScaler; its rows are compared "
                    "with the f32 row of the same run, without torch / numpy references)")
    ap.add_argument("--no-jit", action="store_true", help="skip the wr.jit rows")
    ap.add_argument("--jit-sync", action="store_true",
                    help="add a +jit sync row: replays submitted in the calling thread (on a "
                    "CPU adapter they go to the device's submission thread by default)")
    args = ap.parse_args(argv)
    precisions = [p.strip() for p in args.precision.split(",") if p.strip()]
    if not precisions or set(precisions) - {"f32", "f16"}:
        print(f"train_step: --precision takes f32 and/or f16, got {args.precision!r}",
              file=sys.stderr)
        return 2
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    bad = [m for m in models if m not in FULL]
    if bad:
        print(f"train_step: unknown model(s) {bad}; choose from {list(FULL)}", file=sys.stderr)
        return 2

    import wgrumus as wr
    dev = wr.devices()[0]
    cpu = str(dev.adapter_info.get("adapter_type", "")).lower().startswith("cpu")
    quick = args.quick or (cpu and not args.full)
    sizes = QUICK if quick else FULL
    if not cpu:  # an idle GPU starts at low clocks: the first row, timed cold, ran 4x slow
        a = wr.randn((2048, 2048), device=dev, seed=0)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 2.0:
            a @ a
            dev.synchronize()
    steps = args.steps or (5 if quick else 20)
    warmup = args.warmup if args.warmup is not None else (20 if quick else 40)
    torch, tdev = (None, "skipped (--no-torch)") if args.no_torch else torch_backend()
    counters = lambda: (dev.dispatches, dev.submits)  # noqa: E731

    rows = []
    for name, prec in [(m, p) for m in models for p in precisions]:
        cfg = sizes[name]
        unit_n = cfg["batch"] * cfg.get("seq", 1)
        unit = "samples/s" if name == "mlp" else "tokens/s"
        step, loss, weights = wgrumus_step(name, cfg, dev, prec)
        ours = measure(step, dev.synchronize, steps, args.repeats, warmup, counters)
        row = {"model": name if prec == "f32" else f"{name} {prec}", "precision": prec,
               "config": cfg, "unit": unit, "wgrumus_ms": ours["ms"],
               "wgrumus_throughput": unit_n / ours["ms"] * 1e3, "wgrumus_loss": loss(),
               "per_step": {k: ours[k] for k in ("host_ms", "wait_ms", "cpu_ms", "proc_cpu_ms",
                                                  "dispatches", "submits")},
               "wgrumus_ms_all": ours["ms_all"]}
        row["per_step"]["gpu_ms"] = gpu_ms(step, dev, steps)
        if not args.no_jit:
            jstep, jloss, _ = wgrumus_step(name, cfg, dev, prec, jit=True)
            j = measure(jstep, dev.synchronize, steps, args.repeats, warmup, counters)
            row["jit"] = {"ms": j["ms"], "throughput": unit_n / j["ms"] * 1e3,
                          "loss": jloss(), "vs_eager": ours["ms"] / j["ms"],
                          "host_vs_eager": j["host_ms"] / ours["host_ms"],
                          "ms_all": j["ms_all"],
                          "per_step": {k: j[k] for k in ("host_ms", "wait_ms", "cpu_ms",
                                                         "proc_cpu_ms", "dispatches", "submits")}}
            row["jit"]["per_step"]["gpu_ms"] = gpu_ms(jstep, dev, steps)
            if args.jit_sync:
                from wgrumus.runtime.tuning import TUNING
                was, TUNING.submitter = TUNING.submitter, False
                try:
                    sstep, sloss, _ = wgrumus_step(name, cfg, dev, prec, jit=True)
                    s = measure(sstep, dev.synchronize, steps, args.repeats, warmup, counters)
                finally:
                    TUNING.submitter = was
                row["jit_sync"] = {"ms": s["ms"], "throughput": unit_n / s["ms"] * 1e3,
                                   "loss": sloss(), "ms_all": s["ms_all"],
                                   "per_step": {k: s[k] for k in ("host_ms", "wait_ms",
                                                                  "cpu_ms", "proc_cpu_ms",
                                                                  "dispatches", "submits")}}
        if prec != "f32":
            base = next((r for r in rows if r["model"] == name), None)
            row["vs_f32"] = base["wgrumus_ms"] / ours["ms"] if base else None
            if base and "jit" in base and "jit" in row:
                row["jit"]["vs_f32"] = base["jit"]["ms"] / row["jit"]["ms"]
            rows.append(row)
            continue
        if torch is not None:
            tstep, tsync, tloss = torch_step(name, cfg, torch, tdev)
            ref = measure(tstep, tsync, steps, args.repeats, max(5, warmup // 4))
            row.update(torch_ms=ref["ms"], torch_throughput=unit_n / ref["ms"] * 1e3,
                       torch_host_ms=ref["host_ms"], torch_loss=tloss(),
                       vs_torch=ref["ms"] / ours["ms"])
            if "jit" in row:
                row["jit"]["vs_torch"] = ref["ms"] / row["jit"]["ms"]
        if not args.no_numpy and name != "gpt2s":  # numpy would take minutes per gpt2s step
            nloss = None
            if name == "mlp":
                nstep = numpy_mlp_step(cfg)
            else:
                nstep, nloss = numpy_gpt_step(cfg, weights)
            # numpy's full-size GPT step takes ~seconds: a short measurement is enough there
            ns, nr = (steps, args.repeats) if quick or name == "mlp" else (1, 3)
            ref = measure(nstep, lambda: None, ns, nr, 1)
            row.update(numpy_ms=ref["ms"], numpy_throughput=unit_n / ref["ms"] * 1e3,
                       vs_numpy=ref["ms"] / ours["ms"], numpy_proc_cpu_ms=ref["proc_cpu_ms"])
            if nloss is not None:
                row["numpy_loss"] = nloss()
        rows.append(row)

    meta = {"bench": "train_step", "device": dev.name, "quick": quick, "steps": steps,
            "repeats": args.repeats, "warmup": warmup, "torch": tdev if torch else str(tdev),
            "host": platform.node(), "python": platform.python_version(),
            "wgrumus": os.path.dirname(wr.__file__),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if args.json:
        print(json.dumps({**meta, "rows": rows}, indent=1))
        return 0
    _table(meta, rows)
    return 0


def _table(meta, rows):
    print(f"train_step on {meta['device']} ({'quick' if meta['quick'] else 'full'} sizes; "
          f"median of {meta['repeats']} x {meta['steps']} steps; torch: {meta['torch']}; "
          f"wgrumus from {meta['wgrumus']})")
    hdr = (f"{'model':12} {'ours ms':>9} {'ours /s':>10} {'torch ms':>9} {'x torch':>8} "
           f"{'numpy ms':>9} {'x numpy':>8} | {'disp':>5} {'subm':>5} {'host ms':>8} "
           f"{'wait ms':>8} {'cpu ms':>7} {'gpu ms':>7} {'us/disp':>7}")
    print(hdr)
    print("-" * len(hdr))
    f = lambda v, w, p=2: f"{v:{w}.{p}f}" if v is not None else f"{'-':>{w}}"  # noqa: E731
    for r in rows:
        lines = [(r["model"], r["wgrumus_ms"], r["wgrumus_throughput"], r.get("vs_torch"),
                  r.get("vs_numpy"), r["per_step"])]
        if "jit" in r:
            j = r["jit"]
            lines.append((r["model"] + "+jit", j["ms"], j["throughput"], j.get("vs_torch"),
                          r["numpy_ms"] / j["ms"] if r.get("numpy_ms") else None,
                          j["per_step"]))
        if "jit_sync" in r:
            j = r["jit_sync"]
            lines.append((r["model"] + "+jit sync", j["ms"], j["throughput"], None, None,
                          j["per_step"]))
        for label, ms, thr, vt, vn, ps in lines:
            per = 1e3 * ps["host_ms"] / ps["dispatches"] if ps["dispatches"] else None
            print(f"{label:12} {f(ms, 9)} {f(thr, 10, 0)} "
                  f"{f(r.get('torch_ms'), 9)} {f(vt, 8, 3)} "
                  f"{f(r.get('numpy_ms'), 9)} {f(vn, 8, 3)} | "
                  f"{ps['dispatches']:5.0f} {ps['submits']:5.1f} {ps['host_ms']:8.2f} "
                  f"{ps['wait_ms']:8.2f} {ps['cpu_ms']:7.2f} {f(ps.get('gpu_ms'), 7)} "
                  f"{f(per, 7, 1)}")
        if "jit" in r:
            print(f"{'':12} jit/eager: host ms x{r['jit']['host_vs_eager']:.3f}, step x"
                  f"{1 / r['jit']['vs_eager']:.3f}; final loss eager {r['wgrumus_loss']:.7g}, "
                  f"jit {r['jit']['loss']:.7g}")
    for r in rows:
        if r.get("vs_f32"):
            print(f"{r['model']}: {r['vs_f32']:.3f}x the throughput of the f32 step; loss "
                  f"{r['wgrumus_loss']:.4f}")
        if r.get("jit", {}).get("vs_f32"):
            print(f"{r['model']}+jit: {r['jit']['vs_f32']:.3f}x the throughput of the f32+jit "
                  f"step; loss {r['jit']['loss']:.4f}")
    print("x torch / x numpy: wgrumus throughput over the reference's (1.0 = as fast). "
          "host ms: recording the step (Python + encoding); wait ms: the final synchronize; "
          "gpu ms: GPU time inside compute passes (timestamp queries; copies and idle gaps "
          "excluded); "
          "cpu ms: host thread CPU time (process CPU, which includes a CPU adapter's worker "
          "threads, is in --json as proc_cpu_ms).")


if __name__ == "__main__":
    sys.exit(main())
