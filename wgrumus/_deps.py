"""Refuse at import a wgpu-py outside the range pyproject.toml pins (older ones fail mid-training
instead of at the start)."""
from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

WGPU_RANGE = ">=0.29,<0.33"  # pyproject.toml's wgpu requirement (tests/test_packaging.py)


def wgpu_in_range(version: str) -> bool:
    """Whether ``version`` is a wgpu-py release inside WGPU_RANGE (pre-releases count as their
    release: 0.32.1rc1 is in, 0.33.0.dev1 is out)."""
    try:
        v = Version(version)
    except InvalidVersion:
        return False
    return SpecifierSet(WGPU_RANGE).contains(v.base_version if v.is_prerelease else v)


def check_wgpu(version: str | None = None) -> None:
    """ImportError unless wgpu-py is in the tested range (WGRUMUS_ANY_WGPU=1 skips the check,
    to try another release at one's own risk)."""
    import os
    if version is None and os.environ.get("WGRUMUS_ANY_WGPU") == "1":
        return
    if version is None:
        import wgpu
        version = getattr(wgpu, "__version__", "unknown")
    if not wgpu_in_range(version):
        want = f"wgpu{WGPU_RANGE}"
        raise ImportError(f"wgrumus needs {want}, but wgpu {version} is installed; run: "
                          f"pip install '{want}' (or set WGRUMUS_ANY_WGPU=1 to try it anyway)")
