"""User mistakes (issue 10, item 2): each raises an error whose message names the problem and,
where there is one, the fix. Every ``match=`` checks both halves, so a vaguer message fails."""
import os
import pickle

import numpy as np
import pytest

import wgrumus as wr
import wgrumus.io as wio
from wgrumus import distributed as dist
from wgrumus import nn
from wgrumus.distributed import CollectiveError
from wgrumus.distributed.pipeline import (
    PipelineConfigError,
    PipelineExecutor,
    PipelineStage,
    get_schedule,
)
from wgrumus.runtime.errors import AdapterLimitError, DeviceMismatchError, ShapeError, WgrumusError

pytestmark = pytest.mark.timeout(60)


def t(a, dev, **kw):
    return wr.tensor(np.asarray(a, dtype=kw.pop("dtype", np.float32)), device=dev, **kw)


# ------------------------------------------------------------------------------- shapes
def test_matmul_inner_dimensions(dev):
    with pytest.raises(ShapeError, match=r"matmul: inner dimensions differ: \(2, 3\) @ \(4, 5\)"):
        t(np.ones((2, 3)), dev) @ t(np.ones((4, 5)), dev)


def test_broadcast_incompatible(dev):
    with pytest.raises(ShapeError, match=r"\(2, 3\) and \(4, 5\) cannot be broadcast.*dimension"):
        t(np.ones((2, 3)), dev) + t(np.ones((4, 5)), dev)


def test_reshape_wrong_element_count(dev):
    with pytest.raises(ShapeError, match=r"cannot reshape a tensor of 6 elements to \(4, 2\)"):
        t(np.ones((2, 3)), dev).reshape(4, 2)


def test_permute_not_a_permutation(dev):
    with pytest.raises(ShapeError, match=r"\(0, 0\) is not a permutation of the 2 axes"):
        t(np.ones((2, 3)), dev).permute(0, 0)


def test_axis_out_of_range(dev):
    with pytest.raises(ShapeError, match="axis 3 is out of range for a tensor with 2 dim"):
        t(np.ones((2, 3)), dev).sum(axis=3)


def test_cat_and_stack_mismatch(dev):
    a, b = t(np.ones((2, 3)), dev), t(np.ones((4, 5)), dev)
    with pytest.raises(ShapeError, match=r"cat: shapes \(2, 3\), \(4, 5\) differ outside axis 0"):
        wr.cat([a, b], 0)
    with pytest.raises(ShapeError, match="cat needs at least one tensor"):
        wr.cat([], 0)
    with pytest.raises(ShapeError, match="stack: all tensors need the same shape"):
        wr.stack([a, b], 0)


def test_negative_dimension(dev):
    with pytest.raises(ShapeError, match=r"negative dimension in shape \(-1, 3\)"):
        wr.randn((-1, 3), device=dev)


def test_item_of_many_elements(dev):
    with pytest.raises(ShapeError, match=r"item\(\) needs a tensor with one element, got shape"):
        wr.zeros((3,), device=dev).item()


def test_linear_wrong_in_features(dev):
    with pytest.raises(ShapeError, match=r"input \(2, 3\) does not match weight \(2, 4\).*"
                                         r"last dim must be 4|inner dimensions differ"):
        nn.Linear(4, 2, device=dev)(t(np.ones((2, 3)), dev))


def test_conv2d_needs_nchw(dev):
    with pytest.raises(ShapeError, match="input must be NCHW with C = weight.shape"):
        nn.Conv2d(3, 4, 3, device=dev)(t(np.ones((2, 3)), dev))


def test_layernorm_normalized_shape(dev):
    with pytest.raises(ShapeError, match=r"normalized_shape \(5,\) does not match the trailing"):
        nn.LayerNorm(5, device=dev)(wr.zeros((2, 3), device=dev))


def test_cross_entropy_targets_shape_and_dtype(dev):
    logits = t(np.ones((2, 3)), dev)
    with pytest.raises(ShapeError, match=r"targets shape \(3,\).*\(expected \(2,\)\)"):
        nn.functional.cross_entropy(logits, t([0, 1, 2], dev, dtype=np.int32))
    with pytest.raises(ShapeError, match=r"target shape \(2, 2\) differs from input shape"):
        nn.functional.cross_entropy(logits, logits[:, :2])  # probabilities: the logits' shape


