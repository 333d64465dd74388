"""PyTorch reference for the multi-adapter benchmarks: wgrumus's GPT (nn/gpt.py: token + position
embeddings, pre-LN blocks with biased fused QKV attention and a 4x GELU MLP, final LayerNorm, an
untied LM head, GPT-2 initialisation) trained with AdamW in float32, on one GPU or under torchrun
with DistributedDataParallel (NCCL on GPUs, gloo on CPU). Prints the steady-state step time and
tokens/s in the shape of ``wgrumus train --json``'s "steady" field:

    python benchmarks/torch_reference.py --n-layer 4 --n-embd 256 --block-size 128 --batch 16
    torchrun --standalone --nproc_per_node 4 benchmarks/torch_reference.py ... --json

``--batch`` is per GPU (weak scaling, as the wgrumus rows' sequences per adapter). Tokens are
random (throughput does not depend on them); warm-up steps (max(3, 10%)) are excluded as in
wgrumus's "steady" figure. Matmuls run in true float32 unless ``--tf32``.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import time


def build_model(torch, vocab: int, block: int, n_layer: int, n_head: int, n_embd: int):
    nn, F = torch.nn, torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
            self.in_proj = nn.Linear(n_embd, 3 * n_embd)
            self.out_proj = nn.Linear(n_embd, n_embd)
            self.fc, self.proj = nn.Linear(n_embd, 4 * n_embd), nn.Linear(4 * n_embd, n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.in_proj(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.out_proj(y.transpose(1, 2).reshape(B, T, C))
            return x + self.proj(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, n_embd), nn.Embedding(block, n_embd)
            self.blocks = nn.ModuleList(Block() for _ in range(n_layer))
            self.ln_f = nn.LayerNorm(n_embd)
            self.lm_head = nn.Linear(n_embd, vocab, bias=False)
            for name, p in self.named_parameters():  # GPT-2's initialisation, as nn/gpt.py
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif ".ln" not in name and not name.startswith("ln"):
                    scaled = name.endswith("out_proj.weight") or name.endswith(".proj.weight")
                    nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * n_layer) if scaled else 0.02)

        def forward(self, idx):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for blk in self.blocks:
                x = blk(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n-layer", type=int, default=4)
    ap.add_argument("--n-embd", type=int, default=256)
    ap.add_argument("--n-head", type=int, default=4)
    ap.add_argument("--block-size", type=int, default=128)
    ap.add_argument("--vocab", type=int, default=72, help="vocabulary (wgrumus's text: 72 "
                    "after padding to a multiple of 8)")
    ap.add_argument("--batch", type=int, default=16, help="sequences per GPU")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--tf32", action="store_true", help="allow TF32 matmuls (default: float32)")
    ap.add_argument("--cpu", action="store_true", help="run on the CPU (gloo), e.g. to test")
    ap.add_argument("--json", action="store_true", help="print one JSON object (rank 0)")
    args = ap.parse_args(argv)

    try:
        import torch
        import torch.distributed as tdist
    except ImportError:
        raise SystemExit("torch_reference.py measures PyTorch: pip install torch (wgrumus itself "
                         "does not need it)") from None
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available() and not args.cpu
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        torch.backends.cudnn.allow_tf32 = args.tf32
    if world > 1:
        tdist.init_process_group("nccl" if cuda else "gloo")
    torch.manual_seed(0)
    model = build_model(torch, args.vocab, args.block_size, args.n_layer, args.n_head,
                        args.n_embd).to(device)
    if world > 1:
        from torch.nn.parallel import DistributedDataParallel
        model = DistributedDataParallel(model, device_ids=[local] if cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator(device="cpu").manual_seed(1 + rank)
    batches = [torch.randint(0, args.vocab, (args.batch, args.block_size + 1), generator=gen)
               .to(device) for _ in range(4)]
    warm = max(3, args.steps // 10)
    if args.steps <= warm:
        ap.error(f"--steps must exceed the {warm} warm-up steps")

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    loss = None
    for step in range(args.steps):
        if step == warm:
            sync()
            t0 = time.perf_counter()
        tok = batches[step % len(batches)]
        logits = model(tok[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, args.vocab),
                                                 tok[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    sync()
    seconds = time.perf_counter() - t0
    steps = args.steps - warm
    step_ms = 1e3 * seconds / steps
    tokens = steps * args.batch * world * args.block_size
    out = {"model": "gpt", "framework": f"torch {torch.__version__}",
           "device": torch.cuda.get_device_name(device) if cuda else "cpu", "world": world,
           "batch_per_gpu": args.batch, "final_loss": float(loss.item()),
           "steady": {"step_ms": step_ms, "tokens_per_s": tokens / seconds, "steps": steps}}
    if rank == 0:
        print(json.dumps(out) if args.json else
              f"torch {'DDP x' + str(world) if world > 1 else '1 GPU'}: {step_ms:.2f} ms/step, "
              f"{tokens / seconds:,.0f} tokens/s")
    if world > 1:
        tdist.destroy_process_group()


if __name__ == "__main__":
    main()
