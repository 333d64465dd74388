"""`wgrumus bench`: run the benchmark scripts of a source checkout (benchmarks/*.py), each in its
own process (a benchmark picks its device count before wgrumus makes the devices)."""
from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from .common import UsageError, console, print_json

ORDER = ("ops", "train_step", "collectives", "data_parallel", "pipeline", "parallel3d")
# fault, numerics and leak campaigns, the time table of the README's commands, and the PyTorch
# reference of multi_adapter.sh (it needs PyTorch, which wgrumus does not), and replica_scaling
# (its processes rows need one physical adapter each): not run by
# `wgrumus bench` (all), only by name
NOT_IN_ALL = {"reliability", "reliability_numerics", "soak", "commands", "torch_reference",
              "replica_scaling", "staging_pieces"}
# scripts of benchmarks/ that are not benchmarks (multi_adapter.sh's table maker): never listed
HELPERS = {"multi_adapter_table"}
# `wgrumus bench` (all, quick) keeps the multi-device rows; a benchmark not listed runs with
# --quick when it has that flag (tests/test_bench_quick.py runs each).
QUICK = {
    "ops": ["--quick", "--sizes", "256", "--mb", "4"],
    "train_step": ["--quick", "--repeats", "1", "--warmup", "2", "--steps", "2"],
    "collectives": ["--quick", "--no-reference"],
    "data_parallel": ["--quick", "--devices", "1", "2", "--steps", "2", "--warmup", "1"],
    "pipeline": ["--stages", "2", "--micro-batches", "4", "--schedules", "gpipe", "1f1b",
                 "--width", "64", "--layers", "2", "--mb-size", "8", "--repeats", "1"],
    "parallel3d": ["--quick", "--layouts", "1x1x1,2x2x2"],
    # both backward paths (row scan, sorted) at a fraction of the full sizes' minutes on a CPU
    "embedding_backward": ["--ids", "90000", "--rows", "10000"],
    "replay_cost": ["--quick", "--reps", "20", "--warmup", "0.5"],
}


def quick_args(name: str, path: Path) -> list:
    if name in QUICK:
        return list(QUICK[name])
    return ["--quick"] if "--quick" in path.read_text() else []


def available() -> dict[str, Path]:
    """The benchmark scripts of a source checkout (<repo>/benchmarks) by name, in ORDER."""
    d = Path(__file__).resolve().parents[2] / "benchmarks"
    found = {p.stem: p for p in sorted(d.glob("*.py"))
             if not p.stem.startswith("_") and p.stem not in HELPERS}
    return dict(sorted(found.items(), key=lambda kv: (
        ORDER.index(kv[0]) if kv[0] in ORDER else len(ORDER), kv[0])))


def add_parser(sub) -> None:
    p = sub.add_parser(
        "bench", help="run benchmarks (ops, collectives, pipeline, data parallel, ...)",
        description="Run the benchmarks of a source checkout and print their tables, with "
        "references (numpy; torch where importable) measured in the same run. "
        "`wgrumus bench` runs all of them with --quick (the fault campaign `reliability` only "
        "by name); `wgrumus bench NAME [ARGS...]` runs one with its own arguments (see "
        "`wgrumus bench NAME --help`).")
    p.add_argument("name", nargs="?", help="benchmark to run (default: all, quick)")
    p.add_argument("args", nargs="...", help="arguments passed to the benchmark")
    p.add_argument("--list", action="store_true", help="list the benchmarks and exit")
    p.add_argument("--json", action="store_true",
                   help="run at full size (add --quick after NAME for quick sizes) with each "
                   "benchmark's --json, and print one JSON object {name: [the JSON documents it "
                   "printed]} on stdout; "
                   "progress goes to stderr")
    p.set_defaults(func=run)


def _run_script(path: Path, argv: list, capture: bool = False) -> tuple[int, str]:
    """The benchmark in a child process: (exit status, its stdout if ``capture``)."""
    env = dict(os.environ)
    root = str(path.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root] + [p for p in env.get("PYTHONPATH", "")
                                                  .split(os.pathsep) if p])
    p = subprocess.Popen([sys.executable, str(path), *argv], env=env,
                         stdout=subprocess.PIPE if capture else None, text=True)
    try:
        out, _ = p.communicate()
        return p.returncode, out or ""
    except KeyboardInterrupt:
        p.terminate()
        p.wait(30)
        raise


def parse_output(text: str) -> list:
    """The JSON documents a benchmark printed with --json (one, or one per line), in order."""
    docs, dec, i = [], json.JSONDecoder(), 0
    while True:
        i = text.find("{", i)
        if i < 0:
            return docs
        doc, i = dec.raw_decode(text, i)
        docs.append(doc)


def run(args) -> int:
    found = available()
    if not found:
        raise UsageError("no benchmarks/ directory next to the wgrumus package: the benchmarks "
                         "are not in the wheel, they come with a source checkout; clone the "
                         "repository, pip install -e . there, and run wgrumus bench")
    con = console()
    if args.list:
        for name, path in found.items():
            doc = (_first_doc_line(path) or "").strip()
            con.print(f"[bold]{name:14}[/] {doc}")
        return 0
    if args.name:
        if args.name not in found:
            raise UsageError(f"unknown benchmark {args.name!r}; available: "
                             f"{', '.join(found)}")
        todo = [(args.name, list(args.args))]
    else:
        todo = [(name, [] if args.json else quick_args(name, path))
                for name, path in found.items() if name not in NOT_IN_ALL]
    if args.json:  # tables and progress to stderr, results to stdout
        con = console(stderr=True)
        todo = [(name, argv if "--json" in argv else argv + ["--json"]) for name, argv in todo]
    failed, results = [], {}
    start = time.perf_counter()
    for name, argv in todo:
        con.rule(f"[bold]{name}[/] {' '.join(argv)}")
        t0 = time.perf_counter()
        rc, out = _run_script(found[name], argv, capture=args.json)
        if rc != 0:
            failed.append(name)
            con.print(f"[red]{name} exited with {rc}")
        elif args.json:
            results[name] = parse_output(out)
        con.print(f"[dim]{name}: {time.perf_counter() - t0:.1f} s")
    if len(todo) > 1:
        con.print(f"[dim]all: {time.perf_counter() - start:.1f} s")
    if args.json:
        print_json(results)
    if failed:
        con.print(f"[red]failed: {', '.join(failed)}")
        return 1
    return 0


def _first_doc_line(path: Path) -> str | None:
    try:
        doc = ast.get_docstring(ast.parse(path.read_text()))
    except (SyntaxError, OSError):
        return None
    return doc.splitlines()[0] if doc else None
