"""binary_cross_entropy (probabilities and logits), nll_loss, cross_entropy with probability
targets and class weights, l1 / smooth_l1 / huber / kl_div: values against numpy, gradients
against finite differences, PyTorch's clamps and weighted-mean rule."""
import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn
from wgrumus.nn import functional as F


def np_log_softmax(x, axis=1):
    m = x.max(axis, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis, keepdims=True))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_bce(rng, reduction):
    p = rng.uniform(0.05, 0.95, size=(3, 4))
    y = rng.uniform(0, 1, size=(3, 4))
    red = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    ref = lambda p, y: red(-(y * np.log(p) + (1 - y) * np.log(1 - p)))  # noqa: E731
    check_grad(lambda p, y: F.binary_cross_entropy(p, y, reduction=reduction), ref, [p, y])
    x = rng.normal(size=(3, 4)) * 3
    ref2 = lambda x, y: red(np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x))))  # noqa: E731
    check_grad(lambda x, y: F.binary_cross_entropy_with_logits(x, y, reduction=reduction), ref2,
               [x, y])


def test_bce_clamps_weights_and_pos_weight(rng):
    p = wr.tensor(np.array([0.0, 1.0, 0.5], np.float32))
    y = wr.tensor(np.array([1.0, 0.0, 1.0], np.float32))
    got = F.binary_cross_entropy(p, y, reduction="none").numpy()
    np.testing.assert_allclose(got, [100.0, 100.0, np.log(2)], rtol=1e-6)  # log clamped at -100
    x = rng.normal(size=(3, 4))
    yy = (rng.random((3, 4)) > 0.5).astype(np.float64)
    w, pw = rng.uniform(0.5, 2, size=(4,)), rng.uniform(0.5, 3, size=(4,))

    def ref(x, w, pw):
        lsig = -np.log1p(np.exp(-x))
        return np.mean(-w * (pw * yy * lsig + (1 - yy) * (lsig - x)))
    check_grad(lambda x, w, pw: F.binary_cross_entropy_with_logits(
        x, wr.tensor(yy.astype(np.float32)), w, pos_weight=pw), ref, [x, w, pw])
    big = wr.tensor(np.array([100.0, -100.0], np.float32))
    got = F.binary_cross_entropy_with_logits(big, wr.tensor(np.array([0.0, 1.0], np.float32)),
                                             reduction="none").numpy()
    np.testing.assert_allclose(got, [100.0, 100.0], rtol=1e-6)
    with pytest.raises(wr.ShapeError, match="target shape"):
        F.binary_cross_entropy(p, y[:2])
    m = nn.BCEWithLogitsLoss(pos_weight=wr.tensor(np.float32(2.0)))
    assert m(big, wr.tensor(np.array([1.0, 1.0], np.float32))).item() == pytest.approx(
        2 * (np.log1p(np.exp(-100.0)) + 100.0) / 2, rel=1e-5)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_with_weights_and_ignore(rng, reduction):
    x = np_log_softmax(rng.normal(size=(6, 4)))
    t = np.array([0, 3, 1, -100, 2, 3])
    w = rng.uniform(0.5, 2, size=(4,))
    keep = t != -100
    ts = np.where(keep, t, 0)

    def ref(x, w):
        per = -x[np.arange(6), ts] * w[ts] * keep
        return {"none": per, "sum": per.sum(), "mean": per.sum() / (w[ts] * keep).sum()}[
            reduction]
    tt = wr.tensor(t.astype(np.int32))
    check_grad(lambda x, w: F.nll_loss(x, tt, w, reduction=reduction), ref, [x, w],
               grad_of=[0])
    check_grad(lambda x: nn.NLLLoss(reduction=reduction)(x, tt),
               lambda x: ref(x, np.ones(4)), [x])


