"""Autograd: gradients of every differentiable core op against central differences (float64
numpy), and the engine's contract (GradIds, tapes, no_grad, version counters, GradientStore)."""
import gc
import threading

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus.autograd import (
    AutogradError,
    GradientStore,
    Tape,
    backward_with_grad,
    install_tape,
    new_grad_id,
    no_grad,
    take_tape,
)
from wgrumus.autograd.tape import current_tape, enable_grad, is_grad_enabled

R = np.random.default_rng(0)


def U(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape)


def _erf(a):
    from math import erf
    return np.vectorize(erf, otypes=[np.float64])(a)


UNARY = [
    ("neg", lambda t: -t, lambda a: -a, U(3, 4)),
    ("exp", lambda t: t.exp(), np.exp, U(3, 4)),
    ("log", lambda t: t.log(), np.log, U(3, 4, lo=0.5, hi=3)),
    ("sqrt", lambda t: t.sqrt(), np.sqrt, U(3, 4, lo=0.5, hi=3)),
    ("rsqrt", lambda t: t.rsqrt(), lambda a: a ** -0.5, U(3, 4, lo=0.5, hi=3)),
    ("abs", lambda t: abs(t), np.abs, U(3, 4)),
    ("tanh", lambda t: t.tanh(), np.tanh, U(3, 4)),
    ("sigmoid", lambda t: t.sigmoid(), lambda a: 1 / (1 + np.exp(-a)), U(3, 4)),
    ("relu", lambda t: t.relu(), lambda a: np.maximum(a, 0), U(3, 4)),
    ("gelu", lambda t: t.gelu(), lambda a: 0.5 * a * (1 + _erf(a / np.sqrt(2))), U(3, 4)),
    ("gelu_tanh", lambda t: wr.ops.gelu(t, approximate="tanh"),
     lambda a: 0.5 * a * (1 + np.tanh(np.sqrt(2 / np.pi) * (a + 0.044715 * a ** 3))), U(3, 4)),
    ("leaky_relu", lambda t: t.leaky_relu(0.2), lambda a: np.where(a > 0, a, 0.2 * a), U(3, 4)),
    ("sin", lambda t: t.sin(), np.sin, U(3, 4)),
    ("cos", lambda t: t.cos(), np.cos, U(3, 4)),
    ("square", lambda t: t.square(), np.square, U(3, 4)),
    ("reciprocal", lambda t: t.reciprocal(), lambda a: 1 / a, U(3, 4, lo=0.5, hi=2)),
    ("clamp", lambda t: t.clamp(-0.5, 0.7), lambda a: np.clip(a, -0.5, 0.7), U(3, 4)),
]


def _away_from_kinks(a):
    """Finite differences are wrong within eps of a kink (relu/abs/clamp at 0, -0.5, 0.7)."""
    for k in (0.0, -0.5, 0.7):
        a = np.where(np.abs(a - k) < 0.05, k + 0.1, a)
    return a


@pytest.mark.parametrize("name,f,ref,x", UNARY, ids=[u[0] for u in UNARY])
def test_unary_grad(name, f, ref, x):
    check_grad(f, ref, [_away_from_kinks(x)])


BINARY = [
    ("add", lambda a, b: a + b, np.add, U(3, 4), U(4)),
    ("sub", lambda a, b: a - b, np.subtract, U(2, 1, 3), U(4, 1)),
    ("mul", lambda a, b: a * b, np.multiply, U(3, 1), U(1, 4)),
    ("div", lambda a, b: a / b, np.divide, U(3, 4), U(3, 1, lo=0.5, hi=2)),
    ("pow", lambda a, b: a ** b, np.power, U(3, 4, lo=0.5, hi=2), U(4)),
    ("maximum", wr.maximum, np.maximum, U(3, 4), U(3, 4)),
    ("minimum", wr.minimum, np.minimum, U(3, 4), U(1, 4)),
]


@pytest.mark.parametrize("name,f,ref,a,b", BINARY, ids=[b[0] for b in BINARY])
def test_binary_grad_broadcast(name, f, ref, a, b):
    if name in ("maximum", "minimum"):  # keep the two operands apart (no ties)
        b = np.where(np.abs(a - b) < 0.05, b + 0.2, b)
    check_grad(f, ref, [a, b])


def test_pow_negative_base_integral_exponent_grad():
    a = U(3, 4, lo=-2, hi=-0.5)
    check_grad(lambda t: t ** 3.0, lambda x: x ** 3, [a])
    check_grad(lambda t: t ** 2, lambda x: x ** 2, [a])
    check_grad(lambda t: t ** -1.0, lambda x: x ** -1.0, [a])


