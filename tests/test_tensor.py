"""Tensor: dtypes and numpy interop, views over one storage, host transfer, small API."""
import numpy as np
import pytest

import wgrumus as wr


@pytest.mark.parametrize("src,dtype", [(np.float64, wr.float32), (np.float32, wr.float32),
                                       (np.int64, wr.int32), (np.int32, wr.int32),
                                       (np.uint8, wr.int32), (np.bool_, wr.float32)])
def test_from_numpy_dtypes(src, dtype):
    a = (np.arange(12).reshape(3, 4) % 3).astype(src)
    t = wr.tensor(a)
    assert t.dtype == dtype and t.shape == (3, 4)
    np.testing.assert_array_equal(t.numpy(), a.astype(dtype))


def test_explicit_dtype_and_lists():
    t = wr.tensor([[1, 2], [3, 4]], dtype=wr.float32)
    assert t.dtype == wr.float32 and t.numpy().tolist() == [[1, 2], [3, 4]]
    assert wr.tensor([1.5, 2.5]).tolist() == [1.5, 2.5]
    assert wr.tensor(3.0).shape == () and wr.tensor(3.0).item() == 3.0
    assert wr.tensor(np.float32(2)).shape == ()
    assert wr.tensor(wr.tensor([1.0, 2.0])).tolist() == [1.0, 2.0]


def test_float16_storage(dev):
    if "shader-f16" not in dev.features:
        pytest.skip("adapter has no shader-f16")
    a = np.array([1.5, -2.25, 3.0], np.float16)
    t = wr.tensor(a)
    assert t.dtype == wr.float16
    np.testing.assert_array_equal(t.numpy(), a)
    np.testing.assert_array_equal(t[1:].numpy(), a[1:])  # 2-byte offset into the storage


def test_views_share_storage():
    a = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
    t = wr.tensor(a)
    v = t[1, :, ::2]
    assert v._storage is t._storage and v.offset == 12 and v.strides == (4, 2)
    assert not v.is_contiguous() and t.is_contiguous() and t[1].is_contiguous()
    np.testing.assert_array_equal(v.numpy(), a[1, :, ::2])
    p = t.permute(2, 0, 1)
    assert p._storage is t._storage and p.shape == (4, 2, 3)
    assert t.reshape(6, 4)._storage is t._storage  # contiguous reshape is a view
    v.fill_(-1.0)  # writes through the view
    a[1, :, ::2] = -1
    np.testing.assert_array_equal(t.numpy(), a)
    c = p.contiguous()
    assert c._storage is not t._storage and c.is_contiguous()
    np.testing.assert_array_equal(c.numpy(), a.transpose(2, 0, 1))


def test_small_api():
    t = wr.zeros(2, 3)
    assert t.ndim == 2 and t.dim() == 2 and t.numel() == 6 and len(t) == 2
    assert t.size() == (2, 3) and t.size(1) == 3
    with pytest.raises(TypeError, match="0-d"):
        len(wr.tensor(1.0))
    assert float(wr.tensor([2.5])) == 2.5 and int(wr.tensor([3], dtype=wr.int32)) == 3
    assert bool(wr.tensor([1.0])) and not bool(wr.tensor([0.0]))
    np.testing.assert_array_equal(np.asarray(wr.ones(2)), [1, 1])
    assert np.asarray(wr.ones(2), dtype=np.float64).dtype == np.float64
    r = repr(wr.tensor([1.0, 2.0], requires_grad=True))
    assert "tensor(" in r and "requires_grad=True" in r and "device=0" in r
    assert "int32" in repr(wr.tensor([1, 2]))
    assert wr.ones(2, 2).T.shape == (2, 2)


def test_detach_and_requires_grad():
    x = wr.ones(3, requires_grad=True)
    assert x.requires_grad and x.is_leaf
    y = x * 2.0
    assert y.requires_grad and not y.is_leaf
    d = y.detach()
    assert not d.requires_grad and d.is_leaf and d._storage is y._storage
    with pytest.raises(wr.WgrumusError, match="leaf"):
        y.requires_grad_()
    assert wr.ones(2).requires_grad_().grad_id != wr.ones(2).requires_grad_().grad_id


def test_numpy_of_grad_view_does_not_record():
    x = wr.ones(2, 3, requires_grad=True)
    v = x.T
    from wgrumus.autograd.tape import current_tape
    n = len(current_tape()._entries)
    v.numpy()
    repr(v)
    assert len(current_tape()._entries) == n


def test_buffer_slice():
    t = wr.tensor(np.arange(10, dtype=np.float32))
    s = t[2:6].buffer_slice()
    assert s.nbytes == 16 and s.offset == 8
    with pytest.raises(wr.WgrumusError, match="contiguous"):
        t[::2].buffer_slice()


def test_empty_tensors():
    t = wr.tensor(np.zeros((0, 3), np.float32))
    assert t.shape == (0, 3) and t.numpy().shape == (0, 3)
    assert (t + 1.0).shape == (0, 3) and (t @ wr.ones(3, 2)).shape == (0, 2)
    assert t.T.contiguous().shape == (3, 0)
