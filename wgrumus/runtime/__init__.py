"""Runtime: adapters, devices, buffer pool, kernels, command batching and staging."""
from .context import MultiGpuContext, default_device, devices, get_device
from .device import Device
from .errors import (AdapterLimitError, CaptureError, DeviceMismatchError, DimError, KernelError,
                     NoAdapterError, ShapeError, WgrumusError)
from .gpu_timer import GpuTimer
from .kernels import Kernel

__all__ = ["AdapterLimitError", "CaptureError", "Device", "DeviceMismatchError", "GpuTimer",
           "DimError", "Kernel", "KernelError", "MultiGpuContext", "NoAdapterError", "ShapeError",
           "WgrumusError", "default_device", "devices", "get_device"]
