"""The `wgrumus` command end to end, through subprocesses, as a user runs it (on lavapipe)."""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _util import ROOT, mpiexec, run_process, subprocess_env


def wgrumus(*args, timeout=120, **env):
    p = run_process([sys.executable, "-m", "wgrumus.cli", *args], timeout, **env)
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
    rc, out, err = wgrumus("devices", "--json", WGRUMUS_DEVICES="4")
    doc = json.loads(out)  # logical devices of one lavapipe adapter: all on adapter 0
    assert [d["adapter"] for d in doc["devices"]] == [0, 0, 0, 0], doc["devices"]
    assert [d["logical"] for d in doc["devices"]] == [0, 1, 2, 3]
    rc, out, err = wgrumus("devices", WGRUMUS_DEVICES="4")
    rows = [ln.split("│") for ln in out.splitlines() if ln.count("│") == 5]
    dev_rows = [[c.strip() for c in r[1:-1]] for r in rows if r[1].strip().isdigit()]
    assert [r[0] for r in dev_rows] == ["0", "1", "2", "3"] and \
        [r[2] for r in dev_rows] == ["0", "0", "0", "0"], out
    rc, out, err = wgrumus("devices", WGRUMUS_ADAPTER="no-such-gpu-xyz")
    assert rc == 1 and "no adapter matches" in err and "Traceback" not in err


