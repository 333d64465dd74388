"""The convolution family's kernels (shaders/conv.wgsl): im2col / col2im, max and average pools
and their gradients, one invocation per output element over NCHW geometry words."""
from __future__ import annotations

from ..runtime.kernels import Kernel


def _params(n: int, g: dict, strides=(0, 0, 0, 0), off=0, flag=0) -> list:
    return [n, g["N"], g["C"], g["H"], g["W"], g["KH"], g["KW"], g["SH"], g["SW"], g["PH"],
            g["PW"], g["DH"], g["DW"], g["OH"], g["OW"], *strides, off, flag]


def run(dev, entry: str, g: dict, n: int, bufs, strides=(0, 0, 0, 0), off=0, flag=0) -> None:
    """Entry ``entry`` over ``n`` outputs of the geometry ``g`` (ops/conv.py's _geometry)."""
    if n:
        dev.dispatch_1d(Kernel.of("conv", entry), bufs, _params(n, g, strides, off, flag), n)