def test_nll_loss_spatial(rng):
    x = np_log_softmax(rng.normal(size=(2, 3, 4, 5)))
    t = rng.integers(0, 3, size=(2, 4, 5))
    want = -np.take_along_axis(x, t[:, None], 1)[:, 0]
    check_grad(lambda x: F.nll_loss(x, wr.tensor(t.astype(np.int32)), reduction="none"),
               lambda x: -np.take_along_axis(x, t[:, None], 1)[:, 0], [x])
    got = F.nll_loss(wr.tensor(x.astype(np.float32)), wr.tensor(t.astype(np.int32)))
    np.testing.assert_allclose(got.item(), want.mean(), rtol=1e-5)


@pytest.mark.parametrize("ls", [0.0, 0.2])
def test_cross_entropy_probability_targets(rng, ls):
    x = rng.normal(size=(5, 4))
    p = rng.dirichlet(np.ones(4), size=5)

    def ref(x, p):
        q = p * (1 - ls) + ls / 4
        return np.mean(-(q * np_log_softmax(x)).sum(1))
    check_grad(lambda x, p: F.cross_entropy(x, p, label_smoothing=ls), ref, [x, p])
    x4 = rng.normal(size=(2, 3, 4))
    p4 = rng.dirichlet(np.ones(3), size=(2, 4)).transpose(0, 2, 1)
    got = F.cross_entropy(wr.tensor(x4.astype(np.float32)), wr.tensor(p4.astype(np.float32)),
                          reduction="none")
    np.testing.assert_allclose(got.numpy(), -(p4 * np_log_softmax(x4)).sum(1), rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("ls", [0.0, 0.1])
def test_cross_entropy_class_weights(rng, ls):
    x = rng.normal(size=(6, 4))
    t = np.array([0, 3, 1, -100, 2, 3])
    w = rng.uniform(0.5, 2, size=(4,))
    keep = t != -100
    ts = np.where(keep, t, 0)

    def ref(x):
        lp = np_log_softmax(x)
        nll = -lp[np.arange(6), ts] * w[ts]
        smooth = -(lp * w).sum(1) / 4
        per = ((1 - ls) * nll + ls * smooth) * keep
        return per.sum() / (w[ts] * keep).sum()
    tt = wr.tensor(t.astype(np.int32))
    check_grad(lambda x: F.cross_entropy(x, tt, wr.tensor(w.astype(np.float32)),
                                         label_smoothing=ls), ref, [x])
    loss = nn.CrossEntropyLoss(weight=wr.tensor(w.astype(np.float32)), label_smoothing=ls)
    np.testing.assert_allclose(loss(wr.tensor(x.astype(np.float32)), tt).item(), ref(x),
                               rtol=1e-5)


def test_regression_losses(rng):
    a, b = rng.normal(size=(3, 4)) * 2, rng.normal(size=(3, 4))
    check_grad(F.l1_loss, lambda a, b: np.mean(np.abs(a - b)), [a, b])
    for beta in (1.0, 0.5):
        def sl1(a, b, beta=beta):
            d = np.abs(a - b)
            return np.mean(np.where(d < beta, 0.5 * d * d / beta, d - 0.5 * beta))

        def hub(a, b, beta=beta):
            d = np.abs(a - b)
            return np.sum(np.where(d <= beta, 0.5 * d * d, beta * (d - 0.5 * beta)))
        check_grad(lambda a, b, beta=beta: F.smooth_l1_loss(a, b, beta=beta), sl1, [a, b])
        check_grad(lambda a, b, beta=beta: F.huber_loss(a, b, "sum", beta), hub, [a, b])
    assert nn.L1Loss(reduction="sum")(wr.tensor(np.ones(3, np.float32)),
                                      wr.zeros(3)).item() == 3.0


@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div(rng, log_target):
    x = np_log_softmax(rng.normal(size=(3, 4)))
    t = rng.dirichlet(np.ones(4), size=3)
    if log_target:
        t = np.log(t)
        ref = lambda x, t: np.sum(np.exp(t) * (t - x)) / 3  # noqa: E731
    else:
        ref = lambda x, t: np.sum(t * (np.log(t) - x)) / 3  # noqa: E731
    check_grad(lambda x, t: F.kl_div(x, t, "batchmean", log_target), ref, [x, t])
    z = F.kl_div(wr.zeros(2), wr.zeros(2), "sum")
    assert z.item() == 0.0