SCALAR = [
    ("add", lambda t: t + 1.5, lambda a: a + 1.5), ("radd", lambda t: 1.5 + t, lambda a: 1.5 + a),
    ("sub", lambda t: t - 1.5, lambda a: a - 1.5), ("rsub", lambda t: 1.5 - t, lambda a: 1.5 - a),
    ("mul", lambda t: t * -2.0, lambda a: a * -2), ("rmul", lambda t: 3 * t, lambda a: 3 * a),
    ("div", lambda t: t / 4.0, lambda a: a / 4), ("rdiv", lambda t: 2.0 / t, lambda a: 2 / a),
    ("pow", lambda t: t ** 1.7, lambda a: a ** 1.7),
    ("rpow", lambda t: 1.3 ** t, lambda a: 1.3 ** a),
    ("max", lambda t: wr.maximum(t, 1.0), lambda a: np.maximum(a, 1.0)),
    ("min", lambda t: wr.minimum(t, 1.0), lambda a: np.minimum(a, 1.0)),
]


@pytest.mark.parametrize("name,f,ref", SCALAR, ids=[s[0] for s in SCALAR])
def test_scalar_grad(name, f, ref):
    x = U(3, 4, lo=0.5, hi=2.0)
    x = np.where(np.abs(x - 1.0) < 0.05, 1.2, x)
    check_grad(f, ref, [x])


def test_where_grad():
    c = (R.uniform(size=(3, 1)) > 0.5).astype(np.float64)
    check_grad(lambda x, y: wr.where(wr.tensor(c), x, y), lambda x, y: np.where(c != 0, x, y),
               [U(3, 4), U(4)])


@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, True), ((0, 2), False),
                                           (-1, False), ((), False)])
def test_reduction_grads(axis, keepdims):
    x = U(3, 4, 5)
    check_grad(lambda t: t.sum(axis=axis, keepdims=keepdims),
               lambda a: a.sum(axis=axis, keepdims=keepdims), [x])
    check_grad(lambda t: t.mean(axis=axis, keepdims=keepdims),
               lambda a: a.mean(axis=axis, keepdims=keepdims), [x])
    if axis != ():
        check_grad(lambda t: t.var(axis=axis, keepdims=keepdims),
                   lambda a: a.var(axis=axis, keepdims=keepdims), [x])
        check_grad(lambda t: t.std(axis=axis, keepdims=keepdims, ddof=1),
                   lambda a: a.std(axis=axis, keepdims=keepdims, ddof=1), [x])


@pytest.mark.parametrize("axis", [None, 0, (1, 2)])
def test_max_min_grads(axis):
    x = R.permutation(60).reshape(3, 4, 5) / 10.0  # distinct values: no ties
    check_grad(lambda t: t.max(axis=axis), lambda a: a.max(axis=axis), [x])
    check_grad(lambda t: t.min(axis=axis, keepdims=True),
               lambda a: a.min(axis=axis, keepdims=True), [x])


def test_max_grad_splits_ties():
    x = wr.tensor(np.array([1.0, 3.0, 3.0, 2.0], np.float32), requires_grad=True)
    g = wr.autograd.backward(x.max()).get(x).numpy()
    np.testing.assert_allclose(g, [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4),
                                   (3, 4, 2)), ((4,), (4, 3)), ((3, 4), (4,)), ((4,), (4,))])
def test_matmul_grad(sa, sb):
    check_grad(lambda a, b: a @ b, np.matmul, [U(*sa), U(*sb)])


def test_matmul_grad_transposed_view():
    check_grad(lambda a, b: a.T @ b.T.T[:, ::2],
               lambda a, b: a.T @ b[:, ::2], [U(4, 3), U(4, 6)])


def test_shape_op_grads():
    check_grad(lambda t: t.reshape(4, 3) * wr.tensor(np.arange(12.0, dtype=np.float32)
                                                      .reshape(4, 3)),
               lambda a: a.reshape(4, 3) * np.arange(12.0).reshape(4, 3), [U(3, 4)])
    check_grad(lambda t: t.permute(2, 0, 1), lambda a: a.transpose(2, 0, 1), [U(2, 3, 4)])
    check_grad(lambda t: t.transpose(0, 1), lambda a: a.T, [U(3, 4)])
    check_grad(lambda t: t.expand(3, 2, 4), lambda a: np.broadcast_to(a, (3, 2, 4)), [U(2, 1)])
    check_grad(lambda t: t[1:, ::-2], lambda a: a[1:, ::-2], [U(3, 5)])
    check_grad(lambda t: t.T[::2, 1], lambda a: a.T[::2, 1], [U(3, 5)])  # strided source
    check_grad(lambda t: t.unsqueeze(0).squeeze(0).flatten(), lambda a: a.reshape(-1),
               [U(2, 3)])
    check_grad(lambda t: t.T.contiguous(), lambda a: a.T, [U(2, 3)])
    check_grad(lambda t: t.clone(), lambda a: a.copy(), [U(2, 3)])


