"""benchmarks/fma_peak.py: every form it times computes what its expression says (checked
against numpy), so its TFLOP/s count real FMAs."""
import numpy as np
import pytest

from tests._util import load_benchmark

fp = load_benchmark("fma_peak")


def expected(t: str, lanes: int, iters: int) -> np.ndarray:
    """o[g] of the shader, in float64: sum over accumulators and lanes after ``iters`` trips."""
    g = np.arange(256) % 64
    x, y, acc = 1.0001, 0.9999, 0.0
    for k in range(64 // lanes):
        a = (g + k) * 1e-3
        xx = x
        for _ in range(iters):
            a = xx * y + a
            xx = xx * y
        acc = acc + a
    return acc * lanes


@pytest.mark.timeout(120)
@pytest.mark.parametrize("form", fp.FORMS, ids=lambda f: f"{f[0]}-{f[1]}-{f[2]}")
def test_form_computes_its_expression(form):
    import wgrumus as wr
    d = wr.devices()[0].wgpu
    t, vec, expr = form
    if t == "f16" and "shader-f16" not in d.features:
        pytest.skip("adapter without shader-f16")
    _, out = fp.run(d, fp.shader(t, vec, expr, 3), 1, 1)
    np.testing.assert_allclose(out, expected(t, int(vec[-1]), 3),
                               rtol=1e-5 if t == "f32" else 2e-2)
