"""Helpers for tests that run wgrumus as a user does: in a separate process started from the
repository root, so the child imports this working tree and not an installed copy."""
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
