"""conv2d with groups / dilation / padding='same', conv1d, conv_transpose1d / 2d, pooling with
ceil_mode / dilation / return_indices / divisor_override, adaptive pooling, interpolate,
unfold / fold: forward against direct numpy loops, gradients against finite differences."""
import math

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn
from wgrumus.nn import functional as F


def np_conv2d(x, w, b=None, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    N, C, H, W = x.shape
    OC, CG, KH, KW = w.shape
    xp = np.pad(x, [(0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2])
    OH = (H + 2 * padding[0] - dilation[0] * (KH - 1) - 1) // stride[0] + 1
    OW = (W + 2 * padding[1] - dilation[1] * (KW - 1) - 1) // stride[1] + 1
    out = np.zeros((N, OC, OH, OW))
    og = OC // groups
    for o in range(OC):
        g = o // og
        for i in range(OH):
            for j in range(OW):
                hs = i * stride[0] + dilation[0] * np.arange(KH)
                ws = j * stride[1] + dilation[1] * np.arange(KW)
                patch = xp[:, g * CG:(g + 1) * CG][:, :, hs][:, :, :, ws]
                out[:, o, i, j] = (patch * w[o]).sum((1, 2, 3))
    return out if b is None else out + b[None, :, None, None]


def np_conv_transpose2d(x, w, stride, padding, output_padding, groups, dilation):
    N, C, H, W = x.shape
    _, OG, KH, KW = w.shape
    OH = (H - 1) * stride[0] - 2 * padding[0] + dilation[0] * (KH - 1) + output_padding[0] + 1
    OW = (W - 1) * stride[1] - 2 * padding[1] + dilation[1] * (KW - 1) + output_padding[1] + 1
    full = np.zeros((N, OG * groups, OH + 2 * padding[0] + 1, OW + 2 * padding[1] + 1))
    cg = C // groups
    for c in range(C):
        g = c // cg
        for i in range(H):
            for j in range(W):
                for a in range(KH):
                    for b in range(KW):
                        full[:, g * OG:(g + 1) * OG, i * stride[0] + a * dilation[0],
                             j * stride[1] + b * dilation[1]] += x[:, c, i, j, None] * w[c, :, a, b]
    return full[:, :, padding[0]:padding[0] + OH, padding[1]:padding[1] + OW]


@pytest.mark.parametrize("groups,dilation,stride,padding", [
    (1, (2, 1), (1, 1), (1, 2)), (2, (1, 1), (2, 1), (0, 1)), (4, (2, 2), (1, 2), (2, 0))])
def test_conv2d_groups_dilation(rng, groups, dilation, stride, padding):
    x = rng.normal(size=(2, 4, 7, 6))
    w = rng.normal(size=(4, 4 // groups, 3, 2)) * 0.5
    b = rng.normal(size=(4,))
    check_grad(lambda x, w, b: F.conv2d(x, w, b, stride, padding, dilation, groups),
               lambda x, w, b: np_conv2d(x, w, b, stride, padding, dilation, groups), [x, w, b])


def test_conv2d_same_valid_and_conv1d(rng):
    x = rng.normal(size=(1, 2, 6, 5))
    w = rng.normal(size=(3, 2, 4, 3))
    got = F.conv2d(wr.tensor(x.astype(np.float32)), wr.tensor(w.astype(np.float32)),
                   padding="same", dilation=(1, 2))
    xp = np.pad(x, [(0, 0), (0, 0), (1, 2), (2, 2)])  # torch: the extra unit on the far side
    np.testing.assert_allclose(got.numpy(), np_conv2d(xp, w, dilation=(1, 2)), rtol=1e-4,
                               atol=1e-5)
    assert F.conv2d(wr.tensor(x.astype(np.float32)), wr.tensor(w.astype(np.float32)),
                    padding="valid").shape == (1, 3, 3, 3)
    x1, w1 = rng.normal(size=(2, 4, 9)), rng.normal(size=(6, 2, 3))
    check_grad(lambda x, w: F.conv1d(x, w, stride=2, padding=1, groups=2),
               lambda x, w: np_conv2d(x[:, :, None], w[:, :, None], None, (1, 2), (0, 1),
                                      (1, 1), 2)[:, :, 0], [x1, w1])
    m = nn.Conv1d(4, 6, 3, padding="same", groups=2, bias=False)
    assert m(wr.tensor(x1.astype(np.float32))).shape == (2, 6, 9) and m.bias is None
    c = nn.Conv2d(4, 8, 3, dilation=2, groups=4)
    assert c.weight.shape == (8, 1, 3, 3) and "groups=4" in repr(c)
    with pytest.raises(wr.ShapeError, match="groups"):
        F.conv2d(wr.zeros(1, 3, 5, 5), wr.zeros(4, 1, 3, 3), groups=2)


@pytest.mark.parametrize("stride,padding,output_padding,groups,dilation", [
    ((1, 1), (0, 0), (0, 0), 1, (1, 1)), ((2, 1), (1, 0), (1, 0), 1, (1, 1)),
    ((2, 2), (1, 1), (0, 1), 2, (1, 2))])
def test_conv_transpose2d(rng, stride, padding, output_padding, groups, dilation):
    x = rng.normal(size=(2, 4, 3, 4))
    w = rng.normal(size=(4, 3, 3, 2)) * 0.5
    b = rng.normal(size=(3 * groups,))
    check_grad(lambda x, w, b: F.conv_transpose2d(x, w, b, stride, padding, output_padding,
                                                  groups, dilation),
               lambda x, w, b: np_conv_transpose2d(x, w, stride, padding, output_padding,
                                                   groups, dilation) + b[None, :, None, None],
               [x, w, b])
    m = nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1)
    assert m(wr.zeros(1, 4, 5, 5)).shape == (1, 6, 10, 10)


def test_conv_transpose1d(rng):
    x, w = rng.normal(size=(2, 3, 5)), rng.normal(size=(3, 2, 3))
    check_grad(lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=1),
               lambda x, w: np_conv_transpose2d(x[:, :, None], w[:, :, None], (1, 2), (0, 1),
                                                (0, 0), 1, (1, 1))[:, :, 0], [x, w])


def np_pool(x, k, s, p, d, ceil, op, count_include_pad=True):
    N, C, H, W = x.shape

    def size(n, kk, ss, pp, dd):
        span = n + 2 * pp - dd * (kk - 1) - 1
        o = (-(-span // ss) if ceil else span // ss) + 1
        if ceil and (o - 1) * ss >= n + pp:
            o -= 1
        return o
    OH, OW = size(H, k[0], s[0], p[0], d[0]), size(W, k[1], s[1], p[1], d[1])
    out = np.zeros((N, C, OH, OW))
    idx = np.zeros((N, C, OH, OW), np.int64)
    for i in range(OH):
        for j in range(OW):
            hs = i * s[0] - p[0] + d[0] * np.arange(k[0])
            ws = j * s[1] - p[1] + d[1] * np.arange(k[1])
            vals, pos = [], []
            for h in hs:
                for w in ws:
                    if 0 <= h < H and 0 <= w < W:
                        vals.append(x[:, :, h, w])
                        pos.append(h * W + w)
            vals = np.stack(vals, -1)
            if op == "max":
                out[:, :, i, j] = vals.max(-1)
                idx[:, :, i, j] = np.array(pos)[vals.argmax(-1)]
            else:
                h0, w0 = i * s[0] - p[0], j * s[1] - p[1]
                if count_include_pad:
                    div = (min(h0 + k[0], H + p[0]) - h0) * (min(w0 + k[1], W + p[1]) - w0)
                else:
                    div = vals.shape[-1]
                out[:, :, i, j] = vals.sum(-1) / div
    return out, idx


@pytest.mark.parametrize("k,s,p,d,ceil", [((3, 3), (2, 2), (1, 1), (1, 1), True),
                                          ((2, 3), (2, 2), (0, 1), (2, 1), False),
                                          ((3, 2), (2, 3), (0, 0), (1, 1), True)])
def test_max_pool_arguments(rng, k, s, p, d, ceil):
    x = rng.normal(size=(2, 3, 8, 7))
    check_grad(lambda x: F.max_pool2d(x, k, s, p, d, ceil_mode=ceil),
               lambda x: np_pool(x, k, s, p, d, ceil, "max")[0], [x])
    out, idx = F.max_pool2d(wr.tensor(x.astype(np.float32)), k, s, p, d, ceil, True)
    np.testing.assert_array_equal(idx.numpy(), np_pool(x.astype(np.float32), k, s, p, d, ceil,
                                                        "max")[1])
    m = nn.MaxPool2d(k, s, p, d, return_indices=True, ceil_mode=ceil)
    np.testing.assert_array_equal(m(wr.tensor(x.astype(np.float32)))[1].numpy(), idx.numpy())


@pytest.mark.parametrize("ceil,count_include_pad", [(True, True), (True, False), (False, False)])
def test_avg_pool_arguments(rng, ceil, count_include_pad):
    x = rng.normal(size=(2, 3, 7, 8))
    k, s, p = (3, 3), (2, 2), (1, 1)
    check_grad(lambda x: F.avg_pool2d(x, k, s, p, ceil, count_include_pad),
               lambda x: np_pool(x, k, s, p, (1, 1), ceil, "avg", count_include_pad)[0], [x])
    got = F.avg_pool2d(wr.tensor(x.astype(np.float32)), 2, divisor_override=3).numpy()
    want = np_pool(x, (2, 2), (2, 2), (0, 0), (1, 1), False, "avg")[0] * 4 / 3  # sum / 3
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_pool1d_and_adaptive(rng):
    x = rng.normal(size=(2, 3, 10))
    got = F.max_pool1d(wr.tensor(x.astype(np.float32)), 3, 2, ceil_mode=True).numpy()
    want = np_pool(x[:, :, None], (1, 3), (1, 2), (0, 0), (1, 1), True, "max")[0][:, :, 0]
    np.testing.assert_allclose(got, want, rtol=1e-6)
    np.testing.assert_allclose(F.avg_pool1d(wr.tensor(x.astype(np.float32)), 2).numpy(),
                               x.reshape(2, 3, 5, 2).mean(-1), rtol=1e-5)
    x4 = rng.normal(size=(2, 3, 7, 9))

    def np_adaptive(x, oh, ow):
        H, W = x.shape[-2:]
        out = np.zeros(x.shape[:2] + (oh, ow))
        for i in range(oh):
            for j in range(ow):
                h0, h1 = (i * H) // oh, math.ceil((i + 1) * H / oh)
                w0, w1 = (j * W) // ow, math.ceil((j + 1) * W / ow)
                out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean((2, 3))
        return out
    check_grad(lambda x: F.adaptive_avg_pool2d(x, (3, 4)), lambda x: np_adaptive(x, 3, 4), [x4])
    check_grad(lambda x: nn.AdaptiveAvgPool2d(1)(x), lambda x: np_adaptive(x, 1, 1), [x4])
    np.testing.assert_allclose(F.adaptive_avg_pool1d(wr.tensor(x.astype(np.float32)), 4).numpy(),
                               np_adaptive(x[:, :, None], 1, 4)[:, :, 0], rtol=1e-5)
    got = F.adaptive_max_pool2d(wr.tensor(x4[:, :, :6, :9].astype(np.float32)), (2, 3))
    np.testing.assert_allclose(got.numpy(), x4[:, :, :6, :9].reshape(2, 3, 2, 3, 3, 3)
                               .max((3, 5)), rtol=1e-6)
    with pytest.raises(NotImplementedError, match="uneven"):
        F.adaptive_max_pool2d(wr.tensor(x4.astype(np.float32)), (2, 2))


def np_bilinear(x, oh, ow, align_corners):
    H, W = x.shape[-2:]

    def coords(n_in, n_out):
        o = np.arange(n_out)
        if align_corners:
            src = o * (n_in - 1) / (n_out - 1) if n_out > 1 else np.zeros(n_out)
        else:
            src = np.maximum((o + 0.5) * n_in / n_out - 0.5, 0)
        i0 = np.minimum(np.floor(src).astype(int), n_in - 1)
        return i0, np.minimum(i0 + 1, n_in - 1), src - i0
    h0, h1, lh = coords(H, oh)
    w0, w1, lw = coords(W, ow)
    top = x[:, :, h0][:, :, :, w0] * (1 - lw) + x[:, :, h0][:, :, :, w1] * lw
    bot = x[:, :, h1][:, :, :, w0] * (1 - lw) + x[:, :, h1][:, :, :, w1] * lw
    return top * (1 - lh)[:, None] + bot * lh[:, None]


@pytest.mark.parametrize("align_corners", [False, True])
def test_interpolate_bilinear(rng, align_corners):
    x = rng.normal(size=(2, 3, 4, 5))
    check_grad(lambda x: F.interpolate(x, size=(7, 3), mode="bilinear",
                                       align_corners=align_corners),
               lambda x: np_bilinear(x, 7, 3, align_corners), [x])


def test_interpolate_nearest_and_linear(rng):
    x = rng.normal(size=(1, 2, 3, 4)).astype(np.float32)
    t = wr.tensor(x)
    got = F.interpolate(t, scale_factor=2).numpy()
    np.testing.assert_array_equal(got, x.repeat(2, 2).repeat(2, 3))
    got = F.interpolate(t, size=(5, 3), mode="nearest").numpy()
    hi, wi = np.floor(np.arange(5) * 3 / 5).astype(int), np.floor(np.arange(3) * 4 / 3).astype(int)
    np.testing.assert_array_equal(got, x[:, :, hi][:, :, :, wi])
    got = F.interpolate(t, size=(5, 3), mode="nearest-exact").numpy()
    hi = np.floor((np.arange(5) + 0.5) * 3 / 5).astype(int)
    wi = np.floor((np.arange(3) + 0.5) * 4 / 3).astype(int)
    np.testing.assert_array_equal(got, x[:, :, hi][:, :, :, wi])
    x1 = rng.normal(size=(2, 3, 6))
    check_grad(lambda x: F.interpolate(x, size=4, mode="linear"),
               lambda x: np_bilinear(x[:, :, None], 1, 4, False)[:, :, 0], [x1])
    assert nn.Upsample(scale_factor=2, mode="bilinear")(t).shape == (1, 2, 6, 8)


def test_unfold_fold(rng):
    x = rng.normal(size=(2, 3, 5, 4))

    def np_unfold(x):
        N, C, H, W = x.shape
        xp = np.pad(x, [(0, 0), (0, 0), (1, 1), (1, 1)])
        cols = [xp[:, :, i:i + 3, j:j + 3].reshape(N, -1)
                for i in range(0, H + 2 - 3 + 1, 2) for j in range(0, W + 2 - 3 + 1, 2)]
        return np.stack(cols, -1)
    check_grad(lambda x: F.unfold(x, 3, padding=1, stride=2), np_unfold, [x])
    cols = F.unfold(wr.tensor(x.astype(np.float32)), 2)
    back = F.fold(cols, (5, 4), 2)
    ones = F.fold(F.unfold(wr.ones(1, 1, 5, 4), 2), (5, 4), 2).numpy()
    np.testing.assert_allclose(back.numpy(), x.astype(np.float32) * ones, rtol=1e-5)
    a = rng.normal(size=(3, 8))
    check_grad(lambda x: x.unfold(1, 3, 2),
               lambda x: np.stack([x[:, k:k + 3] for k in range(0, 6, 2)], 1), [a])
