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
