"""Adapter discovery: every GPU once, on its best backend, selectable by WGRUMUS_ADAPTER."""
from __future__ import annotations

import os

import wgpu

from .errors import NoAdapterError

_BACKEND_RANK = {"Vulkan": 0, "Metal": 0, "D3D12": 1, "DX12": 1, "OpenGL": 3, "GL": 3}

INSTALL_HINT = ("install a WebGPU-capable driver: on Linux without a GPU `sudo apt-get install "
                "mesa-vulkan-drivers` gives the lavapipe software adapter; on a GPU machine "
                "install its Vulkan driver (Metal and DX12 work out of the box on macOS/Windows)")


def _name(info) -> str:
    # GL appends "/PCIe/SSE2"-style suffixes to the renderer name that Vulkan reports plainly.
    return (info.get("device") or "").split("/")[0].strip().lower()


def _same_gpu(a: dict, b: dict) -> bool:
    """Whether two adapter infos are one physical GPU seen through two backends. GL reports no
    device id (0), so ids are compared only where both backends give one."""
    if a.get("vendor_id") and b.get("vendor_id") and a["vendor_id"] != b["vendor_id"]:
        return False
    if a.get("device_id") and b.get("device_id"):
        return a["device_id"] == b["device_id"] and _name(a) == _name(b)
    na, nb = _name(a), _name(b)
    return bool(na) and (na == nb or na.startswith(nb) or nb.startswith(na))


def dedupe(adapters) -> list:
    """Each GPU once, on its best backend (Vulkan/Metal, then DX12, then GL), discrete GPUs first.
    Adapters of one backend are never merged: eight identical GPUs stay eight adapters."""
    ranked = sorted(adapters, key=lambda a: _BACKEND_RANK.get(a.info.get("backend_type", ""), 2))
    kept = []
    for a in ranked:
        rank = _BACKEND_RANK.get(a.info.get("backend_type", ""), 2)
        if not any(r < rank and _same_gpu(a.info, k.info) for r, k in kept):
            kept.append((rank, a))
    kind_rank = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
    kept.sort(key=lambda ra: (kind_rank.get(ra[1].info.get("adapter_type"), 2), ra[0]))
    return [a for _, a in kept]


def enumerate_adapters() -> list:
    """All distinct adapters, best backend first for each GPU, discrete GPUs before the rest."""
    os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")
    try:
        found = list(wgpu.gpu.enumerate_adapters_sync())
    except Exception as e:  # no loader / driver at all
        raise NoAdapterError(f"no WebGPU adapter could be enumerated ({e}); {INSTALL_HINT}") from e
    return dedupe(found)


class Selection(list):
    """Selected adapters, with ``indices``: each one's place in `enumerate_adapters()` (identical
    GPUs are told apart by that place only, their names and ids being equal)."""

    def __init__(self, adapters=(), indices=()):
        super().__init__(adapters)
        self.indices = list(indices)


def select_adapters(spec: str | None = None) -> Selection:
    """Adapters chosen by ``spec`` (default: $WGRUMUS_ADAPTER): an index, a name substring, or
    a comma-separated list of either. Unset: all adapters."""
    adapters = enumerate_adapters()
    if not adapters:
        raise NoAdapterError(f"no WebGPU adapter found; {INSTALL_HINT}")
    spec = os.environ.get("WGRUMUS_ADAPTER", "") if spec is None else spec
    if not spec.strip():
        return Selection(adapters, range(len(adapters)))
    chosen = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part.isdigit():
            i = int(part)
            if i >= len(adapters):
                raise NoAdapterError(f"WGRUMUS_ADAPTER={spec!r}: index {i} out of range; "
                                     f"{len(adapters)} adapter(s): {describe(adapters)}")
            chosen.append(i)
        else:
            m = [i for i, a in enumerate(adapters)
                 if part.lower() in a.info.get("device", "").lower()
                 or part.lower() == a.info.get("backend_type", "").lower()]
            if not m:
                raise NoAdapterError(f"WGRUMUS_ADAPTER={spec!r}: no adapter matches {part!r}; "
                                     f"available: {describe(adapters)}")
            chosen.extend(m)
    return Selection([adapters[i] for i in chosen], chosen)


def describe(adapters) -> str:
    return "; ".join(f"[{i}] {a.info.get('device')} ({a.info.get('backend_type')})"
                     for i, a in enumerate(adapters))
