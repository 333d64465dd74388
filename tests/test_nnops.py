"""NN ops (softmax, layer_norm, dropout, losses, indexing, conv/pool) against float64 numpy
references written to PyTorch's definitions, with gradients checked by central differences."""
import numpy as np
import pytest
from gradcheck import check_grad
from hypothesis import given, settings
from hypothesis import strategies as st

import wgrumus as wr
from wgrumus.ops import (
    avg_pool2d,
    conv2d,
    cross_entropy,
    dropout,
    embedding,
    gather,
    index_select,
    layer_norm,
    log_softmax,
    max_pool2d,
    mse_loss,
    softmax,
)
from wgrumus.runtime.tuning import TUNING

# --------------------------------------------------------------------------- numpy references


def softmax_ref(x, axis=-1):
    e = np.exp(x - x.max(axis, keepdims=True))
    return e / e.sum(axis, keepdims=True)


def log_softmax_ref(x, axis=-1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


def layer_norm_ref(x, ns, w=None, b=None, eps=1e-5):
    axes = tuple(range(x.ndim - len(ns), x.ndim))
    m = x.mean(axes, keepdims=True)
    v = ((x - m) ** 2).mean(axes, keepdims=True)
    y = (x - m) / np.sqrt(v + eps)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def cross_entropy_ref(x, t, ignore_index=-100, label_smoothing=0.0, reduction="mean"):
    """torch.nn.functional.cross_entropy for x [N, C, d...] / [C] and integer t."""
    if x.ndim == 1:
        x, t = x[None], np.asarray(t)[None]
        squeeze = True
    else:
        squeeze = False
    x = np.moveaxis(x, 1, -1)
    C = x.shape[-1]
    lsm = log_softmax_ref(x)
    valid = t != ignore_index
    tt = np.where(valid, t, 0)
    nll = -np.take_along_axis(lsm, tt[..., None], -1)[..., 0]
    smooth = -lsm.sum(-1) / C
    loss = ((1 - label_smoothing) * nll + label_smoothing * smooth) * valid
    if reduction == "none":
        return loss[0] if squeeze else loss
    if reduction == "sum":
        return loss.sum()
    return loss.sum() / valid.sum()


def conv2d_ref(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1)):
    (SH, SW), (PH, PW), (DH, DW) = stride, padding, dilation
    N, C, H, W = x.shape
    OC, _, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (PH, PH), (PW, PW)))
    OH = (H + 2 * PH - DH * (KH - 1) - 1) // SH + 1
    OW = (W + 2 * PW - DW * (KW - 1) - 1) // SW + 1
    out = np.zeros((N, OC, OH, OW))
    for kh in range(KH):
        for kw in range(KW):
            patch = xp[:, :, kh * DH:kh * DH + SH * (OH - 1) + 1:SH,
                       kw * DW:kw * DW + SW * (OW - 1) + 1:SW]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, kh, kw])
    if b is not None:
        out += b[None, :, None, None]
    return out


def _windows(x, k, s, p, fill):
    (KH, KW), (SH, SW), (PH, PW) = k, s, p
    N, C, H, W = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (PH, PH), (PW, PW)), constant_values=fill)
    OH, OW = (H + 2 * PH - KH) // SH + 1, (W + 2 * PW - KW) // SW + 1
    return np.stack([xp[:, :, kh:kh + SH * (OH - 1) + 1:SH, kw:kw + SW * (OW - 1) + 1:SW]
                     for kh in range(KH) for kw in range(KW)])


def max_pool_ref(x, k, s, p):
    return _windows(x, k, s, p, -np.inf).max(0)


def avg_pool_ref(x, k, s, p, count_include_pad=True):
    tot = _windows(x, k, s, p, 0.0).sum(0)
    if count_include_pad:
        return tot / (k[0] * k[1])
    return tot / _windows(np.ones_like(x), k, s, p, 0.0).sum(0)


def f32(a):
    return np.asarray(a, np.float32)


@pytest.fixture(params=["wg", "thread"])
def row_mode(request, monkeypatch):
    """Run a test with both row-kernel layouts: one workgroup per row (GPUs) and one
    invocation per row (CPU adapters); the adapter picks one by default."""
    monkeypatch.setattr(TUNING, "row_mode", request.param)
    return request.param


# --------------------------------------------------------------------------- softmax


