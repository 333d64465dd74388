"""The FMA ceiling a WGSL kernel can reach on this adapter: f32 and f16 (vec4, vec2, a scalar
splat) fused multiply-adds with no memory traffic. It bounds what the matmul tables can gain:
packed f16 outruns f32 only where the driver turns vec2<f16> arithmetic into paired
half-precision instructions.

    python3 benchmarks/fma_peak.py [--groups N] [--iters N] [--quick]
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import wgpu

from wgrumus.runtime.context import get_device

FORMS = (("f32", "vec4", "fma(x, y, a)"), ("f32", "vec4", "x * y + a"),
         ("f32", "vec4", "fma(splat(x.x), y, a)"), ("f16", "vec4", "fma(x, y, a)"),
         ("f16", "vec4", "fma(splat(x.x), y, a)"), ("f16", "vec2", "fma(x, y, a)"),
         ("f16", "vec2", "x * y + a"))


QUICK = (8, 256)  # --quick: workgroups, loop trips


def shader(t: str, vec: str, expr: str, iters: int) -> str:
    """16 (vec4) or 32 (vec2) independent accumulators, updated ``iters`` times."""
    v, lanes = f"{vec}<{t}>", int(vec[-1])
    nacc = 64 // lanes
    upd = "\n".join(f"    a{k} = " + expr.replace("a)", f"a{k})").replace("+ a", f"+ a{k}")
                     .replace("splat(", f"{v}(") + ";" for k in range(nacc))
    decl = "\n".join(f"  var a{k} = {v}({t}(f32(g.x % 64u + {k}u) * 1e-3));" for k in range(nacc))
    total = " + ".join(f"a{k}" for k in range(nacc))
    return ("enable f16;\n" if t == "f16" else "") + f"""
@group(0) @binding(0) var<storage, read_write> o: array<f32>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) g: vec3<u32>) {{
  var x = {v}({t}(1.0001));
  let y = {v}({t}(0.9999));
{decl}
  for (var i = 0u; i < {iters}u; i++) {{
{upd}
    x = x * y;
  }}
  let s = {total};
  o[g.x] = f32(dot(vec{lanes}<f32>(s), vec{lanes}<f32>(1.0)));
}}"""


def run(d, code: str, groups: int, reps: int):
    """(best seconds per dispatch of 3 x ``reps``, the output array) of one compiled form."""
    out = d.create_buffer(size=groups * 256 * 4,
                          usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
    pipe = d.create_compute_pipeline(
        layout="auto", compute={"module": d.create_shader_module(code=code), "entry_point": "main"})
    bg = d.create_bind_group(layout=pipe.get_bind_group_layout(0),
                             entries=[{"binding": 0, "resource": {"buffer": out}}])

    def go(n: int) -> None:
        enc = d.create_command_encoder()
        for _ in range(n):
            cp = enc.begin_compute_pass()
            cp.set_pipeline(pipe)
            cp.set_bind_group(0, bg)
            cp.dispatch_workgroups(groups)
            cp.end()
        d.queue.submit([enc.finish()])
        d.queue.read_buffer(out, size=4)

    go(2)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        go(reps)
        best = min(best, (time.perf_counter() - t0) / reps)
    return best, np.frombuffer(d.queue.read_buffer(out), np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--groups", type=int, default=8448, help="workgroups of 256 (default: "
                    "64 per SM of an H100; use ~8 on a CPU adapter)")
    ap.add_argument("--iters", type=int, default=4096, help="loop trips (llvmpipe stops a "
                    "loop after 65,535)")
    ap.add_argument("--quick", action="store_true", help=f"{QUICK[0]} workgroups x {QUICK[1]} "
                    f"trips: a few seconds on a CPU adapter (wgrumus bench)")
    args = ap.parse_args()
    if args.quick:
        args.groups, args.iters = QUICK
    dev = get_device(0)
    d = dev.wgpu
    print(f"FMA peak on {dev.adapter_info.get('device', '?')}: {args.groups} x 256 invocations, "
          f"{args.iters} trips of 64 FMAs each; best of 3 x 5 dispatches")
    print(f"{'type':>4} {'vector':>6}  {'expression':<24} {'TFLOP/s':>8} {'x f32 fma':>9}")
    run(d, shader(*FORMS[0], args.iters), args.groups, 5)  # an idle GPU starts at low clocks
    base = None
    for t, vec, expr in FORMS:
        if t == "f16" and "shader-f16" not in d.features:
            print(f"{t:>4} {vec:>6}  {expr:<24} {'(no shader-f16)':>18}")
            continue
        sec, _ = run(d, shader(t, vec, expr, args.iters), args.groups, 5)
        tflops = 2 * 64 * args.groups * 256 * args.iters / sec / 1e12
        base = base or tflops
        print(f"{t:>4} {vec:>6}  {expr:<24} {tflops:8.3g} {tflops / base:9.2f}")


if __name__ == "__main__":
    main()