def test_cat_stack_split_grads():
    check_grad(lambda a, b: wr.cat([a, b, a], axis=1),
               lambda a, b: np.concatenate([a, b, a], axis=1), [U(2, 3), U(2, 1)])
    check_grad(lambda a, b: wr.stack([a, b], axis=1), lambda a, b: np.stack([a, b], axis=1),
               [U(2, 3), U(2, 3)])
    check_grad(lambda a: wr.split(a, [1, 3], axis=1)[1] * 2.0, lambda a: a[:, 1:] * 2.0,
               [U(2, 4)])


def test_composite_graph_grad():
    def f(x, w, b):
        h = (x @ w + b).tanh()
        return (h * h.sigmoid()).sum(axis=1) / (1.0 + h.abs().mean())

    def ref(x, w, b):
        h = np.tanh(x @ w + b)
        return (h / (1 + np.exp(-h))).sum(axis=1) / (1 + np.abs(h).mean())
    check_grad(f, ref, [U(3, 4), U(4, 5), U(5)])


# --------------------------------------------------------------------------- engine contract
def test_grad_ids_unique_across_threads():
    ids, lock = [], threading.Lock()

    def work():
        local = [new_grad_id() for _ in range(2000)]
        local += [wr.zeros(1, requires_grad=True).grad_id for _ in range(20)]
        with lock:
            ids.extend(local)
    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert len(ids) == 8 * 2020 and len(set(ids)) == len(ids)


def test_tapes_are_per_thread():
    x = wr.ones(2, requires_grad=True)
    mine = Tape()
    prev = install_tape(mine)
    try:
        y = x * 2.0
        seen = {}

        def other():
            seen["tape"] = current_tape()
            z = x + 1.0  # recorded on the other thread's own tape
            seen["len"] = len(current_tape())
            seen["z"] = z
        t = threading.Thread(target=other)
        t.start()
        t.join(timeout=30)
        assert seen["tape"] is not mine and seen["len"] == 1
        assert len(mine) == 1 and mine.nodes[0].name == "mul"
        taken = take_tape()
        assert taken is mine and current_tape() is not mine and len(current_tape()) == 0
        del y
    finally:
        install_tape(prev if prev is not None else Tape())


def test_no_grad_nesting_and_enable_grad():
    x = wr.ones(2, requires_grad=True)
    assert is_grad_enabled()
    with no_grad():
        with no_grad():
            assert not (x * 2).requires_grad
        assert not is_grad_enabled()
        with enable_grad():
            assert (x * 2).requires_grad
        assert not (x * 2).requires_grad
    assert is_grad_enabled() and (x * 2).requires_grad

    @no_grad()
    def f(t):
        return t * 3
    assert not f(x).requires_grad and is_grad_enabled()


def test_branch_not_reaching_output_is_ignored():
    x = wr.tensor(np.array([1.0, 2.0], np.float32), requires_grad=True)
    w = wr.tensor(np.array([3.0, 4.0], np.float32), requires_grad=True)
    _dead = (w * x).exp()  # recorded, but not part of the loss
    loss = (x * 2.0).sum()
    store = wr.autograd.backward(loss)
    np.testing.assert_allclose(store.get(x).numpy(), [2, 2])
    assert w not in store and store.get(w) is None
    del _dead


def test_inplace_modification_of_saved_tensor_raises():
    x = wr.tensor(np.ones(3, np.float32), requires_grad=True)
    for modify in (lambda w: w.fill_(5.0), lambda w: w.__setitem__(0, 2.0),
                   lambda w: wr.ops.elementwise.copy_into(w, wr.zeros(3)),
                   lambda w: w.__iadd__(1.0)):
        w = wr.tensor(np.full(3, 2.0, np.float32))
        y = (x * w).sum()
        modify(w)
        with pytest.raises(AutogradError, match="modified in place"):
            wr.autograd.backward(y)
    # modifying a view of the saved tensor's storage counts too
    w = wr.tensor(np.full((2, 3), 2.0, np.float32))
    y = (x * w[1]).sum()
    w[0] = 7.0
    with pytest.raises(AutogradError, match="modified in place"):
        wr.autograd.backward(y)


def test_inplace_on_leaf_requiring_grad_raises():
    x = wr.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="in-place"):
        x += 1.0
    with no_grad():
        x -= 0.5  # what optimizers do
    np.testing.assert_allclose(x.numpy(), [0.5] * 3)


