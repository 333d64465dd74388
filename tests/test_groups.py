"""3D parallelism: config validation, Megatron rank layout, real DP/TP/PP subgroups."""
import numpy as np
import pytest

from wgrumus import distributed as dist
from wgrumus.distributed import (
    CollectiveError,
    ProcessGroupManager,
    RankMapping,
    ThreeDParallelismConfig,
)

CFG = ThreeDParallelismConfig(dp=2, tp=2, pp=2)


def test_config_validate():
    assert CFG.validate(8) is CFG and CFG.world_size == 8
    with pytest.raises(ValueError, match=r"2 \* 2 \* 2 = 8 does not match the world size 4"):
        CFG.validate(4)
    for bad in (dict(dp=0), dict(tp=-1), dict(pp=1.5), dict(dp=True)):
        with pytest.raises(ValueError):
            ThreeDParallelismConfig(**bad).validate()


def test_rank_mapping_puts_tp_ranks_adjacent():
    assert RankMapping.all_tp_groups(CFG) == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert RankMapping.all_dp_groups(CFG) == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert RankMapping.all_pp_groups(CFG) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    for r in range(8):
        m = RankMapping(CFG, r)
        assert RankMapping.from_3d_coords(CFG, m.dp_rank, m.tp_rank, m.pp_rank) == r
        assert r in m.dp_group_ranks() and r in m.tp_group_ranks() and r in m.pp_group_ranks()
    m = RankMapping(CFG, 6)
    assert (m.dp_rank, m.tp_rank, m.pp_rank) == (1, 0, 1) and m.is_last_stage
    with pytest.raises(ValueError):
        RankMapping(CFG, 8)


@pytest.mark.timeout(30)
def test_manager_builds_real_subgroups_and_their_collectives():
    def fn(g):
        pgm = ProcessGroupManager(CFG, g)
        m = pgm.mapping
        out = {"ranks": (pgm.dp_group.ranks, pgm.tp_group.ranks, pgm.pp_group.ranks),
               "local": (pgm.dp_group.rank, pgm.tp_group.rank, pgm.pp_group.rank),
               "sizes": (pgm.dp_group.world_size, pgm.tp_group.world_size,
                         pgm.pp_group.world_size),
               "distinct": len({id(g), id(pgm.dp_group), id(pgm.tp_group),
                                id(pgm.pp_group)}) == 4}
        x = np.array([float(g.rank)])
        out["dp"] = pgm.all_reduce_dp(x)  # mean over the DP slice only
        out["tp"] = pgm.all_reduce_tp(x)  # sum over the TP slice only
        out["tp_gather"] = pgm.all_gather_tp(np.array([[g.rank]]), axis=1)
        out["tp_rs"] = pgm.reduce_scatter_tp(np.arange(4.0) * (g.rank + 1))
        # pipeline: activations forward, gradients backward, between matching (dp, tp) slots
        if m.is_first_stage:
            pgm.send_to_next_stage(np.full(3, g.rank, np.float32), tag=1)
            out["grad"] = pgm.recv_from_next_stage(tag=2)
            with pytest.raises(ValueError, match="first pipeline stage"):
                pgm.send_to_prev_stage(x)
        else:
            act = pgm.recv_from_prev_stage(tag=1)
            out["act"] = act
            pgm.send_to_prev_stage(act * 10, tag=2)
        out["wire"] = pgm.stats()["pp"]["messages_sent"]
        return out

    res = dist.spawn(fn, 8, timeout=10)
    for r, o in enumerate(res):
        m = RankMapping(CFG, r)
        assert o["ranks"] == (tuple(m.dp_group_ranks()), tuple(m.tp_group_ranks()),
                              tuple(m.pp_group_ranks()))
        assert o["local"] == (m.dp_rank, m.tp_rank, m.pp_rank)
        assert o["sizes"] == (2, 2, 2) and o["distinct"]
        assert o["dp"][0] == np.mean(m.dp_group_ranks())
        assert o["tp"][0] == sum(m.tp_group_ranks())
        assert o["tp_gather"].tolist() == [m.tp_group_ranks()]
        scale = sum(q + 1 for q in m.tp_group_ranks())
        assert o["tp_rs"].tolist() == (np.arange(4.0) * scale)[2 * m.tp_rank:2 * m.tp_rank + 2]\
            .tolist()
        if m.is_first_stage:
            assert o["grad"].tolist() == [10.0 * r] * 3
        else:
            prev = RankMapping.from_3d_coords(CFG, m.dp_rank, m.tp_rank, 0)
            assert o["act"].tolist() == [prev] * 3 and o["act"].dtype == np.float32
        assert o["wire"] >= 1  # the message really went through the PP group


@pytest.mark.timeout(30)
def test_manager_rejects_wrong_world_size():
    with pytest.raises(ValueError, match="does not match the world size 4"):
        dist.spawn(lambda g: ProcessGroupManager(CFG, g), 4, timeout=5)


@pytest.mark.timeout(30)
def test_split_and_new_group():
    def fn(g):
        halves = g.split(g.rank % 2, key=-g.rank)  # reversed order inside each half
        solo = g.new_group([2])
        return (halves.ranks, halves.rank, halves.all_reduce(np.array([g.rank])).tolist(),
                solo is None or solo.world_size == 1)

    res = dist.spawn(fn, 4, timeout=5)
    assert res[0] == ((2, 0), 1, [2], True)
    assert res[3] == ((3, 1), 0, [4], True)


@pytest.mark.timeout(30)
def test_failure_in_one_subgroup_reaches_ranks_waiting_in_another():
    cfg = ThreeDParallelismConfig(dp=2, tp=2, pp=1)

    def fn(g):
        pgm = ProcessGroupManager(cfg, g)
        if g.rank == 3:
            raise ValueError("rank 3 crashed")
        # ranks 0, 1 wait in their DP/TP groups; ranks in 3's TP group (2) too
        pgm.all_reduce_tp(np.ones(4))
        pgm.all_reduce_dp(np.ones(4))

    with pytest.raises(ValueError, match="rank 3 crashed") as info:
        dist.spawn(fn, 4, timeout=2)
    notes = getattr(info.value, "__notes__", [])
    assert sum("CollectiveError" in n for n in notes) >= 1
    assert not any("still running" in n for n in notes)


@pytest.mark.timeout(30)
def test_subgroup_collectives_after_world_abort_raise():
    def fn(g):
        sub = g.split(0)
        g.abort(RuntimeError("stop"))
        with pytest.raises(CollectiveError):
            sub.barrier()
        return True

    assert dist.spawn(fn, 2, timeout=2) == [True, True]
