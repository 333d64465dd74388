"""`wgrumus bench`: the quick run of every benchmark it runs finishes and prints its table (each
one's wall time is printed, not asserted: speed is the benchmarks' business), and the README's
time table lists exactly the commands benchmarks/commands.py times."""
import re
import sys
import time

import pytest
from _util import ROOT, load_benchmark, run_process

from wgrumus.cli.bench import NOT_IN_ALL, available, quick_args

QUICK_RUN = [name for name in available() if name not in NOT_IN_ALL]


def _number(field: str) -> bool:
    return re.fullmatch(r"[-+]?[\d,]*\.?\d+(e[-+]?\d+)?[x%s]?", field.strip("()|")) is not None


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", QUICK_RUN)
def test_quick_run_finishes_and_prints_its_table(name):
    argv = quick_args(name, available()[name])
    t0 = time.perf_counter()
    p = run_process([sys.executable, "-m", "wgrumus", "bench", name, *argv], 590)
    took = time.perf_counter() - t0
    print(f"\nwgrumus bench {name} {' '.join(argv)}: {took:.1f} s")
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    rows = [ln for ln in p.stdout.splitlines()
            if len(ln.split()) >= 3 and any(_number(f) for f in ln.split())]
    assert rows, f"{name} printed no table:\n{p.stdout}"
    if name == "data_parallel":  # the 2-device rows run on logical devices, not skipped
        assert "skipping" not in p.stderr and "2 device(s)" in p.stdout
        assert any(ln.split()[:2] == ["2", "bucketed"] for ln in p.stdout.splitlines())


@pytest.mark.timeout(120)
def test_staging_pieces_prints_every_piece():
    p = run_process([sys.executable, str(ROOT / "benchmarks" / "staging_pieces.py"), "--rounds",
                     "5", "--sizes", "4096"], 110)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    for piece in ("download: flush", "download: wait until mapped", "download, whole",
                  "upload: host copy in", "device synchronize"):
        line = next(ln for ln in p.stdout.splitlines() if piece in ln)
        assert all(float(f) > 0 for f in line.split()[-2:]), line
    p = run_process([sys.executable, str(ROOT / "benchmarks" / "staging_pieces.py"),
                     "--host-copies", "1"], 110)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    row = next(ln for ln in p.stdout.splitlines() if ln.lstrip().startswith("1MB"))
    assert len(re.findall(r"\d+ \(\s*[\d.]+\)", row)) == 6, row  # copy 1/split, sum 1/2/4/8


def test_every_benchmark_has_a_main_and_a_description():
    """A name `wgrumus bench --list` shows runs something (no helper modules listed)."""
    for name, path in available().items():
        text = path.read_text()
        assert 'if __name__ == "__main__":' in text, name
        assert text.lstrip().startswith('"""'), name


def test_readme_time_table_is_the_commands_benchmark():
    """One source of truth: the README's table rows are benchmarks/commands.py's, in order."""
    commands = load_benchmark("commands")
    readme = (ROOT / "README.md").read_text()
    section = readme.split("### How long the commands take", 1)[1].split("\n## ", 1)[0]
    assert "python benchmarks/commands.py" in section
    rows = [ln.split("|")[1].strip().strip("`") for ln in section.splitlines()
            if ln.startswith("| `wgrumus")]
    assert rows == [label for label, _, _ in commands.COMMANDS]
    listed = readme.split("## The `wgrumus` command", 1)[1].split("```bash", 1)[1].split("```")[0]
    for line in listed.strip().splitlines():  # each command the README lists has its row
        cmd = line.split("#")[0].strip()
        assert any(label.startswith(cmd) for label in rows), cmd
