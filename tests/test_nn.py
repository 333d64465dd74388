"""nn: the Module API (registration, state_dict, modes, devices), PyTorch-default seeded
initialisation, and every layer's forward and gradient against float64 numpy references with
central finite differences."""
import math

import numpy as np
import pytest
from gradcheck import check_grad

import wgrumus as wr
from wgrumus import nn
from wgrumus.nn import functional as F


# ----------------------------------------------------------------------------- numpy references
def np_layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def np_softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def np_mha(x, w_in, b_in, w_out, b_out, heads, causal):
    B, T, E = x.shape
    D = E // heads
    qkv = x @ w_in.T + b_in
    q, k, v = (qkv[..., i * E:(i + 1) * E].reshape(B, T, heads, D).transpose(0, 2, 1, 3)
               for i in range(3))
    att = q @ k.transpose(0, 1, 3, 2) / math.sqrt(D)
    if causal:
        att = att + np.triu(np.full((T, T), -np.inf), 1)
    y = (np_softmax(att) @ v).transpose(0, 2, 1, 3).reshape(B, T, E)
    return y @ w_out.T + b_out


def np_conv2d(x, w, b, stride, pad):
    N, C, H, W = x.shape
    O, _, KH, KW = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (pad[0], pad[0]), (pad[1], pad[1])))
    OH = (H + 2 * pad[0] - KH) // stride[0] + 1
    OW = (W + 2 * pad[1] - KW) // stride[1] + 1
    out = np.zeros((N, O, OH, OW))
    for i in range(OH):
        for j in range(OW):
            patch = xp[:, :, i * stride[0]:i * stride[0] + KH, j * stride[1]:j * stride[1] + KW]
            out[:, :, i, j] = np.einsum("nckl,ockl->no", patch, w)
    return out + b[None, :, None, None]


# ----------------------------------------------------------------------------- Module API
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
        self.bn = nn.BatchNorm2d(2)
        self.heads = nn.ModuleList([nn.Linear(3, 2), nn.Linear(3, 2, bias=False)])
        self.scale = nn.Parameter(wr.ones(3))
        self.plain = 5  # ordinary attribute

    def forward(self, x):
        return self.body(x) * self.scale


def test_module_registration_and_state_dict():
    m = Net()
    names = [n for n, _ in m.named_parameters()]
    assert names == ["scale", "body.0.weight", "body.0.bias", "body.2.weight", "body.2.bias",
                     "bn.weight", "bn.bias", "heads.0.weight", "heads.0.bias",
                     "heads.1.weight"]
    assert len(m.parameters()) == 10 and all(p.requires_grad for p in m.parameters())
    assert [type(c).__name__ for c in m.children()] == ["Sequential", "BatchNorm2d",
                                                         "ModuleList"]
    sd = m.state_dict()
    assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"} <= set(sd)
    assert sd["body.0.weight"].shape == (8, 4)
    assert m.plain == 5 and "plain" not in sd
    m.bn.running_mean = wr.full((2,), 3.0)  # re-assigning a buffer keeps it in the state
    np.testing.assert_array_equal(m.state_dict()["bn.running_mean"].numpy(), [3.0, 3.0])
    assert isinstance(m.scale, nn.Parameter) and m.scale.is_leaf


def test_load_state_dict_roundtrip_and_clear_errors(rng):
    a, b = Net(), Net()
    b.load_state_dict(a.state_dict())
    for (n, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=n)
    # numpy values are accepted too
    sd = {k: v.numpy() for k, v in a.state_dict().items()}
    sd["body.0.bias"] = rng.standard_normal(8).astype(np.float32)
    b.load_state_dict(sd)
    np.testing.assert_array_equal(b.body[0].bias.numpy(), sd["body.0.bias"])

    bad = dict(sd)
    bad["body.0.weight"] = np.zeros((8, 5), np.float32)
    del bad["scale"]
    bad["extra.weight"] = np.zeros(2, np.float32)
    with pytest.raises(nn.StateDictError) as e:
        b.load_state_dict(bad)
    msg = str(e.value)
    assert "body.0.weight" in msg and "(8, 5)" in msg and "(8, 4)" in msg
    assert "missing keys" in msg and "scale" in msg
    assert "unexpected keys" in msg and "extra.weight" in msg
    # strict=False tolerates missing/unexpected keys but never a shape mismatch
    bad["body.0.weight"] = sd["body.0.weight"]
    missing, unexpected = b.load_state_dict(bad, strict=False)
    assert missing == ["scale"] and unexpected == ["extra.weight"]