def test_embedding_float_indices(dev):
    with pytest.raises(WgrumusError, match=r"indices must be an int32 tensor.*\.int\(\)"):
        nn.Embedding(5, 3, device=dev)(t(np.ones((2, 3)), dev))


# ------------------------------------------------------------------------------- dtypes
def test_unsupported_numpy_dtype(dev):
    with pytest.raises(WgrumusError, match=r"numpy dtype complex64.*convert first"):
        wr.tensor(np.ones(3, np.complex64), device=dev)
    with pytest.raises(WgrumusError, match=r"numpy dtype <U1.*float32, float16 or int32"):
        wr.tensor(np.array(["a"]), device=dev)


def test_int_tensor_cannot_require_grad(dev):
    with pytest.raises(WgrumusError, match="only float32 tensors can require grad.*int32"):
        wr.tensor(np.ones(2, np.int32), device=dev, requires_grad=True)


def test_collective_mean_of_integers():
    with pytest.raises(TypeError, match="op='mean' needs a floating dtype.*use op='sum'"):
        dist.CollectiveBarrier(1).reduce(np.ones(2, np.int32), "mean")


# ------------------------------------------------------------------------------- devices
def test_mixing_devices_elementwise_and_matmul(devs):
    a, b = t(np.ones((2, 3)), devs[0]), t(np.ones((2, 3)), devs[1])
    with pytest.raises(DeviceMismatchError, match=r"different devices.*\.to\(device\) first"):
        a + b
    with pytest.raises(DeviceMismatchError, match=r"tensors are on different devices.*"
                                                  r"\.to\(device\) first"):
        nn.Linear(3, 2, device=devs[0])(b)


def test_device_index_out_of_range(dev):
    with pytest.raises(WgrumusError, match="device index 99 out of range.*WGRUMUS_DEVICES"):
        wr.zeros((2,), device=dev).to(99)


def test_comm_thread_serves_one_device(devs):
    with dist.CommThread(devs[0]) as comm:
        with pytest.raises(ValueError, match="buffer lives on .* this comm thread serves"):
            dist.async_allreduce(comm, wr.zeros((2,), device=devs[1]), dist.CollectiveBarrier(2))


def test_buffer_slice_misaligned(dev):
    with pytest.raises(ValueError, match="multiples of 4 bytes"):
        dist.BufferSlice(dev, None, 2, 4, np.float32)


# ------------------------------------------------------------------------------- empty tensors
def test_reductions_of_empty_tensors(dev):
    e = wr.tensor(np.zeros((0, 3), np.float32), device=dev)
    with pytest.raises(ShapeError, match="max of an empty axis .* has no identity"):
        e.max()
    with pytest.raises(ShapeError, match=r"argmax/argmin of an empty axis \(shape \(0,\)\)"):
        wr.tensor(np.zeros((0,), np.float32), device=dev).argmax()


def test_optimizer_with_no_parameters():
    with pytest.raises(ValueError, match="optimizer got an empty parameter list"):
        wr.optim.SGD([], lr=0.1)


# ------------------------------------------------------------------------------- autograd / NaN
def test_backward_of_non_scalar(dev):
    x = t(np.ones(3), dev, requires_grad=True)
    with pytest.raises(ShapeError, match=r"reduce it \(e.g. .mean\(\)\) or use backward_with_grad"):
        wr.autograd.backward(x * 2.0)


def test_backward_without_grad(dev):
    with pytest.raises(WgrumusError, match="does not require grad .*no_grad"):
        t(np.ones(3), dev).sum().backward()


def test_nan_gradient_detected_by_clip_grad_norm(dev):
    """The one NaN-detecting mode: clip_grad_norm_(error_if_nonfinite=True)."""
    p = t(np.ones(3), dev, requires_grad=True)
    p.grad = t([np.nan, 1.0, 1.0], dev)
    with pytest.raises(WgrumusError, match="norm is nan.*error_if_nonfinite=False"):
        wr.optim.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


