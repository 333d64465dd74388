"""Every example runs as a user would run it, with a tiny step count (CI on lavapipe)."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EX = ROOT / "examples"


def _env():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("WGRUMUS_DEVICES", None)  # each example asks for the devices it needs
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    return env


def run(cmd, timeout=170):
    p = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True,
                       timeout=timeout, stdin=subprocess.DEVNULL)
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


def _mpiexec():
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


@pytest.mark.timeout(180)
@pytest.mark.skipif(_mpiexec() is None, reason="mpiexec not found (pip install 'wgrumus[mpi]')")
def test_mpi_example():
    pytest.importorskip("mpi4py")
    out = run([_mpiexec(), "-n", "2", sys.executable, str(EX / "mpi_data_parallel.py"),
               "--steps", "3"])
    assert "replicas identical across processes: True" in out and "(2 processes)" in out