def test_train_eval_to_device_zero_grad(devs):
    m = Net()
    assert m.training and m.bn.training
    m.eval()
    assert not m.training and not m.bn.training and not m.heads[1].training
    m.train()
    assert m.body[1].training
    w = m.body[0].weight
    w_np = w.numpy()
    gid = w.grad_id
    m.to(devs[2])
    assert m.body[0].weight is w and w.grad_id == gid and w.device is devs[2]
    assert m.bn.running_var.device is devs[2]
    np.testing.assert_array_equal(w.numpy(), w_np)
    x = wr.tensor(np.ones((2, 4), np.float32), device=devs[2])
    m(x).sum().backward()
    assert w.grad is not None and w.grad.device is devs[2]
    m.zero_grad()
    assert all(p.grad is None for p in m.parameters())


def test_seeded_init_is_device_independent_and_pytorch_like(devs):
    wr.manual_seed(7)
    a = nn.Linear(50, 20)
    wr.manual_seed(7)
    b = nn.Linear(50, 20, device=devs[3])
    np.testing.assert_array_equal(a.weight.numpy(), b.weight.numpy())
    np.testing.assert_array_equal(a.bias.numpy(), b.bias.numpy())
    c = nn.Linear(50, 20)  # the generator moved on: different weights
    assert not np.array_equal(a.weight.numpy(), c.weight.numpy())
    s1, s2 = nn.Linear(50, 20, seed=3), nn.Linear(50, 20, seed=3)
    np.testing.assert_array_equal(s1.weight.numpy(), s2.weight.numpy())
    w = a.weight.numpy()
    bound = 1 / math.sqrt(50)
    assert np.abs(w).max() <= bound and np.abs(w).max() > 0.9 * bound
    assert abs(w.std() - bound / math.sqrt(3)) < 0.1 * bound  # U(-b, b) has std b / sqrt(3)
    conv = nn.Conv2d(3, 4, (3, 2))
    cb = 1 / math.sqrt(3 * 3 * 2)
    assert conv.weight.shape == (4, 3, 3, 2) and np.abs(conv.weight.numpy()).max() <= cb
    emb = nn.Embedding(100, 30).weight.numpy()
    assert abs(emb.mean()) < 0.05 and abs(emb.std() - 1) < 0.05


# ----------------------------------------------------------------------------- layer gradients
def test_linear_grad(rng):
    x, w, b = rng.standard_normal((3, 4)), rng.standard_normal((5, 4)), rng.standard_normal(5)
    check_grad(lambda x, w, b: F.linear(x, w, b), lambda x, w, b: x @ w.T + b, [x, w, b])
    lin = nn.Linear(4, 5)
    out = lin(wr.tensor(x.astype(np.float32)))
    ref = x @ lin.weight.numpy().T + lin.bias.numpy()
    np.testing.assert_allclose(out.numpy(), ref, rtol=1e-5, atol=1e-5)


def test_layer_norm_and_activation_grads(rng):
    x, w, b = rng.standard_normal((3, 6)), rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)
    check_grad(lambda x, w, b: F.layer_norm(x, (6,), w, b), np_layer_norm, [x, w, b])


def test_gelu_relu_modules(rng):
    x = rng.standard_normal((4, 5))
    check_grad(lambda x: nn.GELU(approximate="tanh")(x),
               lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
               [x])
    erf = np.vectorize(math.erf)
    check_grad(lambda x: nn.GELU()(x), lambda x: 0.5 * x * (1 + erf(x / math.sqrt(2))), [x])
    check_grad(lambda x: nn.ReLU()(x), lambda x: np.maximum(x, 0), [x + 0.1 * np.sign(x)])


