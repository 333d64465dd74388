"""Errors raised by wgrumus. Every message names the problem and the fix."""


class WgrumusError(RuntimeError):
    """Base class of wgrumus' own errors."""


class NoAdapterError(WgrumusError):
    pass


class DeviceMismatchError(WgrumusError, ValueError):
    pass


class ShapeError(WgrumusError, ValueError):
    pass


class DimError(ShapeError, IndexError):
    """A dimension index outside a tensor's dimensions (an IndexError, as in PyTorch)."""


class AdapterLimitError(WgrumusError, ValueError):
    pass


class DeviceNameError(WgrumusError, TypeError):
    """A device named by a string (PyTorch's "cuda" / "cpu"); a TypeError, as for any other
    value that is not a wr.Device or an index."""


class KernelError(WgrumusError):
    """A WGSL kernel failed to compile or launch (a bug in wgrumus, never in user code)."""


class OutOfMemoryError(WgrumusError, MemoryError):
    """An allocation does not fit in what the device (or, for CPU adapters, the host) has free.
    Also a MemoryError, so callers catching MemoryError keep working."""


class CaptureError(WgrumusError):
    """A ``wr.jit`` function did something a replayed recording could not reproduce."""


class SubmitTimeout(WgrumusError, TimeoutError):
    """Work handed to a device's submission thread (runtime/submitter.py) did not finish."""
