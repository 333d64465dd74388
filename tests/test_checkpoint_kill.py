"""Nothing lost (issue 10, item 3): SIGKILL a training process while it overwrites its checkpoint
and the previous checkpoint still loads and resumes bit for bit; loading never runs code from a
file (no pickle in any loading path). The 20+-kill campaign is
``python benchmarks/reliability.py --campaign kill --kills 25``."""
import ast
import os
import pickle
import sys

import numpy as np
import pytest
from _util import ROOT, load_benchmark

import wgrumus as wr
import wgrumus.io as wio
from wgrumus import nn

rel = load_benchmark("reliability")

pytestmark = pytest.mark.skipif(not hasattr(os, "kill") or sys.platform == "win32",
                                reason="needs POSIX SIGKILL")


@pytest.mark.timeout(150)
def test_kill_9_while_checkpointing_always_leaves_a_resumable_checkpoint(tmp_path, devs):
    recs = rel.kill_campaign(5, seed=11, folder=tmp_path, log=lambda *_: None, max_delay=0.8)
    bad = [r for r in recs if not r["ok"]]
    assert not bad, bad
    assert all(r["loaded_step"] >= r["last_saved"] for r in recs), recs
    assert all(r["temp_files_after_next_save"] == 0 for r in recs), recs
    # half the kills wait for a write to start and strike 0-20 ms into it
    assert any(r["mode"] == "during-write" for r in recs), recs


def test_stale_temporaries_of_dead_writers_are_removed(tmp_path):
    """A writer killed mid-write leaves .tmp-<name>-<pid>-*; the next save of that file removes
    it when that pid no longer runs, and leaves a live writer's temporary alone."""
    import subprocess
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    dead = tmp_path / f".tmp-ck.safetensors-{p.pid}-abc"
    live = tmp_path / f".tmp-ck.safetensors-{os.getppid()}-def"
    other = tmp_path / f".tmp-other.safetensors-{p.pid}-ghi"
    for f in (dead, live, other):
        f.write_bytes(b"partial")
    wr.save({"a": np.ones(2, np.float32)}, tmp_path / "ck.safetensors")
    assert not dead.exists() and live.exists() and other.exists()
    assert np.array_equal(wr.load(tmp_path / "ck.safetensors")["a"].numpy(), np.ones(2))


def test_reference_replay_is_deterministic(devs):
    """The campaign compares checkpoints with a replayed run: the replay must be exact."""
    a, b = rel.Reference(), rel.Reference()
    for x, y in zip(a.at(2), b.at(2)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.at(0)[0], a.at(2)[0])  # it does train


# ------------------------------------------------------------------------------- no pickle
LOADING_CODE = ["wgrumus/io.py", "wgrumus/cli/checkpoint.py", "wgrumus/data",
                "wgrumus/nn/module.py"]
FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve", "joblib"}


def _py_files(rel_path):
    p = ROOT / rel_path
    return [p] if p.is_file() else sorted(p.rglob("*.py"))


def test_loading_code_imports_no_pickle():
    found = []
    for rp in LOADING_CODE:
        for f in _py_files(rp):
            tree = ast.parse(f.read_text(), str(f))
            for node in ast.walk(tree):
                names = []
                if isinstance(node, ast.Import):
                    names = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module.split(".")[0]]
                elif isinstance(node, ast.keyword) and node.arg == "allow_pickle":
                    if not (isinstance(node.value, ast.Constant) and node.value.value is False):
                        found.append(f"{f}:{node.lineno} allow_pickle")
                elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                        "eval", "exec"):
                    found.append(f"{f}:{node.lineno} {node.func.id}()")
                found += [f"{f}:{node.lineno} imports {n}" for n in names
                          if n in FORBIDDEN_MODULES]
    assert not found, found


class _Payload:
    """Unpickling this would create ``marker``: proof that code ran."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_malicious_pickle_payload_is_rejected_and_never_runs(tmp_path, dev):
    marker = tmp_path / "pwned"
    evil = pickle.dumps({"weight": _Payload(str(marker))})
    m = nn.Linear(3, 2, device=dev)
    for name, data in [("plain.safetensors", evil),
                       ("prefixed.safetensors", len(evil).to_bytes(8, "little") + evil),
                       ("pt.bin", evil)]:
        p = tmp_path / name
        p.write_bytes(data)
        with pytest.raises(wio.CheckpointError):
            wr.load(p)
        with pytest.raises(wio.CheckpointError):
            wio.load_checkpoint(p, m)
        with pytest.raises(wio.CheckpointError):
            wio.load_numpy(p)
    assert not marker.exists(), "loading executed code from the file"


def test_pickle_bytes_inside_metadata_stay_inert(tmp_path, dev):
    """A valid file whose metadata holds pickle bytes loads; the bytes stay a string."""
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(str(marker))).hex()
    p = tmp_path / "ok.safetensors"
    wr.save({"w": np.ones(3, np.float32)}, p, metadata={"note": evil})
    arrays, meta = wio.load_numpy(p)
    assert meta["note"] == evil and np.array_equal(arrays["w"], np.ones(3, np.float32))
    assert not marker.exists()