def test_batchnorm2d_training_grad_and_running_stats(rng):
    x = rng.standard_normal((3, 2, 2, 3)) * 2 + 1
    w, b = rng.uniform(0.5, 1.5, 2), rng.standard_normal(2)

    def ref(x, w, b):
        mu = x.mean((0, 2, 3), keepdims=True)
        var = x.var((0, 2, 3), keepdims=True)
        return (x - mu) / np.sqrt(var + 1e-5) * w[None, :, None, None] + b[None, :, None, None]
    check_grad(lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True), ref, [x, w, b])

    bn = nn.BatchNorm2d(2)
    xt = wr.tensor(x.astype(np.float32))
    bn(xt)
    bn(xt)
    rm, rv = np.zeros(2), np.ones(2)
    for _ in range(2):
        rm = 0.9 * rm + 0.1 * x.mean((0, 2, 3))
        rv = 0.9 * rv + 0.1 * x.var((0, 2, 3), ddof=1)  # unbiased, like PyTorch
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bn.running_var.numpy(), rv, rtol=1e-5, atol=1e-6)
    assert int(bn.num_batches_tracked.item()) == 2
    bn.eval()
    y = bn(xt).numpy()
    np.testing.assert_allclose(y, (x - rm[None, :, None, None]) /
                               np.sqrt(rv[None, :, None, None] + 1e-5), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(bn.running_mean.numpy(), rm, rtol=1e-6)  # eval: no update


def test_conv_pool_flatten_grads(rng):
    x = rng.standard_normal((2, 2, 5, 4))
    w = rng.standard_normal((3, 2, 3, 2)) * 0.5
    b = rng.standard_normal(3)
    check_grad(lambda x, w, b: F.conv2d(x, w, b, stride=(2, 1), padding=(1, 0)),
               lambda x, w, b: np_conv2d(x, w, b, (2, 1), (1, 0)), [x, w, b])
    conv = nn.Conv2d(2, 3, (3, 2), stride=(2, 1), padding=(1, 0))
    ref = np_conv2d(x, conv.weight.numpy(), conv.bias.numpy(), (2, 1), (1, 0))
    np.testing.assert_allclose(conv(wr.tensor(x.astype(np.float32))).numpy(), ref,
                               rtol=1e-4, atol=1e-5)
    xp = rng.permutation(2 * 2 * 4 * 4).reshape(2, 2, 4, 4) / 7.0  # distinct values: no ties

    def np_pool(x):
        return x.reshape(2, 2, 2, 2, 2, 2).max((3, 5))
    check_grad(lambda x: nn.MaxPool2d(2)(x), np_pool, [xp])
    check_grad(lambda x: nn.Flatten()(x), lambda x: x.reshape(2, -1), [xp])


def test_embedding_and_dropout(rng):
    emb = nn.Embedding(7, 3)
    idx = np.array([[0, 3, 3], [6, 1, 0]], np.int32)
    out = emb(wr.tensor(idx))
    W = emb.weight.numpy()
    np.testing.assert_array_equal(out.numpy(), W[idx])
    g = rng.standard_normal((2, 3, 3)).astype(np.float32)
    store = wr.autograd.backward_with_grad(out, wr.tensor(g))
    ref = np.zeros_like(W)
    np.add.at(ref, idx, g)
    np.testing.assert_allclose(store.get(emb.weight).numpy(), ref, rtol=1e-6, atol=1e-6)

    d = nn.Dropout(0.5)
    x = wr.ones(1000)
    y = d(x).numpy()
    assert set(np.unique(y)) <= {0.0, 2.0} and 0.35 < (y == 0).mean() < 0.65
    xg = wr.tensor(rng.uniform(1, 2, 1000).astype(np.float32), requires_grad=True)
    yg = d(xg)
    g = wr.autograd.backward(yg.sum()).get(xg).numpy()
    np.testing.assert_allclose(g, yg.numpy() / xg.numpy(), rtol=1e-6)  # the same mask * 2
    d.eval()
    np.testing.assert_array_equal(d(x).numpy(), np.ones(1000))
    with pytest.raises(ValueError):
        nn.Dropout(1.0)


@pytest.mark.parametrize("causal", [False, True])
def test_multihead_attention_matches_numpy_and_grad(rng, causal):
    E, H = 4, 2
    mha = nn.MultiheadAttention(E, H, causal=causal)
    assert set(mha.state_dict()) == {"in_proj_weight", "in_proj_bias", "out_proj.weight",
                                     "out_proj.bias"}
    x = rng.standard_normal((2, 3, E))
    w_in = rng.standard_normal((3 * E, E)) * 0.5
    b_in = rng.standard_normal(3 * E) * 0.1
    w_out = rng.standard_normal((E, E)) * 0.5
    b_out = rng.standard_normal(E) * 0.1

    def run(x, w_in, b_in, w_out, b_out):
        mha.load_state_dict({"in_proj_weight": w_in, "in_proj_bias": b_in,
                             "out_proj.weight": w_out, "out_proj.bias": b_out})
        return mha(x)
    # gradient w.r.t. the input through the module (parameters loaded from numpy)
    check_grad(lambda x: run(x, w_in.astype(np.float32), b_in.astype(np.float32),
                             w_out.astype(np.float32), b_out.astype(np.float32)),
               lambda x: np_mha(x, w_in, b_in, w_out, b_out, H, causal), [x])
    # gradient w.r.t. the parameters: compare the module's parameter grads with numerics
    xt = wr.tensor(x.astype(np.float32))
    y = mha(xt)
    wgt = rng.uniform(0.5, 1.5, y.shape)
    store = wr.autograd.backward((y * wr.tensor(wgt.astype(np.float32))).sum())
    from gradcheck import numeric_grad

    def f(w_in):
        return float((np_mha(x, w_in, b_in, w_out, b_out, H, causal) * wgt).sum())
    np.testing.assert_allclose(store.get(mha.in_proj_weight).numpy(),
                               numeric_grad(f, [w_in], 0), rtol=2e-2, atol=2e-3)


def test_causal_attention_ignores_the_future(rng):
    mha = nn.MultiheadAttention(8, 2, causal=True)
    x = rng.standard_normal((1, 5, 8)).astype(np.float32)
    y1 = mha(wr.tensor(x)).numpy()
    x[0, 3:] += 5.0
    y2 = mha(wr.tensor(x)).numpy()
    np.testing.assert_allclose(y1[0, :3], y2[0, :3], rtol=1e-5, atol=1e-5)
    assert not np.allclose(y1[0, 3:], y2[0, 3:])


def test_transformer_block_grad(rng):
    blk = nn.TransformerBlock(4, 2)
    sd = {k: v.numpy().astype(np.float64) for k, v in blk.state_dict().items()}
    x = rng.standard_normal((1, 3, 4))

    def ref(x):
        h = x + np_mha(np_layer_norm(x, sd["ln1.weight"], sd["ln1.bias"]),
                       sd["attn.in_proj_weight"], sd["attn.in_proj_bias"],
                       sd["attn.out_proj.weight"], sd["attn.out_proj.bias"], 2, True)
        u = np_layer_norm(h, sd["ln2.weight"], sd["ln2.bias"]) @ sd["mlp.fc.weight"].T \
            + sd["mlp.fc.bias"]
        u = 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * u ** 3)))
        return h + u @ sd["mlp.proj.weight"].T + sd["mlp.proj.bias"]
    check_grad(lambda x: blk(x), ref, [x])


