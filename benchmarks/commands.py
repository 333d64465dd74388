"""How long the README's `wgrumus` commands take: wall time of each whole process (adapter start
included), the fastest of several runs, printed as the README's table with the hardware, date
and commit it was measured on.

    python benchmarks/commands.py [--repeats 3] [--only TEXT ...] [--skip-large]

The table in README.md ("How long the commands take") is this script's output; its rows are
COMMANDS, in order (tests/test_bench_quick.py keeps the two the same). A first run after a
driver update also compiles the kernels (Mesa caches them in ~/.cache/mesa_shader_cache), so the
fastest run is the warm figure; the slowest is printed next to it.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CKPT = "{tmp}/ckpt"  # the checkpoint rows write into a fresh temporary folder

# (the command as the README shows it, what is run after `wgrumus`, heavy: run once)
COMMANDS = (
    ("wgrumus devices", ["devices"], False),
    ("wgrumus train mlp --steps 300", ["train", "mlp", "--steps", "300"], False),
    ("wgrumus train cnn --dp 2 --devices 2", ["train", "cnn", "--dp", "2", "--devices", "2"],
     False),
    ("wgrumus demo", ["demo"], False),
    ("wgrumus train gpt", ["train", "gpt"], False),
    ("wgrumus train gpt --checkpoint ckpt/", ["train", "gpt", "--checkpoint", CKPT], False),
    ("wgrumus train gpt --checkpoint ckpt/ --resume --steps 600",
     ["train", "gpt", "--checkpoint", CKPT, "--resume", "--steps", "600"], False),
    ("wgrumus train mlp --json", ["train", "mlp", "--json"], False),
    ("wgrumus train gpt --n-layer 4 --n-embd 128 --dp 2 --tp 2 --pp 2 --devices 8",
     ["train", "gpt", "--n-layer", "4", "--n-embd", "128", "--dp", "2", "--tp", "2", "--pp", "2",
      "--devices", "8"], True),
    ("wgrumus bench", ["bench"], True),
)


def hardware() -> str:
    """The adapter wgrumus uses by default, and the host's CPU count and model."""
    p = subprocess.run([sys.executable, "-m", "wgrumus", "devices", "--json"],
                       capture_output=True, text=True, timeout=120, env=_env())
    try:
        doc = json.loads(p.stdout)
        a = doc["adapters"][doc["selected_adapters"][0]]
        adapter = f"{a['name']} over {a['backend']} ({a['type']})"
    except (ValueError, KeyError, IndexError):
        adapter = "no adapter found"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{adapter}; host: {os.cpu_count()} cores, {cpu}"


def commit() -> str:
    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout
    sha = git("rev-parse", "--short", "HEAD").strip() or "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no").strip()
    return sha + (" with local changes" if dirty else "")


def _env() -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("WGRUMUS_DEVICES", None)  # each command as a user types it
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    return env


def time_command(argv: list, tmp: str, timeout: float) -> float:
    """Seconds the whole `wgrumus ...` process took; RuntimeError when it failed."""
    argv = [a.replace("{tmp}", tmp) for a in argv]
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "wgrumus", *argv], cwd=tmp, env=_env(),
                       stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE, text=True, timeout=timeout)
    took = time.perf_counter() - t0
    if p.returncode != 0:
        raise RuntimeError(f"wgrumus {' '.join(argv)} exited with {p.returncode}: "
                           f"{p.stderr.strip().splitlines()[-1:] or ''}")
    return took


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:
        return "?"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=3, help="runs of each light command; the "
                    "fastest is reported (default 3; heavy ones run once)")
    ap.add_argument("--only", nargs="+", metavar="TEXT", help="rows whose command contains "
                    "one of these")
    ap.add_argument("--skip-large", action="store_true", help="skip the heavy rows (the GPU-size "
                    "gpt and `wgrumus bench`)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds per run (default 1800)")
    ap.add_argument("--json", action="store_true", help="also print one JSON object")
    a = ap.parse_args()
    rows = [c for c in COMMANDS if (not a.only or any(t in c[0] for t in a.only))
            and not (a.skip_large and c[2])]
    hw, sha = hardware(), commit()
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    print(f"Measured {day} at commit {sha} on {hw}; load average before: {_load()}.",
          flush=True)
    results = {}
    with tempfile.TemporaryDirectory(prefix="wgrumus-commands-") as tmp:
        for label, argv, heavy in rows:
            runs = []
            ckpt, saved = os.path.join(tmp, "ckpt"), os.path.join(tmp, "ckpt-first-run")
            for _ in range(1 if heavy else max(1, a.repeats)):
                if CKPT in argv:  # a new run: an empty folder; --resume: the first run's
                    shutil.rmtree(ckpt, ignore_errors=True)
                    if "--resume" in argv:
                        shutil.copytree(saved, ckpt)
                runs.append(time_command(argv, tmp, a.timeout))
            if CKPT in argv and "--resume" not in argv:
                shutil.rmtree(saved, ignore_errors=True)
                shutil.copytree(ckpt, saved)
            results[label] = runs
            print(f"  {label}: " + ", ".join(f"{r:.1f} s" for r in runs), file=sys.stderr,
                  flush=True)
    print(f"load average after: {_load()}\n")
    print("| command | fastest | slowest | runs |\n|---|---|---|---|")
    for label, runs in results.items():
        print(f"| `{label}` | {min(runs):.1f} s | {max(runs):.1f} s | {len(runs)} |")
    if a.json:
        print(json.dumps({"date": day, "commit": sha, "hardware": hw, "seconds": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
