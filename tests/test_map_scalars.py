"""Named kernel scalars (kernels/map.run_map): each name is declared in the kernel with the WGSL
type its Python value has, so callers never write parameter slot numbers."""
import numpy as np
import pytest

import wgrumus as wr
from wgrumus.kernels.map import run_map
from wgrumus.runtime.errors import KernelError


def test_float_int_and_unsigned_scalars(dev):
    f = run_map("x * f32(i) + y", wr.empty(4, device=dev), [], {"x": 0.5, "y": -1.0})
    np.testing.assert_array_equal(f.numpy(), [-1.0, -0.5, 0.0, 0.5])
    k = run_map("k + i32(i)", wr.empty(3, device=dev, dtype=wr.int32), [], {"k": -(2 ** 31)})
    np.testing.assert_array_equal(k.numpy(), [-(2 ** 31), -(2 ** 31) + 1, -(2 ** 31) + 2])
    # u32 above 2^31 (seeds): exact, not wrapped through i32 or rounded through f32
    u = run_map("i32(s % 1000u) + i32(i)", wr.empty(2, device=dev, dtype=wr.int32), [],
                {"s": np.uint32(4_000_000_123)})
    np.testing.assert_array_equal(u.numpy(), [123, 124])


def test_scalars_and_operands_together(dev, rng):
    a = rng.standard_normal((3, 5)).astype(np.float32)
    b = rng.standard_normal((5,)).astype(np.float32)
    out = run_map("select(b, a * scale, a > limit)", wr.empty((3, 5), device=dev),
                  [wr.tensor(a, device=dev), wr.tensor(b, device=dev)],
                  {"scale": 2.0, "limit": 0.25})
    np.testing.assert_allclose(out.numpy(), np.where(a > 0.25, a * 2.0, b), rtol=1e-6)


def test_a_reserved_name_is_a_clear_error(dev):
    with pytest.raises(KernelError, match="std"):
        run_map("std", wr.empty(2, device=dev), [], {"std": 1.0})
