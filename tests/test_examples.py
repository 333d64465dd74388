"""Every example runs as a user would run it, with a tiny step count (CI on lavapipe)."""
import sys

import pytest
from _util import ROOT, mpiexec, run_process

EX = ROOT / "examples"


def run(cmd, timeout=170):
    """stdout of ``cmd``; each example asks for the devices it needs (no WGRUMUS_DEVICES)."""
    p = run_process(cmd, timeout)
    assert p.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


CASES = {
    "mlp_digits.py": (["--steps", "20"], "held-out accuracy"),
    "data_parallel.py": (["--steps", "4"], "replicas identical: True"),
    "pipeline_1f1b.py": (["--steps", "2"], "measured bubble per stage"),
    "tensor_parallel_block.py": (["--steps", "3"], "matches the dense block"),
    "gpt_3d.py": (["--steps", "1", "--block-size", "8"], "3D"),
}


def test_every_example_is_tested():
    assert set(CASES) | {"mpi_data_parallel.py"} == {p.name for p in EX.glob("*.py")}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", sorted(CASES))
def test_example(name):
    args, needle = CASES[name]
    out = run([sys.executable, str(EX / name), *args])
    assert needle in out, out


@pytest.mark.timeout(180)
@pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found (pip install 'wgrumus[mpi]')")
def test_mpi_example():
    pytest.importorskip("mpi4py")
    out = run([mpiexec(), "-n", "2", sys.executable, str(EX / "mpi_data_parallel.py"),
               "--steps", "3"])
    assert "replicas identical across processes: True" in out and "(2 processes)" in out
