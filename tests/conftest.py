"""Tests run on whatever adapter exists (lavapipe on CI) with 8 logical devices, so every
multi-device path (data, tensor, pipeline, 3D parallel) is exercised on one adapter."""
import os

os.environ.setdefault("WGRUMUS_DEVICES", "8")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import settings  # noqa: E402

# Every hypothesis test draws the same examples on every run (CI failures reproduce locally);
# a test's own @settings only overrides what it names.
settings.register_profile("wgrumus", derandomize=True, database=None, deadline=None)
settings.load_profile("wgrumus")


try:
    import xdist  # noqa: F401  (pytest-xdist: `-n auto`, the README's test command)
except ImportError:
    pass
else:
    def pytest_xdist_auto_num_workers(config):
        """One worker per core, at most 4: most tests keep one core busy with Python (the
        subprocess ones wait), while each worker's lavapipe spreads a large dispatch over all
        cores anyway."""
        return max(1, min(4, os.cpu_count() or 1))


@pytest.fixture(scope="session")
def devs():
    import wgrumus as wr
    return wr.devices()


@pytest.fixture(scope="session")
def dev(devs):
    return devs[0]


@pytest.fixture
def rng():
    return np.random.default_rng(0)