def test_gradient_store_api():
    a, b = wr.ones(2, 3), wr.zeros(4)
    s = GradientStore()
    s.accumulate(a, wr.ones(2, 3))
    s.accumulate(a.grad_id, wr.ones(2, 3))
    assert len(s) == 1 and a in s and a.grad_id in s and b not in s and 12345678 not in s
    np.testing.assert_allclose(s.get(a).numpy(), np.full((2, 3), 2.0))
    np.testing.assert_allclose(s[a.grad_id].numpy(), np.full((2, 3), 2.0))
    with pytest.raises(wr.ShapeError, match=r"\(3, 2\).*\(2, 3\)"):
        s.accumulate(a, wr.ones(3, 2))
    with pytest.raises(wr.ShapeError, match=r"\(5,\).*\(2, 3\)"):
        s.accumulate(a.grad_id, wr.ones(5))
    other = GradientStore()
    other.accumulate(a, wr.ones(2, 3))
    other.accumulate(b, wr.ones(4))
    s.merge_from(other)
    assert len(s) == 2
    np.testing.assert_allclose(s.get(a).numpy(), np.full((2, 3), 3.0))
    bad = GradientStore()
    bad.accumulate(b.grad_id, wr.ones(5))
    with pytest.raises(wr.ShapeError):
        s.merge_from(bad)
    assert s.remove(b) is not None and b not in s and len(s) == 1
    assert s.remove(b) is None
    with pytest.raises(KeyError):
        s[b]
    with pytest.raises(TypeError):
        s.get("x")


def test_backward_with_grad_and_errors():
    x = wr.tensor(np.array([1.0, 2.0, 3.0], np.float32), requires_grad=True)
    y = x * x
    g = wr.tensor(np.array([1.0, 0.5, 2.0], np.float32))
    store = backward_with_grad(y, g)
    np.testing.assert_allclose(store.get(x).numpy(), [2.0, 2.0, 12.0])
    with pytest.raises(wr.ShapeError, match="one element"):
        wr.autograd.backward(x * 2.0)
    with pytest.raises(wr.ShapeError, match=r"\(2,\).*\(3,\)"):
        backward_with_grad(x * 2.0, wr.ones(2))
    with pytest.raises(AutogradError, match="does not require grad"):
        wr.autograd.backward(wr.ones(1))
    leaf_store = backward_with_grad(x, g)  # a leaf: its gradient is the seed
    np.testing.assert_allclose(leaf_store.get(x).numpy(), g.numpy())


def test_dot_backward_accumulates_into_grad():
    x = wr.tensor(np.array([1.0, -2.0], np.float32), requires_grad=True)
    (x * 3.0).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3, 3])
    (x * x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), [3 + 2, 3 - 4])
    x.grad = None
    (x * x).sum().backward(wr.tensor(np.float32(2.0)))
    np.testing.assert_allclose(x.grad.numpy(), [4, -8])


def test_second_backward_through_consumed_graph_errors():
    x = wr.ones(3, requires_grad=True)
    h = x.exp()
    wr.autograd.backward(h.sum())
    with pytest.raises(AutogradError, match="second time"):
        wr.autograd.backward(h.sum())


def test_backward_frees_the_graph_without_the_cyclic_collector():
    import weakref
    x = wr.ones(3, requires_grad=True)
    h = (x * 2.0).exp()
    inner = weakref.ref(h._node)
    loss = h.sum()
    del h
    gc.collect()
    gc.disable()
    try:
        assert inner() is not None  # held by the loss's graph
        wr.autograd.backward(loss)
        assert inner() is None  # freed at once, though the loss is still alive
        with pytest.raises(AutogradError, match="second time"):
            wr.autograd.backward(loss)
    finally:
        gc.enable()


def test_tape_does_not_grow_when_forwards_are_discarded(dev):
    x = wr.ones(64, requires_grad=True)
    w = wr.ones(64)
    tape = Tape()
    prev = install_tape(tape)
    gc.collect()
    gc.disable()  # freeing must not depend on the cyclic collector
    try:
        for _ in range(50):
            ((x * w).exp() / (x + 1.0)).tanh().sum()  # discarded without backward
        base = dev.pool.stats()["buffers_created"]
        for _ in range(1000):  # 5000 records: pruning at 4096 must find the dead ones
            ((x * w).exp() / (x + 1.0)).sum()
        assert len(tape._entries) < 4096
        assert len(tape) == 0
        assert dev.pool.stats()["buffers_created"] - base < 20
    finally:
        gc.enable()
        install_tape(prev if prev is not None else Tape())


def test_grad_of_nonleaf_not_stored_and_leaf_without_grad_skipped():
    x = wr.ones(2, requires_grad=True)
    c = wr.ones(2)  # does not require grad
    h = x * 2.0
    store = wr.autograd.backward((h * c).sum())
    assert len(store) == 1 and x in store and h not in store and c not in store