def test_optimizer_hyperparameters(dev):
    ps = nn.Linear(2, 2, device=dev).parameters()
    with pytest.raises(ValueError, match="SGD: lr, momentum and weight_decay must be >= 0"):
        wr.optim.SGD(ps, lr=-1)
    with pytest.raises(ValueError, match=r"Adam: invalid hyperparameters.*betas=\(1.5, 0.9\)"):
        wr.optim.Adam(ps, lr=0.1, betas=(1.5, 0.9))


# ------------------------------------------------------------------------------- adapter limits
def test_allocation_beyond_max_binding(dev):
    too_big = dev.max_binding // 4 + 1024
    with pytest.raises(AdapterLimitError, match="exceeds this adapter's largest storage buffer"
                                                 ".*split the tensor"):
        wr.zeros((too_big,), device=dev)


# ------------------------------------------------------------------------------- layouts
def test_3d_layout_does_not_match_world():
    with pytest.raises(ValueError, match=r"2 \* 2 \* 2 = 8 does not match the world size 4; "
                                         "choose sizes whose product is 4"):
        dist.ThreeDParallelismConfig(2, 2, 2).validate(4)
    with pytest.raises(ValueError, match="dp must be an int >= 1, got 0"):
        dist.ThreeDParallelismConfig(0, 2, 2).validate()


def test_process_group_manager_layout_vs_ranks(devs):
    with pytest.raises(ValueError, match="does not match the world size 2"):
        dist.spawn(lambda g: dist.ProcessGroupManager(dist.ThreeDParallelismConfig(2, 2, 1), g),
                   2, devices=devs[:2], timeout=5)


def test_spawn_arguments(devs):
    with pytest.raises(ValueError, match="3 ranks need 3 devices, got 2"):
        dist.spawn(lambda g: 0, 3, devices=devs[:2])
    with pytest.raises(ValueError,
                       match="unknown backend 'nccl'; use one of threads, processes, mpi"):
        dist.spawn(lambda g: 0, 2, backend="nccl")
    with pytest.raises(ValueError, match="world_size must be an int >= 1"):
        dist.spawn(lambda g: 0, 0)


def test_collective_with_mismatched_shapes_across_ranks(devs):
    with pytest.raises(CollectiveError, match=r"rank 1 passed shape \(2,\).*others shape \(1,\)"):
        dist.spawn(lambda g: g.all_reduce(np.ones(g.rank + 1)), 2, timeout=5)


def test_send_to_a_rank_outside_the_group():
    with pytest.raises(ValueError, match=r"dst must be a rank in \[0, 2\), got 5"):
        dist.spawn(lambda g: g.send(np.ones(2), 5), 2, timeout=5)


def test_barrier_arguments():
    with pytest.raises(ValueError, match="unknown reduce op 'avg'; use one of sum, mean"):
        dist.CollectiveBarrier(1).reduce(np.ones(2), "avg")
    with pytest.raises(ValueError, match="world_size must be >= 1"):
        dist.CollectiveBarrier(0)


def test_tensor_parallel_size_not_divisible(devs):
    def fn(g):
        dist.ColumnParallelLinear(4, 5, g)
    with pytest.raises(ShapeError, match=r"size 5 cannot be split evenly across 2 tensor-"
                                         r"parallel ranks; choose a tp that divides 5"):
        dist.spawn(fn, 2, devices=devs[:2], timeout=10)


def test_fsdp_without_device():
    with pytest.raises(ValueError, match=r"FSDP needs a device: pass device= .*devices="):
        dist.spawn(lambda g: dist.FSDP(nn.Linear(2, 2), g), 2, timeout=5)


