"""Rough edges of `wgrumus train`, each through the entry point in a subprocess: sizes the data
cannot hold, non-finite learning rates and losses, strict --json, existing checkpoints,
--devices against WGRUMUS_DEVICES, a second Ctrl-C, and --plot."""
import json
import signal
import subprocess
import sys
import time

import pytest
from _util import ROOT, run_process, subprocess_env


def wgrumus(*args, timeout=150, **env):
    p = run_process([sys.executable, "-m", "wgrumus", *map(str, args)], timeout, **env)
    return p.returncode, p.stdout, p.stderr


def one_line_usage_error(rc, err):
    assert rc == 2, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    return err


def strict_json(out):
    """The one line of --json, parsed strictly: bare NaN / Infinity are not JSON."""
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert len(lines) == 1, out

    def bad(name):
        raise AssertionError(f"--json printed a bare {name}")
    return json.loads(lines[0], parse_constant=bad)


@pytest.mark.timeout(120)
def test_block_size_longer_than_the_text_is_one_line():
    err = one_line_usage_error(*wgrumus("train", "gpt", "--block-size", "20000")[::2])
    assert "--block-size 20000" in err and "or less" in err


@pytest.mark.timeout(120)
@pytest.mark.parametrize("flag,value,msg", [("--lr", "nan", "finite"), ("--lr", "inf", "finite"),
                                            ("--lr", "-1", "> 0"), ("--lr", "0", "> 0"),
                                            ("--epochs", "inf", "finite")])
def test_learning_rate_must_be_finite_and_positive(flag, value, msg):
    rc, _, err = wgrumus("train", "mlp", flag, value)
    assert msg in one_line_usage_error(rc, err) and flag in err


@pytest.mark.timeout(240)
def test_diverging_run_stops_with_a_message_and_strict_json(tmp_path):
    ck = tmp_path / "ck"
    rc, out, err = wgrumus("train", "mlp", "--optimizer", "sgd", "--lr", "1e9", "--steps", "30",
                           "--checkpoint", ck, "--checkpoint-every", "1", "--json")
    assert rc == 1, err
    res = strict_json(out)
    assert res["diverged"] is True and res["final_loss"] is None
    assert res["steps"] < 30 and res["losses"][-1] is None  # stopped at the first bad loss
    assert all(v is not None for v in res["losses"][:-1])
    last = err.strip().splitlines()[-1]
    assert "diverged" in last and "--lr" in last and f"step {res['steps']}" in last
    from safetensors import safe_open  # the checkpoint keeps the last finite state
    with safe_open(str(ck / "checkpoint.safetensors"), "numpy") as f:
        assert int(f.metadata()["step"]) == res["steps"] - 1
        assert None not in json.loads(f.metadata()["losses"])


@pytest.mark.timeout(240)
def test_existing_checkpoint_needs_resume_or_overwrite(tmp_path):
    ck = tmp_path / "ck"
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--checkpoint", ck, "--json")
    assert rc == 0, err
    before = (ck / "checkpoint.safetensors").read_bytes()
    err = one_line_usage_error(*wgrumus("train", "mlp", "--steps", "2", "--checkpoint", ck)[::2])
    assert "already holds a checkpoint" in err and "--resume" in err and "--overwrite" in err
    assert (ck / "checkpoint.safetensors").read_bytes() == before  # untouched
    err = one_line_usage_error(*wgrumus("train", "mlp", "--checkpoint", ck, "--resume",
                                        "--overwrite")[::2])
    assert "not both" in err
    # a flipped bit in the saved weights is caught by the checksum on --resume
    bad = tmp_path / "bad"
    bad.mkdir()
    data = bytearray(before)
    data[-7] ^= 0x20
    (bad / "checkpoint.safetensors").write_bytes(bytes(data))
    err = one_line_usage_error(*wgrumus("train", "mlp", "--steps", "5", "--checkpoint", bad,
                                        "--resume")[::2])
    assert "corrupt" in err and "checksum" in err
    rc, out, err = wgrumus("train", "mlp", "--steps", "2", "--checkpoint", ck, "--overwrite",
                           "--json")
    assert rc == 0, err
    assert strict_json(out)["steps"] == 2  # started over


@pytest.mark.timeout(180)
def test_devices_flag_overrides_the_environment():
    # the environment's value is not even read when --devices is given
    rc, out, err = wgrumus("train", "mlp", "--dp", "2", "--devices", "2", "--steps", "1",
                           "--json", WGRUMUS_DEVICES="not-a-number")
    assert rc == 0, err
    assert strict_json(out)["layout"]["devices"] == 2
    rc, out, err = wgrumus("train", "mlp", "--dp", "2", "--devices", "2", "--steps", "1",
                           "--json", WGRUMUS_DEVICES="1")
    assert rc == 0, err


