"""benchmarks/multi_adapter.sh: its syntax, its table helper, and its quick path on logical
devices (the GPU runs are the lead's; this keeps the script from breaking before they run)."""
import json
import shutil
import subprocess
import sys

import pytest
from _util import ROOT, load_benchmark, run_process

SCRIPT = ROOT / "benchmarks" / "multi_adapter.sh"


def test_script_parses():
    bash = shutil.which("bash")
    if bash is None:
        pytest.skip("no bash")
    subprocess.run([bash, "-n", str(SCRIPT)], check=True)


def test_table_uses_the_steady_field_and_names_failures(tmp_path, capsys):
    mod = load_benchmark("multi_adapter_table")
    runs = {"one": {"steady": {"tokens_per_s": 1000.0, "step_ms": 2.0, "steps": 9},
                    "throughput": 1.0},
            "two": {"steady": {"tokens_per_s": 1900.0, "step_ms": 2.1, "steps": 9}},
            "old": {"throughput": 500.0}}
    for name, rec in runs.items():
        (tmp_path / name).write_text("progress line\n" + json.dumps(rec) + "\n")
    mod.add(tmp_path, "cli", "mini", "1 adapter", 1, "", "-", 0, tmp_path / "one")
    mod.add(tmp_path, "cli", "mini", "dp2", 2, "1 adapter", "1.8", 0, tmp_path / "two")
    mod.add(tmp_path, "cli", "mini", "dp4", 4, "1 adapter", "3.3", 2, tmp_path / "old")
    mod.add(tmp_path, "cli", "mini", "dp2 old", 2, "1 adapter", "-", 0, tmp_path / "old")
    mod.table(tmp_path, [])
    out = capsys.readouterr().out
    rows = {line[8:30].strip(): line for line in out.splitlines()
            if line.startswith("mini")}
    assert "1.90x" in rows["dp2"] and "meets target" in rows["dp2"]
    assert "failed (exit 2" in rows["dp4"]
    assert "0.50x" in rows["dp2 old"] and "whole run" in rows["dp2 old"]


@pytest.mark.timeout(300)
def test_quick_path_runs_on_logical_devices(tmp_path):
    p = run_process(["bash", SCRIPT, tmp_path], 280, QUICK=1, PARTS="tp", ADAPTERS=2,
                    PYTHON=sys.executable)
    assert p.returncode == 0, p.stdout + p.stderr
    recs = [json.loads(line) for line in (tmp_path / "runs.jsonl").read_text().splitlines()]
    assert [r["row"] for r in recs] == ["1 adapter b4", "tp2 b4", "tp2 b4 c2",
                                        "tp2 b4 no-overlap", "1 adapter b8"]
    assert all(r["rc"] == 0 and r["tokens_per_s"] > 0 for r in recs), recs
    assert "summary" in p.stdout and "tp2 b4" in p.stdout.split("summary")[1]