@pytest.mark.parametrize("shape,axis", [((7,), -1), ((3, 5), -1), ((4, 300), 1), ((2, 3, 4), 0),
                                        ((2, 3, 4), 1), ((1, 1), -1), ((5, 1030), -1)])
def test_softmax_log_softmax_forward(shape, axis, rng, row_mode):
    x = rng.normal(scale=3, size=shape)
    t = wr.tensor(f32(x))
    np.testing.assert_allclose(softmax(t, axis).numpy(), softmax_ref(x, axis), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(t.log_softmax(axis).numpy(), log_softmax_ref(x, axis), rtol=1e-5,
                               atol=1e-5)
    np.testing.assert_allclose(t.softmax(axis).numpy().sum(axis), 1.0, rtol=1e-5)


@settings(max_examples=15, deadline=None)
@given(shape=st.lists(st.integers(0, 6), min_size=1, max_size=3), data=st.data())
def test_row_ops_random_shapes(shape, data):
    x = np.random.default_rng(len(shape)).normal(size=shape)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    t = wr.tensor(f32(x))
    if x.size == 0:
        assert softmax(t, axis).shape == x.shape and layer_norm(t, shape[-1]).shape == x.shape
        return
    with np.errstate(invalid="ignore", divide="ignore"):
        np.testing.assert_allclose(softmax(t, axis).numpy(), softmax_ref(x, axis), rtol=1e-5,
                                   atol=1e-6)
        np.testing.assert_allclose(layer_norm(t, shape[-1]).numpy(),
                                   layer_norm_ref(x, (shape[-1],)), rtol=1e-3, atol=1e-3)


def test_softmax_stable_and_masked(rng, row_mode):
    x = np.array([[1000.0, 1001.0, -1000.0], [-np.inf, 0.0, 1.0], [-50.0, -50.0, -50.0]])
    t = wr.tensor(f32(x))
    with np.errstate(invalid="ignore"):
        np.testing.assert_allclose(softmax(t).numpy(), softmax_ref(x), atol=1e-6)
        np.testing.assert_allclose(log_softmax(t).numpy()[:, 1:], log_softmax_ref(x)[:, 1:],
                                   atol=1e-4)
    assert np.isneginf(log_softmax(t).numpy()[1, 0])
    assert np.isfinite(softmax(t).numpy()).all()


def test_softmax_non_contiguous_and_grad(rng, row_mode):
    x = rng.normal(size=(4, 6))
    check_grad(lambda a: softmax(a.transpose(0, 1), -1),
               lambda a: softmax_ref(a.T, -1), [x])
    check_grad(lambda a: log_softmax(a[:, ::2], 0),
               lambda a: log_softmax_ref(a[:, ::2], 0), [x])


def causal_ref(x, scale, log):
    tq, tk = x.shape[-2:]
    mask = np.arange(tk)[None, :] > np.arange(tq)[:, None] + (tk - tq)
    z = np.where(mask, -np.inf, x * scale)
    return log_softmax_ref(z) if log else softmax_ref(z)


@pytest.mark.parametrize("shape", [(2, 4, 4), (3, 5), (2, 3, 6)])
def test_fused_scale_causal_softmax(shape, rng, row_mode):
    x = rng.normal(size=shape)
    check_grad(lambda a: softmax(a, scale=0.5, causal=True), lambda a: causal_ref(a, 0.5, False),
               [x])
    with np.errstate(invalid="ignore"):
        ref = causal_ref(x, 2.0, True)
    got = log_softmax(wr.tensor(f32(x)), scale=2.0, causal=True).numpy()
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5)
    # gradient of log_softmax restricted to the finite outputs
    fin = np.isfinite(ref)
    check_grad(lambda a: wr.where(wr.tensor(f32(fin)), log_softmax(a, scale=2.0, causal=True),
                                  0.0),
               lambda a: np.where(fin, causal_ref(a, 2.0, True), 0.0), [x])
    with pytest.raises(wr.ShapeError, match="last axis"):
        softmax(wr.tensor(f32(x)), 0, causal=True)