def test_gpt_shapes_causality_and_generate(rng):
    wr.manual_seed(0)
    g = nn.GPT(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16)
    names = set(g.state_dict())
    assert {"wte.weight", "wpe.weight", "blocks.1.attn.in_proj_weight", "ln_f.weight",
            "lm_head.weight"} <= names
    idx = rng.integers(0, 11, (2, 6)).astype(np.int32)
    logits = g(wr.tensor(idx))
    assert logits.shape == (2, 6, 11)
    idx2 = idx.copy()
    idx2[:, 4:] = (idx2[:, 4:] + 1) % 11
    l2 = g(wr.tensor(idx2)).numpy()
    np.testing.assert_allclose(logits.numpy()[:, :4], l2[:, :4], rtol=1e-4, atol=1e-5)
    with pytest.raises(wr.ShapeError, match="block_size"):
        g(wr.tensor(np.zeros((1, 9), np.int32)))
    out1 = g.generate(idx[:, :3], 7, temperature=1.0, seed=5).numpy()
    out2 = g.generate(idx[:, :3], 7, temperature=1.0, seed=5).numpy()
    assert out1.shape == (2, 10) and (out1[:, :3] == idx[:, :3]).all()
    np.testing.assert_array_equal(out1, out2)
    assert out1.min() >= 0 and out1.max() < 11
    greedy = g.generate(idx[:, :3], 1, temperature=0).numpy()
    np.testing.assert_array_equal(greedy[:, 3], g(wr.tensor(idx[:, :3])).numpy()[:, -1].argmax(-1))
    assert g.training  # generate restores the mode