@pytest.mark.timeout(120)
def test_device_shortfall_is_reported_first():
    """--dp 3 with 2 devices also gives a batch of 64 that 3 replicas cannot split: the device
    count is what to fix first."""
    err = one_line_usage_error(*wgrumus("train", "mlp", "--dp", "3", "--devices", "2")[::2])
    assert "3 devices needed" in err and "--devices 3" in err and "batch" not in err


@pytest.mark.timeout(200)
def test_second_ctrl_c_stops_at_once(tmp_path):
    """The first Ctrl-C asks for a stop after the step; the second leaves without waiting
    for the ranks to finish the step they are in (steps here take seconds on lavapipe)."""
    ck = tmp_path / "ck"
    p = subprocess.Popen([sys.executable, "-m", "wgrumus", "train", "gpt", "--dp", "2",
                          "--devices", "2", "--n-layer", "4", "--n-embd", "128",
                          "--batch-size", "64", "--steps", "100000", "--checkpoint", ck,
                          "--checkpoint-every", "1", "--json"], cwd=ROOT, env=subprocess_env(),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL)
    try:
        deadline = time.time() + 150
        while time.time() < deadline and not (ck / "checkpoint.safetensors").exists():
            time.sleep(0.2)  # the first checkpoint: training is under way
        assert p.poll() is None, p.communicate()[1]
        time.sleep(0.5)  # inside the next step
        p.send_signal(signal.SIGINT)
        time.sleep(0.5)
        p.send_signal(signal.SIGINT)
        t0 = time.time()
        _, err = p.communicate(timeout=60)
        took = time.time() - t0
    finally:
        if p.poll() is None:
            p.kill()
    lines = err.splitlines()  # the first Ctrl-C's line, then main's for the second
    assert p.returncode == 130 and FIRST_CTRL_C in lines and "interrupted" in lines, err
    assert took < 8.0, f"exited {took:.1f} s after the second Ctrl-C"


FIRST_CTRL_C = "interrupted: stopping after this step (Ctrl-C again stops at once)"


def test_first_ctrl_c_message_never_raises_into_the_step(monkeypatch):
    """A stderr pipe closed by the same Ctrl-C (`wgrumus train ... | tee log`): the first
    Ctrl-C's message is dropped, the stop after the step still requested (the BrokenPipeError
    went up through the step and lost the final checkpoint)."""
    from wgrumus.cli.loop import StopOnInterrupt

    class Closed:
        def write(self, text):
            raise BrokenPipeError(32, "Broken pipe")

        def flush(self):
            raise BrokenPipeError(32, "Broken pipe")
    monkeypatch.setattr(sys, "stderr", Closed())
    stop = StopOnInterrupt()
    stop._handler(signal.SIGINT, None)
    assert stop.requested
    with pytest.raises(KeyboardInterrupt):  # the second still stops at once
        stop._handler(signal.SIGINT, None)


# ----------------------------------------------------------------------------------- --plot
README_PLOT_HINT = "pip install matplotlib"  # right for a wheel install and a checkout


def test_readme_names_the_plot_extra():
    assert README_PLOT_HINT in (ROOT / "README.md").read_text()


@pytest.mark.timeout(120)
def test_plot_hint_when_matplotlib_is_missing(tmp_path):
    fake = tmp_path / "fake" / "matplotlib"  # an import that fails, as when it is not installed
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('no matplotlib here')\n")
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--plot", tmp_path / "d",
                           PYTHONPATH=f"{fake.parent}:{ROOT}")
    assert rc == 0, err
    assert f"loss per step ({README_PLOT_HINT} for a PNG):" in out
    assert not (tmp_path / "d.png").exists()
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--plot", tmp_path / "no" / "d.png",
                           PYTHONPATH=f"{fake.parent}:{ROOT}")
    one_line_usage_error(rc, err)  # refused before training, not silently dropped
    assert "does not exist" in err and out == ""


@pytest.mark.timeout(200)
@pytest.mark.parametrize("args", [["--dp", "2", "--devices", "2"],
                                  ["--dp", "2", "--pp", "2", "--devices", "4"]],
                         ids=["dp", "dp-pp"])
def test_mlp_data_parallel_rows_show_the_communication_share(args):
    """As gpt runs do: each replica's share of the run spent in its gradient all-reduces."""
    rc, out, err = wgrumus("train", "mlp", "--steps", "4", *args, "--json")
    assert rc == 0, err
    devs = strict_json(out)["devices"]
    assert len(devs) == int(args[-1])
    assert all(0 < d["comm share"] <= 1 for d in devs), devs


@pytest.mark.timeout(120)
def test_plot_prints_the_file_it_wrote_and_no_hint(tmp_path):
    pytest.importorskip("matplotlib")
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--plot", tmp_path / "d")
    assert rc == 0, err
    png = tmp_path / "d.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"loss curve: {png}" in out.replace("\n", "") and "pip install" not in out
    rc, out, err = wgrumus("train", "mlp", "--steps", "3", "--plot",
                           tmp_path / "d.unknown-format")
    assert rc == 0, err
    assert "could not write" in out and "pip install" not in out  # matplotlib is there
