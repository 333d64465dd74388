"""Adapter discovery: every GPU once, on its best backend, selectable by WGRUMUS_ADAPTER."""
from __future__ import annotations

import os

import wgpu

from .errors import NoAdapterError

_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "DX12": 1, "OpenGL": 3, "GL": 3}

INSTALL_HINT = ("install a WebGPU-capable driver: on Linux without a GPU `sudo apt-get install "
                "mesa-vulkan-drivers` gives the lavapipe software adapter; on a GPU machine "
                "install its Vulkan driver (Metal and DX12 work out of the box on macOS/Windows)")


def _key(info) -> tuple:
    # The same physical GPU seen through two backends shares vendor/device ids (or its name).
    return (info.get("vendor_id"), info.get("device_id"), info.get("device", ""))


def enumerate_adapters() -> list:
    """All distinct adapters, best backend first for each GPU, discrete GPUs before the rest."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        found = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # no loader / driver at all
        raise NoAdapterError(f"no WebGPU adapter could be enumerated ({e}); {INSTALL_HINT}") from e
    best: dict = {}
    for a in found:
        info = a.info
        k = _key(info)
        rank = _BACKEND_RANK.get(info.get("backend_type", ""), 2)
        if k not in best or rank < best[k][0]:
            best[k] = (rank, a)
    kind_rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    out = sorted(best.values(), key=lambda ra: (kind_rank.get(ra[1].info.get("adapter_type"), 2),
                                                ra[0]))
    return [a for _, a in out]


def select_adapters(spec: str | None = None) -> list:
    """Adapters chosen by ``spec`` (default: $WGRUMUS_ADAPTER): an index, a name substring, or
    a comma-separated list of either. Unset: all adapters."""
    adapters = enumerate_adapters()
    if not adapters:
        raise NoAdapterError(f"no WebGPU adapter found; {INSTALL_HINT}")
    spec = os.environ.get("WGRUMUS_ADAPTER", "") if spec is None else spec
    if not spec.strip():
        return adapters
    chosen = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part.isdigit():
            i = int(part)
            if i >= len(adapters):
                raise NoAdapterError(f"WGRUMUS_ADAPTER={spec!r}: index {i} out of range; "
                                     f"{len(adapters)} adapter(s): {describe(adapters)}")
            chosen.append(adapters[i])
        else:
            m = [a for a in adapters if part.lower() in a.info.get("device", "").lower()
                 or part.lower() == a.info.get("backend_type", "").lower()]
            if not m:
                raise NoAdapterError(f"WGRUMUS_ADAPTER={spec!r}: no adapter matches {part!r}; "
                                     f"available: {describe(adapters)}")
            chosen.extend(m)
    return chosen


def describe(adapters) -> str:
    return "; ".join(f"[{i}] {a.info.get('device')} ({a.info.get('backend_type')})"
                     for i, a in enumerate(adapters))
