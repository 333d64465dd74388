"""The `wgrumus` command end to end, through subprocesses, as a user runs it (on lavapipe)."""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("WGRUMUS_DEVICES", None)  # the command decides (conftest sets 8 for in-process tests)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env.update(extra)
    return env


def wgrumus(*args, timeout=120, **env):
    p = subprocess.run([sys.executable, "-m", "wgrumus.cli", *map(str, args)], cwd=ROOT,
                       env=_env(**env), capture_output=True, text=True, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout, p.stderr


def train_json(*args, timeout=120, **env):
    rc, out, err = wgrumus("train", *args, "--json", timeout=timeout, **env)
    assert rc == 0, out + err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, f"--json must print exactly one line, got:\n{out}"
    return json.loads(lines[0])


def check_record(res, model, steps, layout=None):
    assert res["model"] == model
    assert res["steps"] == steps and len(res["losses"]) == steps
    assert all(isinstance(v, float) for v in res["losses"])
    assert res["final_loss"] == res["losses"][-1]
    assert res["seconds"] > 0 and res["throughput"] > 0
    for k in ("dp", "tp", "pp", "schedule", "devices"):
        assert k in res["layout"]
    if layout:
        for k, v in layout.items():
            assert res["layout"][k] == v, (k, res["layout"])


# ------------------------------------------------------------------------------- devices
@pytest.mark.timeout(60)
def test_devices_table_and_json():
    rc, out, err = wgrumus("devices")
    assert rc == 0, err
    assert "WebGPU adapters" in out and "WGRUMUS_DEVICES" in out and "WGRUMUS_ADAPTER" in out
    rc, out, err = wgrumus("devices", "--json", WGRUMUS_DEVICES="3")
    assert rc == 0, err
    doc = json.loads(out)
    assert len(doc["adapters"]) >= 1 and doc["adapters"][0]["max_buffer_size"] > 0
    assert [d["index"] for d in doc["devices"]] == [0, 1, 2]
    assert [d["default"] for d in doc["devices"]] == [True, False, False]
    rc, out, err = wgrumus("devices", WGRUMUS_ADAPTER="no-such-gpu-xyz")
    assert rc == 1 and "no adapter matches" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ bad input
BAD = [
    (["train", "resnet"], "unknown model 'resnet'"),
    (["train", "mlp", "--steps", "0"], "--steps: must be > 0"),
    (["train", "mlp", "--batch-size", "-4"], "--batch-size: must be > 0"),
    (["train", "mlp", "--lr", "0"], "--lr: must be > 0"),
    (["train", "mlp", "--dp", "2", "--pp", "2", "--devices", "2"], "4 devices needed"),
    (["train", "mlp", "--dp", "4"], "pass --devices 4"),
    (["train", "mlp", "--tp", "2", "--devices", "2"], "tensor parallelism"),
    (["train", "gpt", "--n-embd", "30", "--n-head", "4"], "not divisible by --n-head"),
    (["train", "mlp", "--resume"], "--resume needs --checkpoint"),
    (["train", "mlp", "--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
    (["train", "mlp", "--checkpoint", "/proc/wgrumus-ckpt"], "not a writable directory"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(args, needle):
    rc, out, err = wgrumus(*args)
    assert rc == 2, (rc, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert out == ""


@pytest.mark.timeout(60)
def test_help_of_every_command():
    for cmd in ([], ["devices"], ["train"], ["bench"], ["demo"]):
        rc, out, err = wgrumus(*cmd, "--help")
        assert rc == 0 and "usage: wgrumus" in out, err


# ----------------------------------------------------------------------------------- bench
@pytest.mark.timeout(60)
def test_bench_lists_benchmarks_and_rejects_unknown():
    rc, out, err = wgrumus("bench", "--list")
    assert rc == 0 and "collectives" in out, err
    rc, out, err = wgrumus("bench", "nosuchbench")
    assert rc == 2 and "unknown benchmark 'nosuchbench'" in err


# ---------------------------------------------------------------------------------- README
def test_readme_schedule_picture_is_the_real_schedule():
    """The 1F1B picture in README.md is what the schedule code prints (kept true)."""
    from wgrumus.distributed.pipeline import get_schedule, render
    assert render(get_schedule("1f1b", 4, 8)).rstrip() in (ROOT / "README.md").read_text()


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text().splitlines()
    i = readme.index("<!-- test-command -->")
    cmd = next(ln for ln in readme[i + 1:] if not ln.startswith("```"))
    ci = (ROOT / ".ci" / "run").read_text()
    assert "test-command" in ci and cmd.startswith("python -m pytest")
