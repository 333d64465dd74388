"""Refuse at import a wgpu-py outside the range pyproject.toml pins (older ones fail mid-training
instead of at the start)."""
from __future__ import annotations

WGPU_TESTED = ((0, 27), (0, 33))  # [lowest, first untested) minor versions


def _minor(version: str) -> tuple:
    parts = []
    for p in version.split(".")[:2]:
        digits = "".join(c for c in p if c.isdigit()) if p else ""
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts)))


def check_wgpu(version: str | None = None) -> None:
    """ImportError unless wgpu-py is in the tested range (WGRUMUS_ANY_WGPU=1 skips the check,
    to try a newer release at one's own risk)."""
    import os
    if version is None and os.environ.get("WGRUMUS_ANY_WGPU") == "1":
        return
    if version is None:
        import wgpu
        version = getattr(wgpu, "__version__", "unknown")
    lo, hi = WGPU_TESTED
    if version == "unknown" or not lo <= _minor(version) < hi:
        want = f"wgpu>={lo[0]}.{lo[1]},<{hi[0]}.{hi[1]}"
        raise ImportError(f"wgrumus needs {want} (tested {lo[0]}.{lo[1]} to {hi[0]}.{hi[1] - 1}), "
                          f"but wgpu {version} is installed; run: pip install '{want}' (or set "
                          f"WGRUMUS_ANY_WGPU=1 to try it anyway)")
