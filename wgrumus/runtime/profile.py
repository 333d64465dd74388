"""One adapter profile per Device: what the adapter is and how kernels run best on it, decided
once from its info and features. Kernels ask the profile (and the tuning overrides,
runtime/tuning.py), never the adapter info."""
from __future__ import annotations

import re
from dataclasses import dataclass

# CPU adapters (lavapipe): outputs per invocation of the map kernel and elements per invocation
# of the optimizers' multi-tensor update, from a sweep on lavapipe (BENCHMARKS.md; GPUs: 1,
# their entries)
CPU_MAP_CHUNK = 16
CPU_UPDATE_CHUNK = 32
# Subgroup sizes per adapter class (wgpu reports placeholder bounds 4..128 on Vulkan; NVIDIA's
# are always warps of 32).
KNOWN_SUBGROUP_MIN = {"nvidia": 32}
_VENDORS = (("nvidia", (0x10DE,)), ("amd", (0x1002, 0x1022)), ("intel", (0x8086,)),
            ("apple", (0x106B,)))


@dataclass(frozen=True)
class AdapterProfile:
    adapter_class: str  # 'cpu', 'nvidia', 'amd', 'intel', 'apple' or 'gpu': kernel tables' key
    subgroups: bool  # the device has the subgroup feature
    lanes: int  # a CPU adapter's subgroup size where known (llvmpipe: its vector width), else 0
    subgroup_min: int | None  # the adapter's smallest / largest subgroup size, None: unknown
    subgroup_max: int | None
    row_mode: str  # row ops: 'thread' (an invocation per row, no barriers) or 'wg' (a workgroup)
    map_chunk: int  # outputs per invocation of the map kernel (1: map.wgsl)
    update_chunk: int  # elements per invocation of the multi-tensor optimizer update

    @property
    def cpu(self) -> bool:
        """A CPU adapter such as lavapipe: its memory is host memory, and kernels of another
        shape (no barriers, textures for read-heavy operands) run best there."""
        return self.adapter_class == "cpu"

    @staticmethod
    def of(info: dict, features=()) -> AdapterProfile:
        cls = "cpu" if str(info.get("adapter_type", "")).lower() == "cpu" else "gpu"
        name = f"{info.get('vendor', '')} {info.get('device', '')}".lower()
        for c, ids in _VENDORS:
            if cls == "gpu" and (info.get("vendor_id", 0) in ids or c in name):
                cls = c
        sg = "subgroup" in features
        # llvmpipe names its vector width ("llvmpipe (LLVM 15.0.6, 256 bits)": 8 f32 lanes)
        m = re.search(r"llvmpipe\b.*\b(\d+) bits", str(info.get("device", "")))
        lanes = int(m.group(1)) // 32 if m and sg else 0
        # wgpu-py 0.32 spells the keys "stackgroup_..."
        least = (KNOWN_SUBGROUP_MIN.get(cls) or info.get("subgroup_min_size")
                 or info.get("stackgroup_min_size") or None)
        most = (info.get("subgroup_max_size") or info.get("stackgroup_max_size") or None) \
            if sg else None
        cpu = cls == "cpu"
        return AdapterProfile(cls, sg, lanes, least, most, "thread" if cpu else "wg",
                              CPU_MAP_CHUNK if cpu else 1, CPU_UPDATE_CHUNK if cpu else 1)


def profile(dev) -> AdapterProfile:
    """``dev``'s profile: a Device's own, or worked out for anything with ``adapter_info`` (and
    optionally ``features``)."""
    got = getattr(dev, "profile", None)
    if got is not None:
        return got
    return AdapterProfile.of(dev.adapter_info, getattr(dev, "features", ()))