def test_softmax_many_rows(rng, row_mode):
    x = rng.normal(size=(70000, 3))  # more rows than workgroups per dispatch dimension
    np.testing.assert_allclose(softmax(wr.tensor(f32(x))).numpy(), softmax_ref(x), rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(layer_norm(wr.tensor(f32(x)), 3).numpy(), layer_norm_ref(x, (3,)),
                               rtol=1e-3, atol=1e-3)


# --------------------------------------------------------------------------- layer_norm


@pytest.mark.parametrize("shape,ns", [((3, 8), (8,)), ((2, 3, 5), (3, 5)), ((4, 700), (700,)),
                                      ((1, 1), (1,))])
def test_layer_norm_forward(shape, ns, rng, row_mode):
    x = rng.normal(loc=2.0, scale=3.0, size=shape)
    w, b = rng.normal(size=ns), rng.normal(size=ns)
    t = wr.tensor(f32(x))
    np.testing.assert_allclose(layer_norm(t, ns, wr.tensor(f32(w)), wr.tensor(f32(b))).numpy(),
                               layer_norm_ref(x, ns, w, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer_norm(t, ns).numpy(), layer_norm_ref(x, ns), rtol=1e-4,
                               atol=1e-4)


def test_layer_norm_grad(rng, row_mode):
    x, w, b = rng.normal(size=(5, 6)), rng.normal(size=6), rng.normal(size=6)
    check_grad(lambda a, c, d: layer_norm(a, 6, c, d, eps=1e-3),
               lambda a, c, d: layer_norm_ref(a, (6,), c, d, eps=1e-3), [x, w, b])
    # non-contiguous input, no affine; normalized over two dims
    x3 = rng.normal(size=(3, 4, 2))
    check_grad(lambda a: layer_norm(a.permute(2, 0, 1), (3, 4)),
               lambda a: layer_norm_ref(a.transpose(2, 0, 1), (3, 4)), [x3])
    # weight only (bias None), many rows (several chunks in the weight-gradient reduction)
    xl, wl = rng.normal(size=(40, 3)), rng.normal(size=3)
    check_grad(lambda a, c: layer_norm(a, 3, c), lambda a, c: layer_norm_ref(a, (3,), c),
               [xl, wl])


def test_layer_norm_errors(devs):
    x = wr.zeros((2, 3))
    with pytest.raises(wr.DeviceMismatchError, match="to\\(device\\)"):
        layer_norm(x, 3, wr.ones(3, device=devs[1]))
    with pytest.raises(wr.ShapeError, match=r"\(4,\).*\(2, 3\)"):
        layer_norm(x, 4)
    with pytest.raises(wr.ShapeError, match="weight"):
        layer_norm(x, 3, wr.ones(4))


# --------------------------------------------------------------------------- dropout


def test_dropout_mask_scale_and_seed(rng):
    x = rng.normal(size=(64, 50)) + 5.0
    t = wr.tensor(f32(x), requires_grad=True)
    p = 0.3
    y = dropout(t, p, seed=7).numpy()
    kept = y != 0
    assert 0.25 < 1 - kept.mean() < 0.35
    np.testing.assert_allclose(y[kept], x[kept] / (1 - p), rtol=1e-6)
    np.testing.assert_array_equal(dropout(t, p, seed=7).numpy(), y)  # same seed, same mask
    assert (dropout(t, p, seed=8).numpy() != y).any()
    # gradient: the same mask, scaled
    out = dropout(t, p, seed=7)
    g = wr.autograd.backward(out.sum()).get(t).numpy()
    np.testing.assert_allclose(g, kept / (1 - p), rtol=1e-6)
    # global generator: reproducible after manual_seed
    wr.manual_seed(3)
    a = dropout(t, p).numpy()
    b = dropout(t, p).numpy()
    wr.manual_seed(3)
    np.testing.assert_array_equal(dropout(t, p).numpy(), a)
    assert (a != b).any()


def test_dropout_edge_cases(rng):
    x = f32(rng.normal(size=(3, 4)))
    t = wr.tensor(x, requires_grad=True)
    assert dropout(t, 0.5, training=False) is t
    assert dropout(t, 0.0) is t
    z = dropout(t, 1.0)
    np.testing.assert_array_equal(z.numpy(), 0.0)
    np.testing.assert_array_equal(wr.autograd.backward(z.sum()).get(t).numpy(), 0.0)
    # non-contiguous input
    y = dropout(t.T, 0.5, seed=1).numpy()
    assert ((y == 0) | np.isclose(y, 2 * x.T)).all()
    with pytest.raises(ValueError, match="probability"):
        dropout(t, 1.5)


# --------------------------------------------------------------------------- losses


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy(reduction, ls, rng, row_mode):
    N, C = 6, 5
    x = rng.normal(scale=2, size=(N, C))
    t = rng.integers(0, C, N).astype(np.int32)
    t[[1, 4]] = -100
    got = cross_entropy(wr.tensor(f32(x)), wr.tensor(t), label_smoothing=ls, reduction=reduction)
    np.testing.assert_allclose(got.numpy(), cross_entropy_ref(x, t, -100, ls, reduction),
                               rtol=1e-5, atol=1e-6)
    check_grad(lambda a: cross_entropy(a, wr.tensor(t), label_smoothing=ls, reduction=reduction),
               lambda a: cross_entropy_ref(a, t, -100, ls, reduction), [x])


def test_cross_entropy_shapes_and_ignore(rng, row_mode):
    # [N, C, d] class dim 1 with a custom ignore_index; non-contiguous logits
    x = rng.normal(size=(2, 4, 3))
    t = rng.integers(0, 4, (2, 3)).astype(np.int32)
    t[0, 1] = 2
    check_grad(lambda a: cross_entropy(a, t, ignore_index=2),
               lambda a: cross_entropy_ref(a, t, ignore_index=2), [x])
    xt = rng.normal(size=(4, 3))  # used transposed: logits [3, 4]
    tt = np.array([0, 3, 1], np.int32)
    check_grad(lambda a: cross_entropy(a.T, wr.tensor(tt)),
               lambda a: cross_entropy_ref(a.T, tt), [xt])
    # one sample: logits [C], target []
    x1 = rng.normal(size=5)
    got = cross_entropy(wr.tensor(f32(x1)), np.array(3))
    np.testing.assert_allclose(got.numpy(), cross_entropy_ref(x1, np.array(3)), rtol=1e-5)
    # all rows ignored: mean is 0/0 like PyTorch
    assert np.isnan(cross_entropy(wr.tensor(f32(x1[None])), [-100]).item())
    # a large class count (several elements per invocation)
    xl = rng.normal(size=(3, 2000))
    tl = np.array([5, 1999, 0], np.int32)
    np.testing.assert_allclose(cross_entropy(wr.tensor(f32(xl)), tl).item(),
                               cross_entropy_ref(xl, tl), rtol=1e-5)


def test_cross_entropy_errors(rng):
    x = wr.tensor(f32(rng.normal(size=(3, 4))))
    with pytest.raises(wr.WgrumusError, match="out of range.*4 classes"):
        cross_entropy(x, [0, 4, 1])
    with pytest.raises(wr.WgrumusError, match="int32"):
        cross_entropy(x, wr.tensor(f32([0, 1, 2])))
    with pytest.raises(wr.ShapeError, match="targets shape"):
        cross_entropy(x, [0, 1])
    # device-side bad targets raise at the next read (device-side assert, issue 15)
    bad = cross_entropy(x, wr.tensor(np.array([0, 9, 1], np.int32)), reduction="none")
    with pytest.raises(IndexError, match="cross_entropy target index 9 .* size 4"):
        bad.numpy()


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_mse_loss(reduction, rng):
    a, b = rng.normal(size=(3, 4)), rng.normal(size=(4,))
    red = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    check_grad(lambda u, v: mse_loss(u, v, reduction), lambda u, v: red((u - v) ** 2), [a, b])


# --------------------------------------------------------------------------- indexing


def test_index_select_forward_and_getitem(rng):
    x = rng.normal(size=(5, 4, 3))
    t = wr.tensor(f32(x))
    for axis in (0, 1, 2):
        idx = rng.integers(0, x.shape[axis], 7)
        np.testing.assert_array_equal(index_select(t, axis, idx).numpy(),
                                      np.take(f32(x), idx, axis))
    np.testing.assert_array_equal(t[[4, -1, 0]].numpy(), f32(x)[[4, -1, 0]])
    i2 = np.array([[1, 2], [0, 0]])
    np.testing.assert_array_equal(index_select(t, 1, wr.tensor(i2.astype(np.int32))).numpy(),
                                  np.take(f32(x), i2, 1))
    # non-contiguous source, int32 data
    ti = wr.tensor(np.arange(20, dtype=np.int32).reshape(4, 5))
    np.testing.assert_array_equal(index_select(ti.T, 0, [4, 0]).numpy(),
                                  np.arange(20).reshape(4, 5).T[[4, 0]])
    with pytest.raises(IndexError, match="out of range for size 5"):
        t[[5]]
    with pytest.raises(IndexError, match="boolean"):
        t[[True, False, True, False, True]]


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
def test_index_select_wide_rows(rng, row_mode, dtype):
    """Rows of >= 32 elements (a workgroup a row; on CPU adapters an invocation per 32
    columns): an axis with outer dims, rows of 2 1/4 chunks, a 2-D index with negatives from
    the host and from the device, a source starting past its buffer's start."""
    x = (rng.normal(size=(3, 6, 2, 36)) * 100).astype(dtype)
    t = wr.tensor(x)[1:]
    idx = np.array([[5, -6, 2], [-1, 0, 5]])
    for i in (idx, wr.tensor(idx.astype(np.int32))):
        np.testing.assert_array_equal(index_select(t, 1, i).numpy(), np.take(x[1:], idx, 1))
    np.testing.assert_array_equal(index_select(t, 0, [1, 0, 1]).numpy(), x[1:][[1, 0, 1]])


def test_index_select_grad(rng, row_mode):
    x = rng.normal(size=(4, 3))
    idx = np.array([2, 0, 2, 3, 2])
    check_grad(lambda a: index_select(a, 0, idx), lambda a: a[idx], [x])
    check_grad(lambda a: index_select(a.T, 1, idx[:2]), lambda a: a.T[:, idx[:2]], [x])
    # more than 256 indices: several chunks in the backward kernel's compaction
    big = rng.integers(0, 4, 600)
    t = wr.tensor(f32(x), requires_grad=True)
    w = rng.normal(size=(600, 3))
    out = index_select(t, 0, big)
    g = wr.autograd.backward((out * wr.tensor(f32(w))).sum()).get(t).numpy()
    ref = np.zeros_like(x)
    np.add.at(ref, big, w)
    np.testing.assert_allclose(g, ref, rtol=1e-5, atol=1e-5)


def test_gather(rng):
    x = rng.normal(size=(3, 4, 2))
    idx = rng.integers(0, 4, (3, 5, 2))
    np.testing.assert_array_equal(gather(wr.tensor(f32(x)), 1, idx).numpy(),
                                  np.take_along_axis(f32(x), idx, 1))
    check_grad(lambda a: gather(a, 1, idx), lambda a: np.take_along_axis(a, idx, 1), [x])
    # index smaller than the input outside the axis (torch allows it); last axis
    small = rng.integers(0, 2, (2, 3, 1))
    check_grad(lambda a: gather(a, 2, small),
               lambda a: np.take_along_axis(a[:2, :3], small, 2), [x])
    with pytest.raises(wr.ShapeError, match="gather"):
        gather(wr.tensor(f32(x)), 0, np.zeros((1, 5, 2), np.int64))


def test_embedding(rng, row_mode):
    wt = rng.normal(size=(6, 4))
    idx = np.array([[0, 5, 2], [2, 2, 1]])
    check_grad(lambda w: embedding(wr.tensor(idx.astype(np.int32)), w), lambda w: w[idx], [wt])
    assert embedding(idx, wr.tensor(f32(wt))).shape == (2, 3, 4)
    with pytest.raises(IndexError, match="out of range for size 6.*0..5"):
        embedding([0, 6], wr.tensor(f32(wt)))
    with pytest.raises(IndexError, match="-1"):
        embedding([-1], wr.tensor(f32(wt)))
    # wide rows (one workgroup copies a row) and repeated indices in the gradient
    w2 = f32(rng.normal(size=(10, 40)))
    i2 = rng.integers(0, 10, (3, 300))
    t2 = wr.tensor(w2, requires_grad=True)
    out = embedding(wr.tensor(i2.astype(np.int32)), t2)
    np.testing.assert_array_equal(out.numpy(), w2[i2])
    with pytest.raises(IndexError, match="out of range for size 10"):
        embedding(wr.tensor(np.array([3, 10], np.int32)), t2).numpy()
    gw = rng.normal(size=out.shape)
    got = wr.autograd.backward((out * wr.tensor(f32(gw))).sum()).get(t2).numpy()
    ref = np.zeros((10, 40))
    np.add.at(ref, i2.reshape(-1), gw.reshape(-1, 40))
    np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)
    # device indices out of range raise at the next read (device-side assert, issue 15)
    got = embedding(wr.tensor(np.array([7], np.int32)), wr.tensor(f32(wt)))
    with pytest.raises(IndexError, match="embedding index 7 .* size 6"):
        got.numpy()


# --------------------------------------------------------------------------- conv / pool


@pytest.mark.parametrize("cfg", [
    dict(x=(2, 3, 6, 5), w=(4, 3, 3, 2), stride=1, padding=0, dilation=1),
    dict(x=(1, 2, 7, 7), w=(3, 2, 3, 3), stride=(2, 1), padding=(1, 2), dilation=1),
    dict(x=(2, 1, 6, 6), w=(2, 1, 2, 3), stride=2, padding=1, dilation=(2, 1)),
])
def test_conv2d(cfg, rng):
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    x, w, b = rng.normal(size=cfg["x"]), rng.normal(size=cfg["w"]), rng.normal(size=cfg["w"][0])
    s, p, d = pair(cfg["stride"]), pair(cfg["padding"]), pair(cfg["dilation"])
    got = conv2d(wr.tensor(f32(x)), wr.tensor(f32(w)), wr.tensor(f32(b)), cfg["stride"],
                 cfg["padding"], cfg["dilation"])
    np.testing.assert_allclose(got.numpy(), conv2d_ref(x, w, b, s, p, d), rtol=1e-4, atol=1e-4)
    if cfg["x"][0] == 1:
        check_grad(lambda u, v, c: conv2d(u, v, c, cfg["stride"], cfg["padding"],
                                          cfg["dilation"]),
                   lambda u, v, c: conv2d_ref(u, v, c, s, p, d), [x, w, b])


def test_conv2d_non_contiguous_grad(rng):
    x = rng.normal(size=(1, 5, 4, 2))  # used as NCHW [1, 2, 5, 4] via permute
    w = rng.normal(size=(2, 2, 2, 2))
    check_grad(lambda u, v: conv2d(u.permute(0, 3, 1, 2), v, stride=1, padding=1),
               lambda u, v: conv2d_ref(u.transpose(0, 3, 1, 2), v, padding=(1, 1)), [x, w])
    with pytest.raises(wr.ShapeError, match="weight"):
        conv2d(wr.zeros((1, 3, 4, 4)), wr.zeros((2, 2, 1, 1)))
    with pytest.raises(wr.ShapeError, match="smaller than the kernel"):
        conv2d(wr.zeros((1, 1, 2, 2)), wr.zeros((1, 1, 3, 3)))


@pytest.mark.parametrize("k,s,p", [((2, 2), (2, 2), (0, 0)), ((3, 2), (1, 2), (1, 1)),
                                   ((3, 3), (2, 2), (1, 0))])
def test_pools(k, s, p, rng):
    shape = (2, 2, 5, 6)
    x = (rng.permutation(np.prod(shape)).reshape(shape) * 0.1 - 3.0)  # distinct values
    t = wr.tensor(f32(x))
    np.testing.assert_allclose(max_pool2d(t, k, s, p).numpy(), max_pool_ref(x, k, s, p),
                               rtol=1e-6)
    for cip in (True, False):
        np.testing.assert_allclose(avg_pool2d(t, k, s, p, count_include_pad=cip).numpy(),
                                   avg_pool_ref(x, k, s, p, cip), rtol=1e-5, atol=1e-6)
    xs = x[:1, :1]
    check_grad(lambda u: max_pool2d(u, k, s, p), lambda u: max_pool_ref(u, k, s, p), [xs])
    check_grad(lambda u: avg_pool2d(u, k, s, p), lambda u: avg_pool_ref(u, k, s, p), [xs])
    check_grad(lambda u: avg_pool2d(u.transpose(2, 3), k, s, p, count_include_pad=False),
               lambda u: avg_pool_ref(u.transpose(0, 1, 3, 2), k, s, p, False), [xs])


def test_pool_defaults_and_errors(rng):
    x = f32(rng.normal(size=(3, 4, 4)))  # unbatched CHW
    got = max_pool2d(wr.tensor(x), 2)
    np.testing.assert_allclose(got.numpy(), max_pool_ref(x[None], (2, 2), (2, 2), (0, 0))[0])
    # negative strides (reversed views) are read in place
    xr = f32(rng.normal(size=(1, 2, 5, 5)))
    got = max_pool2d(wr.tensor(xr)[:, :, ::-1, ::-2], 2, 1).numpy()
    np.testing.assert_array_equal(got, max_pool_ref(xr[:, :, ::-1, ::-2], (2, 2), (1, 1), (0, 0)))
    with pytest.raises(ValueError, match="at most half"):
        max_pool2d(wr.tensor(x), 2, padding=2)
    with pytest.raises(wr.ShapeError, match="NCHW"):
        avg_pool2d(wr.zeros((4, 4)), 2)
