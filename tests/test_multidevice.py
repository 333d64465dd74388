"""Several logical devices on one adapter (WGRUMUS_DEVICES): tensors live on their own device,
to() moves them, mixing devices is refused with a clear error, gradients flow back through to()."""
import numpy as np
import pytest

import wgrumus as wr


def test_tensors_live_on_their_device_and_move_with_to(devs, rng):
    d0, d1, d2 = devs[:3]
    a = rng.normal(size=(3, 4)).astype(np.float32)
    t0 = wr.tensor(a, device=d0)
    t1 = t0.to(d1)
    t2 = t1.T.to(2)  # a strided view, by index
    assert (t0.device, t1.device, t2.device) == (d0, d1, d2)
    assert t1._storage is not t0._storage
    np.testing.assert_array_equal(t1.numpy(), a)
    np.testing.assert_array_equal(t2.numpy(), a.T)
    assert t0.to(d0) is t0
    # every op's output stays on its inputs' device and its buffer comes from that device's pool
    y = (t2 * 2.0 + 1.0).sum(axis=0)
    assert y.device is d2
    np.testing.assert_allclose(y.numpy(), (a.T * 2 + 1).sum(axis=0), rtol=1e-6)
    m = wr.tensor(a, device=d1) @ wr.tensor(a.T, device=d1)
    assert m.device is d1
    assert wr.randn(5, device=d2, seed=1).device is d2
    assert wr.cat([t1, t1], axis=0).device is d1
    np.testing.assert_array_equal(wr.zeros(2, device=d2).to(d0).numpy(), [0, 0])
    assert wr.zeros(0, 2, device=d1).to(d2).shape == (0, 2)
    i = wr.arange(5, device=d1).to(d0)
    assert i.dtype == wr.int32 and i.tolist() == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a @ b, lambda a, b: a * b,
                                lambda a, b: wr.where(a, b, 0.0),
                                lambda a, b: wr.cat([a, b]), lambda a, b: wr.maximum(a, b)])
def test_mixing_devices_raises(devs, op):
    a = wr.ones(2, 2, device=devs[0])
    b = wr.ones(2, 2, device=devs[1])
    with pytest.raises(wr.DeviceMismatchError) as e:
        op(a, b)
    msg = str(e.value)
    assert "Device(0" in msg and "Device(1" in msg and ".to(" in msg


def test_setitem_across_devices_raises(devs):
    a = wr.zeros(3, device=devs[0])
    with pytest.raises(wr.DeviceMismatchError, match=r"\.to\("):
        a[0:2] = wr.ones(2, device=devs[1])


def test_grads_flow_back_through_to(devs, rng):
    d0, d1, d2 = devs[:3]
    a = rng.normal(size=(3, 4)).astype(np.float32)
    x = wr.tensor(a, device=d0, requires_grad=True)
    w = wr.tensor(a.T.copy(), device=d2, requires_grad=True)
    h = (x.to(d1) * 3.0).exp()
    loss = (h.to(d2) @ w).sum()
    assert loss.device is d2
    store = wr.autograd.backward(loss)
    gx, gw = store.get(x), store.get(w)
    assert gx.device is d0 and gw.device is d2
    e = np.exp(3 * a.astype(np.float64))
    np.testing.assert_allclose(gw.numpy(), e.T @ np.ones((3, 3)), rtol=1e-4)
    np.testing.assert_allclose(gx.numpy(), 3 * e * (np.ones((3, 3)) @ a), rtol=1e-4)
    loss2 = (x.to(d1) * 2.0).sum()
    loss2.backward()
    assert x.grad.device is d0
    np.testing.assert_allclose(x.grad.numpy(), np.full((3, 4), 2.0))


def test_devices_work_independently(devs):
    outs = [(wr.full((1000,), float(k), device=d) * 2.0).sum() for k, d in enumerate(devs)]
    assert [o.item() for o in outs] == [2000.0 * k for k in range(len(devs))]
    for d in devs:
        d.synchronize()
