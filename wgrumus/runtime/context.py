"""MultiGpuContext: the one set of devices of this process."""
from __future__ import annotations

import os
import threading

from .adapters import Selection, select_adapters
from .device import Device
from .errors import DeviceNameError, WgrumusError


def parse_device_count(text: str) -> int | None:
    """WGRUMUS_DEVICES: empty -> None (one device per adapter), else a positive integer."""
    text = (text or "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise WgrumusError(f"WGRUMUS_DEVICES={text!r} is not a positive integer; set it to the "
                           f"number of devices to use (more than the adapters present makes "
                           f"several logical devices per adapter) or unset it")
    return int(text)


class MultiGpuContext:
    _instance: MultiGpuContext | None = None
    _lock = threading.Lock()

    def __init__(self, adapters, count: int | None = None):
        if count is not None and count < 1:
            raise WgrumusError(f"WGRUMUS_DEVICES must be >= 1, got {count}")
        n = count or len(adapters)
        # More devices than adapters: round-robin logical devices (separate wgpu devices) over
        # the adapters, which is how multi-device code runs on one lavapipe adapter.
        places = getattr(adapters, "indices", None) or list(range(len(adapters)))
        self.devices = []
        for i in range(n):
            k = i % len(adapters)
            self.devices.append(Device(i, adapters[k], logical=i // len(adapters),
                                       adapter_index=places[k]))

    @classmethod
    def get(cls) -> MultiGpuContext:
        with cls._lock:
            if cls._instance is None:
                count = parse_device_count(os.environ.get("WGRUMUS_DEVICES", ""))
                cls._instance = cls(select_adapters(), count)
            return cls._instance

    @classmethod
    def pin_local(cls, local_rank: int) -> bool:
        """MPI: this process's context on adapter ``local_rank % adapters`` alone (N ranks open
        N devices, not N each), unless a context exists or WGRUMUS_DEVICES is set; returns
        whether it pinned."""
        with cls._lock:
            if cls._instance is not None or \
                    parse_device_count(os.environ.get("WGRUMUS_DEVICES", "")) is not None:
                return False
            adapters = select_adapters()
            if len(adapters) < 2:
                return False
            k = local_rank % len(adapters)
            cls._instance = cls(Selection([adapters[k]], [adapters.indices[k]]))
            cls._instance.devices[0].host_index = k  # (summaries name the host's adapter)
            return True

    @classmethod
    def reset(cls, count: int | None = None, adapter: str | None = None) -> MultiGpuContext:
        """Replace the process context (tests and the CLI's --devices). Old tensors stay valid
        on their old devices but cannot be mixed with the new ones."""
        with cls._lock:
            cls._instance = cls(select_adapters(adapter), count)
            return cls._instance

    def __len__(self):
        return len(self.devices)

    def __getitem__(self, i):
        return self.devices[i]


def devices() -> list:
    return list(MultiGpuContext.get().devices)


def default_device() -> Device:
    return MultiGpuContext.get().devices[0]


def get_device(d) -> Device:
    """Accept a Device, an index, or None (default device)."""
    if d is None:
        return default_device()
    if isinstance(d, Device):
        return d
    if isinstance(d, int):
        devs = MultiGpuContext.get().devices
        if not 0 <= d < len(devs):
            raise WgrumusError(f"device index {d} out of range: this process has {len(devs)} "
                               f"device(s); set WGRUMUS_DEVICES to make more")
        return devs[d]
    if isinstance(d, str):  # PyTorch's habit: device="cuda", "cuda:1", "cpu"
        host = ("tensors live on WebGPU devices only: read one to the host with .numpy() (or "
                ".tolist() / .item()); " if d.split(":")[0] == "cpu" else "")
        raise DeviceNameError(f"device={d!r}: {host}wgrumus names devices by a wr.Device or an "
                              f"index into wr.devices() (e.g. device=wr.devices()[0] or "
                              f"device=0), not by a string; `wgrumus devices` lists them")
    raise TypeError(f"expected a Device or device index, got {type(d).__name__}")