def test_data_parallel_layout_mistakes(devs):
    x, y = np.ones((4, 2), np.float32), np.ones((4, 2), np.float32)
    sgd = lambda ps: wr.optim.SGD(ps, lr=0.1)  # noqa: E731
    with pytest.raises(ValueError, match="each device may hold only one replica"):
        wr.parallel.DataParallel(nn.Linear(2, 2, device=devs[0]), [devs[0], devs[0]])
    with wr.parallel.DataParallel(nn.Linear(2, 2, device=devs[0]), devs[:4], timeout=20) as dp:
        with pytest.raises(ValueError, match="a batch of 2 sample.* cannot be split over 4 "
                                             "replicas.*use a global batch of at least 4"):
            dp.train_step(x[:2], y[:2], nn.functional.mse_loss, sgd)
        with pytest.raises(ValueError, match="4 inputs but 3 targets"):
            dp.train_step(x, y[:3], nn.functional.mse_loss, sgd)
        with pytest.raises(ValueError, match=r"one optimizer per local replica \(4\), got 3"):
            dp.train_step(x, y, nn.functional.mse_loss,
                          [wr.optim.SGD(dp.replicas[k].parameters(), lr=0.1) for k in range(3)])
        with pytest.raises(WgrumusError, match=r"loss_fn must return one value \(the mean"):
            dp.train_step(x, y, lambda o, t: o - t, sgd)
        # the wrapper still trains after every mistake
        assert np.isfinite(dp.train_step(x, y, nn.functional.mse_loss, sgd))


# ------------------------------------------------------------------------------- pipeline
def _stages(devs, n=2):
    return [PipelineStage(nn.Linear(2, 2, device=devs[1 + k], seed=k), devs[1 + k])
            for k in range(n)]


def test_pipeline_schedule_micro_batch_mismatch(devs):
    with pytest.raises(PipelineConfigError, match="schedule is for 2 micro-batches but the "
                                                  "executor was built with num_micro_batches=4"):
        PipelineExecutor(_stages(devs), 4, schedule=get_schedule("1f1b", 2, 2))


def test_pipeline_batch_not_divisible(devs):
    ex = PipelineExecutor(_stages(devs), 4)
    with pytest.raises(PipelineConfigError, match="batch size 6 .* not divisible by "
                                                  "num_micro_batches=4"):
        ex.run(np.ones((6, 2), np.float32), np.ones((6, 2), np.float32), nn.functional.mse_loss)


def test_pipeline_configuration_mistakes(devs):
    with pytest.raises(PipelineConfigError, match=r"not a PipelineStage; wrap it: "
                                                  r"PipelineStage\(module, device\)"):
        PipelineExecutor([nn.Linear(2, 2)], 4)
    with pytest.raises(PipelineConfigError, match="num_micro_batches must be an int >= 1"):
        PipelineExecutor(_stages(devs), 0)
    with pytest.raises(Exception, match=r"unknown pipeline schedule 'foo'; choose one of"):
        get_schedule("foo", 2, 4)
    with pytest.raises(PipelineConfigError, match="multiple of 2"):
        PipelineExecutor(_stages(devs, 3), 4, schedule="interleaved")


# ------------------------------------------------------------------------------- checkpoints
@pytest.fixture
def saved(tmp_path, dev):
    m = nn.Linear(3, 2, device=dev, seed=0)
    path = tmp_path / "ck.safetensors"
    wio.save_checkpoint(path, m, wr.optim.SGD(m.parameters(), lr=0.1), step=3)
    return path


def test_checkpoint_of_another_model(saved, dev):
    with pytest.raises(nn.StateDictError, match=r"shape mismatch for weight: checkpoint has "
                                                r"shape \(2, 3\).*Build the module with the sizes"):
        wio.load_checkpoint(saved, nn.Linear(5, 2, device=dev))
    with pytest.raises(nn.StateDictError, match=r"missing keys.*0\.weight.*unexpected keys.*"
                                                r"strict=False"):
        wio.load_checkpoint(saved, nn.Sequential(nn.Linear(3, 2, device=dev)))


def test_plain_weights_file_is_not_a_training_checkpoint(tmp_path, dev):
    m = nn.Linear(3, 2, device=dev)
    wr.save(m.state_dict(), tmp_path / "w.safetensors")
    with pytest.raises(wio.CheckpointError, match=r"not a wgrumus training checkpoint; load "
                                                  r"weights with model.load_state_dict"):
        wio.load_checkpoint(tmp_path / "w.safetensors", m)


