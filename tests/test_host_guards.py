"""Host-side guards of issue 15: shapes (item 5), one random generator per rank thread
(item 7), checkpoint loading (item 8), lavapipe's native memory per dispatch (item 9) and
allocations past what the adapter or the host can hold (item 10)."""
import os

import numpy as np
import pytest

import wgrumus as wr
from wgrumus import nn
from wgrumus.runtime.errors import ShapeError

pytestmark = pytest.mark.timeout(120)


# ------------------------------------------------------------------------------- item 5: shapes
@pytest.mark.parametrize("make, what", [
    (lambda: wr.ones(6).reshape(-2, -3), r"reshape: negative dimension in shape \(-2, -3\)"),
    (lambda: wr.ones(6).reshape(2.0, 3), r"reshape: dimensions must be ints, got 2.0"),
    (lambda: wr.ones(1, 3).expand(-2, 3), r"expand: negative dimension in shape \(-2, 3\)"),
    (lambda: wr.ones(1, 3).expand(2.5, 3), r"expand: dimensions must be ints, got 2.5"),
    (lambda: wr.zeros(2.5, 3), r"dimensions must be ints, got 2.5"),
    (lambda: wr.full((2.5,), 1.0), r"dimensions must be ints, got 2.5"),
    (lambda: wr.rand(3, 2.5), r"dimensions must be ints, got 2.5"),
    (lambda: wr.ones(-1), r"tensor shape: negative dimension in shape \(-1,\)"),
    (lambda: nn.Linear(2.5, 3), r"nn.Linear\(in_features, out_features\): dimensions must be "
                                r"ints, got 2.5"),
    (lambda: nn.Linear(4, -3), r"nn.Linear\(in_features, out_features\): negative dimension"),
])
def test_bad_dimensions_raise(make, what):
    with pytest.raises(ShapeError, match=what):
        make()


def test_reshape_and_expand_keep_minus_one():
    x = wr.tensor(np.arange(6, dtype=np.float32))
    assert x.reshape(-1, 3).shape == (2, 3)
    assert wr.ones(1, 3).expand(4, -1).shape == (4, 3)
    assert wr.zeros(np.int64(2), 3).shape == (2, 3)


@pytest.mark.parametrize("lead", [(4,), (2, 3)])
def test_linear_with_no_input_features(lead):
    """PyTorch's Linear(0, n): the output is the bias broadcast over the batch; the bias
    gradient is the gradient summed over the batch, the (empty) weight and input gradients
    have their shapes."""
    lin = nn.Linear(0, 3)
    lin.load_state_dict({"weight": np.zeros((3, 0), np.float32),
                         "bias": np.array([1.0, -2.0, 0.5], np.float32)})
    x = wr.zeros(*lead, 0, requires_grad=True)
    y = lin(x)
    assert y.shape == lead + (3,)
    np.testing.assert_allclose(y.numpy(), np.broadcast_to([1.0, -2.0, 0.5], lead + (3,)))
    g = np.random.default_rng(0).standard_normal(lead + (3,)).astype(np.float32)
    (y * wr.tensor(g)).sum().backward()
    np.testing.assert_allclose(lin.bias.grad.numpy(), g.reshape(-1, 3).sum(0), rtol=1e-5)
    assert lin.weight.grad.shape == (3, 0) and x.grad.shape == lead + (0,)


# ------------------------------------------------------------------------------- item 7: random
def test_rank_threads_that_seed_alike_draw_alike(devs):
    """Every rank seeds, waits for the others, then builds a layer and applies dropout: with one
    generator per process the ranks took turns on a shared counter and got different weights."""
    from wgrumus import distributed as dist

    def rank(g):
        wr.manual_seed(1234)
        g.barrier()  # everyone has seeded before anyone draws
        m = nn.Sequential(nn.Linear(16, 32, device=g.device), nn.Dropout(0.5))
        y = m(wr.ones(8, 16, device=g.device))
        return np.concatenate([m[0].weight.numpy().ravel(), y.numpy().ravel()])
    out = dist.spawn(rank, 3, devices=devs[:3], timeout=30)
    assert all(np.array_equal(out[0], o) for o in out[1:])


def test_plain_threads_that_seed_get_their_own_generator(devs):
    import threading
    ready = threading.Barrier(3, timeout=30)
    res = [None] * 3

    def run(i):
        wr.manual_seed(7)
        ready.wait()
        res[i] = wr.rand(64, device=devs[i]).numpy()
    ts = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert all(np.array_equal(res[0], r) for r in res[1:])


def test_spawned_ranks_start_from_the_callers_state_and_leave_it_alone(devs):
    from wgrumus import distributed as dist
    wr.manual_seed(5)
    first = wr.rand(8).numpy()
    want_next = wr.rand(8).numpy()
    wr.manual_seed(5)
    wr.rand(8)
    out = dist.spawn(lambda g: (wr.rand(8, device=g.device).numpy(), wr.manual_seed(99))[0], 2,
                     devices=devs[:2], timeout=30)
    assert all(np.array_equal(o, want_next) for o in out)  # each rank: the caller's next draw
    np.testing.assert_array_equal(wr.rand(8).numpy(), want_next)  # the caller's is untouched
    assert not np.array_equal(first, want_next)


