"""Helpers for tests that run wgrumus as a user does: in a separate process started from the
repository root, so the child imports this working tree and not an installed copy."""
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def subprocess_env(**extra) -> dict:
    """The child's environment: this repository first on PYTHONPATH and no WGRUMUS_DEVICES
    (conftest sets 8 for in-process tests; a command decides for itself unless ``extra``
    says otherwise)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    env.pop("WGRUMUS_DEVICES", None)
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def run_process(cmd, timeout: float, **env) -> subprocess.CompletedProcess:
    """Run ``cmd`` from the repository root with text output captured. stdin is closed so a
    child that waits for input fails instead of hanging until ``timeout``."""
    return subprocess.run([str(c) for c in cmd], cwd=ROOT, env=subprocess_env(**env),
                          capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def mpiexec():
    """The mpiexec next to this Python (where the mpich wheel installs it), else on PATH;
    None when there is none."""
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else shutil.which("mpiexec")


def mpi_3d_losses(ranks: int, cfg: str, layout: str, setup: str = "") -> list:
    """Rank 0's losses of ``train_3d(GPTConfig(cfg), layout, backend="mpi")`` under
    ``mpiexec -n ranks``, one device a process (``setup``: lines run first); skips where mpiexec
    or mpi4py is missing."""
    import json

    import pytest
    pytest.importorskip("mpi4py")
    if mpiexec() is None:
        pytest.skip("mpiexec not found (pip install 'wgrumus[mpi]')")
    script = "\n".join([
        "import json", "from mpi4py import MPI",
        "from wgrumus.distributed.parallel3d import GPTConfig, train_3d", setup,
        f"losses = train_3d(GPTConfig({cfg}), {layout}, backend='mpi', timeout=60)",
        "if MPI.COMM_WORLD.Get_rank() == 0:", "    print('LOSSES', json.dumps(losses))"])
    p = run_process([mpiexec(), "-n", ranks, sys.executable, "-c", script], 120,
                    WGRUMUS_DEVICES=1)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.split("LOSSES", 1)[1])


def mpi_skips() -> list:
    """A module's ``pytestmark``: skip its tests where mpiexec or mpi4py is missing."""
    import pytest
    try:
        import mpi4py  # noqa: F401
        have_mpi4py = True
    except ImportError:
        have_mpi4py = False
    return [
        pytest.mark.skipif(mpiexec() is None, reason="mpiexec not found (pip install "
                           "'wgrumus[mpi]' installs it with the mpich wheel)"),
        pytest.mark.skipif(not have_mpi4py, reason="mpi4py not installed (pip install "
                                                   "'wgrumus[mpi]')"),
    ]


def load_benchmark(name: str, reuse: bool = True):
    """benchmarks/<name>.py imported as module ``wgrumus_<name>`` and registered in sys.modules
    (so functions handed to worker processes pickle by reference). ``reuse``: the module an
    earlier test file loaded, if any; otherwise a fresh copy each call."""
    mod_name = f"wgrumus_{name}"
    if reuse and mod_name in sys.modules:
        return sys.modules[mod_name]
    spec = importlib.util.spec_from_file_location(mod_name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = mod
    spec.loader.exec_module(mod)
    return mod