def test_truncated_and_corrupt_files(saved, tmp_path):
    data = saved.read_bytes()
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(data[:len(data) - 5])
    with pytest.raises(wio.CheckpointError, match="not a valid safetensors file"):
        wr.load(cut)
    cut.write_bytes(data[:20])
    with pytest.raises(wio.CheckpointError, match="truncated or corrupt"):
        wr.load(cut)
    bad = bytearray(data)
    bad[10] = 1
    cut.write_bytes(bytes(bad))
    with pytest.raises(wio.CheckpointError, match="not a valid safetensors file, truncated or "
                                                  "corrupt .*restore it from a copy"):
        wr.load(cut)
    cut.write_bytes(b"abc")
    with pytest.raises(wio.CheckpointError, match="not a safetensors file: only 3 bytes"):
        wr.load(cut)


def test_pickle_file_is_rejected(tmp_path):
    p = tmp_path / "evil.safetensors"
    p.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(wio.CheckpointError, match="not a valid safetensors file"):
        wr.load(p)


def test_unwritable_paths(tmp_path, dev):
    sd = nn.Linear(3, 2, device=dev).state_dict()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    with pytest.raises(wio.CheckpointWriteError, match="cannot write checkpoint .*writable folder"):
        wr.save(sd, blocker / "ck.safetensors")
    with pytest.raises(OSError, match="cannot write checkpoint"):  # still an OSError
        wr.save(sd, "/proc/no/such/ck.safetensors")
    with pytest.raises(wio.CheckpointWriteError, match="it is a folder; pass a file path"):
        wr.save(sd, tmp_path)
    with pytest.raises(wio.CheckpointError, match="is a folder, not a file"):
        wr.load(tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        wr.load(tmp_path / "missing.safetensors")
    assert sorted(os.listdir(tmp_path)) == ["a_file"]  # no temporary left behind


def test_state_dict_values_and_keys(tmp_path):
    with pytest.raises(wio.CheckpointError, match="type str: values must be tensors or numpy"):
        wr.save({"a": "str"}, tmp_path / "x.safetensors")
    with pytest.raises(wio.CheckpointError, match="keys must be strings, got 1"):
        wr.save({1: np.ones(2)}, tmp_path / "x.safetensors")


def test_load_state_dict_missing_keys(dev):
    with pytest.raises(nn.StateDictError, match="missing keys .*weight, bias.*strict=False"):
        nn.Linear(2, 2, device=dev).load_state_dict({})


# ------------------------------------------------------------------------------- data / CLI
def test_data_loader_batch_size():
    with pytest.raises(ValueError, match="batch_size must be positive, got 0"):
        wr.data.DataLoader(None, batch_size=0)


CLI_MISTAKES = [
    (["train", "nosuchmodel"], "unknown model 'nosuchmodel'; choose one of: mlp, cnn, gpt"),
    (["train", "mlp", "--steps", "-1"], "--steps: must be > 0, got -1"),
    (["train", "mlp", "--dp", "0"], "--dp: must be > 0, got 0"),
    (["train", "mlp", "--tp", "2"], "--tp 2: tensor parallelism .*use --dp/--pp for mlp"),
    (["train", "gpt", "--tp", "3"], "--n-head 4 is not divisible by --tp 3"),
    (["train", "mlp", "--pp", "2", "--micro-batches", "3", "--batch-size", "8"],
     "--batch-size 8 must split evenly into .* 3 micro-batches"),
    (["train", "mlp", "--resume"], "--resume needs --checkpoint DIR"),
    (["train", "mlp", "--dp", "64"], "64 devices needed, but this process has .*--devices 64"),
    (["bench", "--bogus"], "unrecognized arguments: --bogus"),
    (["train", "mlp", "--checkpoint", "/proc/forbidden", "--steps", "2"],
     "--checkpoint '/proc/forbidden' is not a writable directory"),
]


@pytest.mark.parametrize("argv,message", CLI_MISTAKES, ids=[" ".join(a) for a, _ in CLI_MISTAKES])
def test_cli_wrong_arguments_exit_2(argv, message, capsys):
    from wgrumus.cli import main
    try:
        rc = main(argv)
    except SystemExit as e:
        rc = e.code
    err = capsys.readouterr().err
    assert rc == 2, err
    import re
    assert re.search(message, " ".join(err.split())), err
    assert "Traceback" not in err
