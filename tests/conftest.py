"""Tests run on whatever adapter exists (lavapipe on CI) with 8 logical devices, so every
multi-device path (data, tensor, pipeline, 3D parallel) is exercised on one adapter."""
import os

os.environ.setdefault("WGRUMUS_DEVICES", "8")
os.environ.setdefault("XDG_RUNTIME_DIR", "/tmp")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


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