# ------------------------------------------------------------------------------- item 9: memory
_STEPS = """
import gc, os, sys
import numpy as np
import wgrumus as wr
from wgrumus import nn
def rss():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
m = nn.Sequential(nn.Linear(32, 64, seed=0), nn.ReLU(), nn.Linear(64, 10, seed=1))
opt = wr.optim.AdamW(m.parameters(), lr=1e-3)
rng = np.random.default_rng(0)
x = wr.tensor(rng.standard_normal((128, 32)).astype(np.float32))
y = wr.tensor(rng.integers(0, 10, 128).astype(np.int32))
def step():
    loss = nn.functional.cross_entropy(m(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
    return loss
for _ in range(10):
    step()
loss = step(); loss.item(); gc.collect(); r0 = rss()
for _ in range(int(sys.argv[1])):
    loss = step()
loss.item(); gc.collect()
print((rss() - r0) / 2**20)
"""


def test_training_steps_keep_native_memory_flat():
    """Batch 128 through Linear 32-64-10 with AdamW grew 1.1 MB per step on lavapipe: Mesa
    compiled (and kept) a copy of the matmul shader specialised on its uniform parameters at
    every dispatch. A fresh process, so no earlier test has warmed anything up."""
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    steps = 40
    out = subprocess.run([sys.executable, "-c", _STEPS, str(steps)], env=env, cwd=root,
                         capture_output=True, text=True, timeout=100)
    assert out.returncode == 0, out.stderr[-2000:]
    grown = float(out.stdout.split()[-1])
    assert grown < 8, f"RSS grew {grown:.1f} MB over {steps} steps"


# ------------------------------------------------------------------------------- item 8: loading
def _checkpoint(tmp_path, meta: str):
    from safetensors.numpy import save_file
    path = str(tmp_path / "ck.safetensors")
    save_file({"model.weight": np.zeros((3, 2), np.float32),
               "model.bias": np.zeros(3, np.float32)}, path, metadata={"wgrumus": meta})
    return path


@pytest.mark.parametrize("meta, what", [
    ("{not json", r"corrupt wgrumus metadata \(not JSON"),
    ("[1, 2]", r"corrupt wgrumus metadata \(a JSON list, expected an object\)"),
    ('{"format": "wgrumus-checkpoint-1"}', r"incomplete wgrumus metadata \(no step, rng, extra\)"),
])
def test_corrupt_checkpoint_metadata_is_a_checkpoint_error(tmp_path, meta, what):
    from wgrumus.io import CheckpointError, load_checkpoint
    with pytest.raises(CheckpointError, match=what + r".*use another checkpoint"):
        load_checkpoint(_checkpoint(tmp_path, meta), nn.Linear(2, 3))


@pytest.mark.parametrize("value", [1e39, -3e300, 1e-50])
def test_float64_outside_float32_range_is_an_error(tmp_path, value):
    from safetensors.numpy import save_file

    from wgrumus.io import CheckpointError
    path = str(tmp_path / "w.safetensors")
    save_file({"w": np.array([0.0, 1.5, value, 0.0], np.float64)}, path)
    with pytest.raises(CheckpointError, match=r"tensor w \(float64\) holds .*outside the float32 "
                                              r"range.*1 such values"):
        wr.load(path)


def test_float64_inside_float32_range_loads(tmp_path):
    from safetensors.numpy import save_file
    path = str(tmp_path / "w.safetensors")
    a = np.array([0.0, -1.5, 3e38, 1e-40, np.inf, np.nan], np.float64)
    save_file({"w": a}, path)
    np.testing.assert_array_equal(wr.load(path)["w"].numpy(), a.astype(np.float32))


# ------------------------------------------------------------------------------- item 10: OOM
_FILL = """
import time, wgrumus as wr
from wgrumus.runtime.errors import OutOfMemoryError
ts, t0 = [], time.monotonic()
try:
    for _ in range(400):
        ts.append(wr.empty(25_000_000))  # (zeros: the same, plus lavapipe's fill time)
    print("NO ERROR")
except OutOfMemoryError as e:
    print("OOM", round(time.monotonic() - t0, 1), e)
"""


def _child(code, timeout=90, **env):
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]),
               **env)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs RLIMIT_AS (POSIX)")
def test_allocating_past_memory_is_an_out_of_memory_error():
    """A process limited to 6 GiB of address space allocates 100 MB tensors until it cannot:
    wgpu said only "Validation Error: Not enough memory left"; now an OutOfMemoryError names
    the size and what is free, at once."""
    code = "import resource; resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))\n" + _FILL
    out = _child(code)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OOM" in out.stdout, out.stdout + out.stderr[-2000:]
    secs = float(out.stdout.split()[1])
    assert secs < 30
    assert "cannot allocate 100.7 MB (100,663,296 bytes)" in out.stdout
    assert "Not enough memory left" in out.stdout and "Free tensors" in out.stdout


def test_memory_limit_caps_what_a_device_holds():
    out = _child(_FILL, WGRUMUS_MEMORY_LIMIT="320M")
    assert out.returncode == 0, out.stderr[-2000:]
    assert "OOM" in out.stdout, out.stdout
    assert "cannot allocate 100.7 MB" in out.stdout and \
        "left of WGRUMUS_MEMORY_LIMIT=320M (335.5 MB)" in out.stdout, out.stdout


def test_host_backed_check_names_what_is_available():
    """CPU adapters keep tensors in host memory: a buffer larger than MemAvailable is refused
    before anything is allocated (checked against this machine's real figure)."""
    from wgrumus.runtime.errors import OutOfMemoryError
    from wgrumus.runtime.memory import MemoryGuard, host_available
    mem = host_available()
    if mem is None:
        pytest.skip("no /proc/meminfo")
    guard = MemoryGuard("test adapter", host_backed=True)
    with pytest.raises(OutOfMemoryError, match=r"out of memory on test adapter: cannot allocate "
                                               r".*GB.*of host memory available.*del them"):
        guard.check(mem[1] + (1 << 30), 0, lambda: 0)
    guard.check(1 << 20, 0, lambda: 0)  # a small buffer passes