# ------------------------------------------------------------------------------ bad input
BAD = [
    (["train", "resnet"], "unknown model 'resnet'"),
    (["train", "mlp", "--steps", "0"], "--steps: must be > 0"),
    (["train", "mlp", "--batch-size", "-4"], "--batch-size: must be > 0"),
    (["train", "mlp", "--lr", "0"], "--lr: must be > 0"),
    (["train", "gpt", "--n-layer", "0"], "--n-layer: must be > 0"),
    (["train", "mlp", "--dp", "2", "--pp", "2", "--devices", "2"], "4 devices needed"),
    (["train", "mlp", "--tp", "2", "--devices", "2"], "tensor parallelism"),
    (["train", "gpt", "--n-embd", "30", "--n-head", "4"], "not divisible by --n-head"),
    (["train", "gpt", "--pp", "3", "--n-layer", "2", "--devices", "3"], "at least 3 layers"),
    (["train", "mlp", "--dp", "2", "--batch-size", "5", "--devices", "2"], "split evenly"),
    (["train", "mlp", "--resume"], "--resume needs --checkpoint"),
    (["train", "mlp", "--steps", "3", "--epochs", "1"], "not both"),
    (["train", "mlp", "--optimizer", "lbfgs"], "invalid choice: 'lbfgs'"),
    (["train", "mlp", "--checkpoint", "/proc/wgrumus-ckpt"], "not a writable directory"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    # a misspelt or shortened option is named, with the command whose --help lists them
    (["train", "mlp", "--stpes", "5"], "wgrumus train: error: unrecognized arguments: --stpes 5 "
     "(see wgrumus train --help)"),
    (["train", "mlp", "--step", "5"], "unrecognized arguments: --step 5 (see wgrumus train"),
    (["demo", "--ste", "5"], "unrecognized arguments: --ste 5 (see wgrumus demo --help)"),
    (["devices", "--js"], "unrecognized arguments: --js (see wgrumus devices --help)"),
    (["train", "mlp", "--plot", "/nonexistent-wgrumus/x.png"],
     "--plot '/nonexistent-wgrumus/x.png': folder '/nonexistent-wgrumus' does not exist"),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("args,needle", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_arguments_exit_2_with_one_line(args, needle, capsys):
    """In-process (fast): each is rejected before any device is touched."""
    from wgrumus.cli import main
    try:
        rc = main(args)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    out, err = capsys.readouterr()
    assert rc == 2, (rc, out, err)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0], err
    assert out == ""


@pytest.mark.timeout(60)
def test_more_ranks_than_devices_exit_2():
    rc, out, err = wgrumus("train", "mlp", "--dp", "4")  # the process has 1 device
    assert rc == 2 and out == "", (rc, out, err)
    assert err.strip() == ("wgrumus train: error: --dp 4 x --tp 1 x --pp 1 = 4 devices needed, "
                           "but this process has 1; pass --devices 4 (logical devices share an "
                           "adapter) or set WGRUMUS_DEVICES=4")


@pytest.mark.timeout(60)
def test_help_of_every_command(capsys):
    from wgrumus.cli import main
    for cmd in ([], ["devices"], ["train"], ["bench"], ["demo"]):
        with pytest.raises(SystemExit) as e:
            main([*cmd, "--help"])
        out = capsys.readouterr().out
        assert e.value.code == 0 and "usage: wgrumus" in out, cmd
    rc, out, err = wgrumus("--help")  # and the real entry point, as a process
    assert rc == 0 and "devices" in out and "demo" in out, err
    script = Path(sys.executable).parent / "wgrumus"  # the console script of an installed venv
    if script.exists():
        p = subprocess.run([str(script), "--version"], capture_output=True, text=True,
                           timeout=60, env=subprocess_env())
        assert p.returncode == 0 and p.stdout.startswith("wgrumus "), p.stderr


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


# ----------------------------------------------------------------------------------- train
GPT_TINY = ["--n-layer", "2", "--n-embd", "16", "--n-head", "2", "--block-size", "8",
            "--batch-size", "8"]


@pytest.mark.timeout(120)
def test_train_mlp_json_learns_and_reports_accuracy():
    res = train_json("mlp", "--steps", "25", "--lr", "0.01")
    check_record(res, "mlp", 25, {"dp": 1, "tp": 1, "pp": 1, "devices": 1})
    assert res["final_loss"] < res["losses"][0] - 0.5, res["losses"]
    assert 0.5 < res["accuracy"] <= 1.0


@pytest.mark.timeout(120)
def test_train_cnn_json():
    res = train_json("cnn", "--steps", "4", "--batch-size", "16")
    check_record(res, "cnn", 4)
    assert 0.0 <= res["accuracy"] <= 1.0


@pytest.mark.timeout(120)
def test_train_gpt_json_has_eval_loss_and_sample():
    res = train_json("gpt", *GPT_TINY, "--steps", "3")
    check_record(res, "gpt", 3)
    assert res["throughput_unit"] == "tokens/s"
    assert res["eval_loss"] > 0 and isinstance(res["sample"], str) and len(res["sample"]) > 0


@pytest.mark.timeout(180)
def test_mlp_layouts_agree_step_by_step():
    """Same seed -> same weights and data order: dp / pp / dp x pp follow the 1-device curve."""
    ref = train_json("mlp", "--steps", "4")["losses"]
    for layout in (["--dp", "2", "--devices", "2"],
                   ["--pp", "2", "--devices", "2", "--schedule", "gpipe"],
                   ["--dp", "2", "--pp", "2", "--devices", "4", "--micro-batches", "2"]):
        res = train_json("mlp", "--steps", "4", *layout)
        assert res["layout"]["devices"] == int(layout[layout.index("--devices") + 1])
        assert res["losses"] == pytest.approx(ref, rel=1e-4), layout


@pytest.mark.timeout(240)
def test_gpt_3d_layout_agrees_with_one_device():
    ref = train_json("gpt", *GPT_TINY, "--steps", "2")["losses"]
    res = train_json("gpt", *GPT_TINY, "--steps", "2", "--dp", "2", "--tp", "2", "--pp", "2",
                     "--devices", "8")
    assert res["layout"] == {"dp": 2, "tp": 2, "pp": 2, "schedule": "1f1b", "micro_batches": 4,
                             "devices": 8, "backend": "threads"}
    assert res["losses"] == pytest.approx(ref, rel=1e-4)
    assert len(res["devices"]) == 8


@pytest.mark.timeout(240)
@pytest.mark.parametrize("schedule", ["interleaved", "zb-h1"])
def test_gpt_every_schedule_agrees_with_one_device(schedule):
    tiny = [*GPT_TINY, "--n-layer", "4", "--steps", "2"]  # 4 layers: 2 chunks per pp rank
    ref = train_json("gpt", *tiny)["losses"]
    res = train_json("gpt", *tiny, "--dp", "2", "--tp", "2", "--pp", "2", "--devices", "8",
                     "--schedule", schedule)
    assert res["layout"]["schedule"] == schedule
    assert res["losses"] == pytest.approx(ref, rel=1e-4)


@pytest.mark.timeout(240)
def test_checkpoint_and_resume_match_an_uninterrupted_run(tmp_path):
    ck = tmp_path / "ck"
    full = train_json("mlp", "--steps", "8")["losses"]
    first = train_json("mlp", "--steps", "4", "--checkpoint", ck, "--checkpoint-every", "2")
    assert (ck / "checkpoint.safetensors").exists()
    assert not [p for p in ck.iterdir() if ".tmp" in p.name]  # atomic: no leftovers
    # resume in another layout: the checkpoint is dense
    rest = train_json("mlp", "--steps", "8", "--checkpoint", ck, "--resume", "--pp", "2",
                      "--devices", "2")
    assert rest["steps_this_run"] == 4 and rest["losses"][:4] == first["losses"]
    assert rest["losses"] == pytest.approx(full, rel=1e-4)
    # the checkpoint is plain safetensors
    from safetensors.numpy import load_file
    assert any(k.startswith("model.") for k in load_file(str(ck / "checkpoint.safetensors")))


def _as_format_1(skel):
    """The checkpoint skeleton as earlier releases wrote it (cli/checkpoint.py LEGACY)."""
    if isinstance(skel, dict):
        if set(skel) == {"__tensor__"}:
            return {"__array__": skel["__tensor__"]}
        return {"__dict__": [[{"__int__": int(k)} if k.isdigit() else k, _as_format_1(v)]
                             for k, v in skel.items()]}
    if isinstance(skel, list):
        return {"__list__": [_as_format_1(v) for v in skel], "tuple": False}
    return skel


@pytest.mark.timeout(240)
def test_resume_reads_checkpoints_of_earlier_releases(tmp_path):
    from wgrumus import io
    ck = tmp_path / "ck"
    full = train_json("mlp", "--steps", "6")["losses"]
    train_json("mlp", "--steps", "3", "--checkpoint", ck)
    path = str(ck / "checkpoint.safetensors")
    arrays, meta = io.load_numpy(path)
    meta.update(format="wgrumus-train-1",
                state=json.dumps(_as_format_1(json.loads(meta["state"]))))
    io.save(arrays, path, meta)
    rest = train_json("mlp", "--steps", "6", "--checkpoint", ck, "--resume")
    assert rest["steps_this_run"] == 3
    assert rest["losses"] == pytest.approx(full, rel=1e-4)


@pytest.mark.timeout(120)
def test_resume_errors_exit_2(tmp_path, capsys):
    from wgrumus.cli import main
    ck = tmp_path / "ck"
    train_json("mlp", "--steps", "2", "--checkpoint", ck)

    def resume(model, steps, where):  # in-process: each is rejected before any model is built
        rc = main(["train", model, "--steps", str(steps), "--checkpoint", str(where),
                   "--resume"])
        err = capsys.readouterr().err
        assert rc == 2 and len(err.strip().splitlines()) == 1, err
        return err

    err = resume("cnn", 4, ck)
    assert "different model" in err and "mlp" in err, err
    assert "already at step 2" in resume("mlp", 2, ck)
    assert "no checkpoint" in resume("mlp", 4, tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "checkpoint.safetensors").write_bytes(b"\x10\x00garbage")
    assert "not a readable checkpoint" in resume("mlp", 4, tmp_path / "bad")
    rc = main(["train", "mlp", "--steps", "4", "--seed", "7", "--checkpoint", str(ck),
               "--resume"])
    assert rc == 2 and "seed" in capsys.readouterr().err


@pytest.mark.timeout(120)
def test_ctrl_c_stops_cleanly_and_saves_a_checkpoint(tmp_path):
    ck = tmp_path / "ck"
    p = subprocess.Popen([sys.executable, "-m", "wgrumus.cli", "train", "mlp", "--steps",
                          "100000", "--checkpoint", str(ck), "--json"], cwd=ROOT,
                         env=subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 60
        while time.time() < deadline and not (ck / "checkpoint.safetensors").exists():
            time.sleep(0.5)  # the periodic checkpoint shows training is under way
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 130, err
    res = json.loads(out)
    assert res["interrupted"] and res["steps"] >= 50
    from safetensors import safe_open
    with safe_open(str(ck / "checkpoint.safetensors"), "numpy") as f:
        assert int(f.metadata()["step"]) == res["steps"]


# ------------------------------------------------------------------------------------ demo
@pytest.mark.timeout(180)
def test_demo_runs_data_and_pipeline_parallel():
    rc, out, err = wgrumus("demo", "--steps", "6", timeout=170)
    assert rc == 0, out + err
    assert "wgrumus demo" in out and "dp=2" in out and "pp=2" in out
    assert "held-out accuracy" in out


# ------------------------------------------------------------------------------------- mpi
@pytest.mark.timeout(240)
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found (pip install 'wgrumus[mpi]')")
def test_mpiexec_two_ranks_only_rank0_prints():
    pytest.importorskip("mpi4py")
    p = run_process([mpiexec(), "-n", "2", sys.executable, "-m", "wgrumus.cli", "train", "mlp",
                     "--backend", "mpi", "--dp", "2", "--steps", "4", "--json"], 200)
    assert p.returncode == 0, p.stdout + p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.strip()]
    assert len(lines) == 1, p.stdout  # rank 1 prints nothing
    res = json.loads(lines[0])
    assert res["layout"]["backend"] == "mpi" and res["layout"]["dp"] == 2
    ref = train_json("mlp", "--steps", "4")["losses"]
    assert res["losses"] == pytest.approx(ref, rel=1e-4)


# --------------------------------------------------------------- README and bench plumbing
@pytest.mark.timeout(120)
def test_readme_python_example_runs(tmp_path):
    text = (ROOT / "README.md").read_text()
    start = text.index("```python", text.index("## About ten lines of Python")) + len("```python")
    code = text[start:text.index("```", start)]
    script = tmp_path / "readme_example.py"
    script.write_text(code)
    p = run_process([sys.executable, script], 110)
    assert p.returncode == 0, p.stderr
    loss = float(p.stdout.split()[1])
    assert loss < 0.15, p.stdout  # it learned the toy target


@pytest.mark.timeout(120)
def test_bench_runs_one_benchmark_with_its_arguments():
    rc, out, err = wgrumus("bench", "collectives", "--backend", "threads", "--ranks", "2",
                           "--sizes", "4096", "--strategies", "ring", "--no-reference")
    assert rc == 0, out + err
    assert "algbw" in out and "ring" in out


@pytest.mark.timeout(120)
def test_bench_json_prints_one_document_of_every_benchmark_run():
    rc, out, err = wgrumus("bench", "--json", "collectives", "--backend", "threads", "--ranks",
                           "2", "--sizes", "4096", "--strategies", "ring", "--no-reference")
    assert rc == 0, out + err
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out
    rows = json.loads(lines[0])["collectives"]
    assert [(r["strategy"], r["ranks"], r["bytes"]) for r in rows] == [("ring", 2, 4096)]
    assert rows[0]["algbw_GBps"] > 0 and "collectives" in err  # progress on stderr


@pytest.mark.timeout(120)
def test_loss_curve_png_when_matplotlib_is_installed(tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--plot", png)
    assert rc == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.timeout(120)
def test_terminal_plot_without_matplotlib():
    from wgrumus.cli.plot import terminal_plot
    art = terminal_plot([3.0 - 0.1 * i for i in range(30)], width=20, height=5)
    rows = art.splitlines()
    assert len(rows) == 7 and rows[0].strip().startswith("3") and "step 1" in rows[-1]
    assert rows[0].count("█") < rows[4].count("█")  # falling loss: the top row is shortest
