"""Pipeline schedules as data: action lists, validation, simulation and the ASCII chart.

Nothing here needs a GPU, tensors or autograd: schedules are plain data and are checked before
anything runs. Run with ``-s`` to see the printed action lists and charts.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from wgrumus.distributed.pipeline import (
    BI,
    BW,
    Action,
    B,
    F,
    Schedule,
    ScheduleError,
    get_schedule,
    gpipe,
    interleaved,
    make_schedule,
    one_f_one_b,
    parse_actions,
    peak_in_flight,
    render,
    simulate,
    validate,
    zb_h1,
)

PS = (2, 3, 4)
MS = (1, 4, 8)
GRID = list(itertools.product(PS, MS))


def strings(sched: Schedule) -> list[str]:
    return [" ".join(stage) for stage in sched.to_strings()]


# ---------------------------------------------------------------------------------------------
# an independent checker: dependency graph + topological sort (not the simulator under test)
# ---------------------------------------------------------------------------------------------


def _graph(sched: Schedule):
    """Nodes are (stage, position); edges are program order plus cross-action dependencies."""
    p, v = sched.num_stages, sched.num_chunks
    V = p * v
    where = {}
    for s, acts in enumerate(sched):
        for i, a in enumerate(acts):
            vs = a.chunk * p + s
            where[(a.kind, a.mb, vs)] = (s, i)
    edges = []
    for s, acts in enumerate(sched):
        for i, a in enumerate(acts):
            node = (s, i)
            if i:
                edges.append(((s, i - 1), node))
            vs = a.chunk * p + s
            deps = []
            if a.kind == "F" and vs > 0:
                deps.append([("F", a.mb, vs - 1)])
            if a.kind in ("B", "BI"):
                deps.append([("F", a.mb, vs)])
                if vs < V - 1:
                    deps.append([("B", a.mb, vs + 1), ("BI", a.mb, vs + 1)])
            if a.kind == "BW":
                deps.append([("BI", a.mb, vs)])
            for alternatives in deps:
                src = [where[k] for k in alternatives if k in where]
                assert src, f"dependency {alternatives} of {a!r} on stage {s} does not exist"
                edges.append((src[0], node))
    return where, edges


def has_cycle(sched: Schedule) -> bool:
    _, edges = _graph(sched)
    nodes = {(s, i) for s, acts in enumerate(sched) for i in range(len(acts))}
    indeg = {n: 0 for n in nodes}
    out = {n: [] for n in nodes}
    for a, b in edges:
        indeg[b] += 1
        out[a].append(b)
    ready = [n for n in nodes if indeg[n] == 0]
    seen = 0
    while ready:
        n = ready.pop()
        seen += 1
        for b in out[n]:
            indeg[b] -= 1
            if indeg[b] == 0:
                ready.append(b)
    return seen != len(nodes)


def check_timeline(res) -> None:
    """Every action starts after its stage's previous action and after all its dependencies."""
    sched = res.schedule
    _, edges = _graph(sched)
    slot = {(s, i): sl for s, tl in enumerate(res.timelines) for i, sl in enumerate(tl)}
    for s, tl in enumerate(res.timelines):
        assert [sl.action for sl in tl] == list(sched[s]), "timeline must follow the list order"
    for a, b in edges:
        gap = res.comm_time if a[0] != b[0] else 0
        assert slot[b].start >= slot[a].end + gap - 1e-9, (slot[a], slot[b])


# ---------------------------------------------------------------------------------------------
# actions
# ---------------------------------------------------------------------------------------------


def test_action_repr_parse_and_frozen():
    assert repr(F(0)) == "F0" and repr(B(3)) == "B3" and repr(F(2, 1)) == "F2.1"
    assert repr(BI(2)) == "BI2" and repr(BW(11, 3)) == "BW11.3"
    for text in ("F0", "B3", "F2.1", "BI7", "BW0.2"):
        assert repr(Action.parse(text)) == text
    assert parse_actions("F0 F1 B0, B1") == (F(0), F(1), B(0), B(1))
    assert Action("F", 2) == F(2) and hash(Action("B", 1, 1)) == hash(B(1, 1))
    with pytest.raises(dataclasses.FrozenInstanceError):
        F(0).mb = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="unknown action kind 'X'"):
        Action("X", 0)
    with pytest.raises(ValueError, match="micro-batch index must be an int >= 0"):
        Action("F", -1)
    with pytest.raises(ValueError, match="cannot parse action 'G1'"):
        Action.parse("G1")


# ---------------------------------------------------------------------------------------------
# exact action lists
# ---------------------------------------------------------------------------------------------


def test_gpipe_lists():
    assert strings(gpipe(2, 1)) == ["F0 B0", "F0 B0"]
    assert strings(gpipe(3, 4)) == ["F0 F1 F2 F3 B0 B1 B2 B3"] * 3


def test_1f1b_lists():
    assert strings(one_f_one_b(2, 1)) == ["F0 B0", "F0 B0"]
    assert strings(one_f_one_b(2, 4)) == [
        "F0 F1 B0 F2 B1 F3 B2 B3",
        "F0 B0 F1 B1 F2 B2 F3 B3",
    ]
    assert strings(one_f_one_b(4, 8)) == [
        "F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7",
        "F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7",
        "F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7",
        "F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7",
    ]
    # fewer micro-batches than stages: warm-up is capped at m
    assert strings(one_f_one_b(4, 1)) == ["F0 B0"] * 4
    assert strings(one_f_one_b(3, 2))[0] == "F0 F1 B0 B1"


def test_interleaved_lists_follow_megatron_order():
    # p=2, v=2, m=4: forwards in groups of p per chunk, backwards with the chunks reversed;
    # warm-up on stage s is (p-1-s)*2 + (v-1)*p.
    assert strings(interleaved(2, 4, 2)) == [
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3",
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3",
    ]


def test_zb_h1_lists():
    # stage s postpones each BW by s steps; the postponed ones close the cool-down
    assert strings(zb_h1(2, 4)) == [
        "F0 F1 BI0 BW0 F2 BI1 BW1 F3 BI2 BW2 BI3 BW3",
        "F0 BI0 F1 BI1 BW0 F2 BI2 BW1 F3 BI3 BW2 BW3",
    ]
    assert strings(zb_h1(3, 4))[2] == "F0 BI0 F1 BI1 F2 BI2 BW0 F3 BI3 BW1 BW2 BW3"


@pytest.mark.parametrize("p,m", GRID)
def test_print_and_check_grid(p, m, capsys):
    """Print every schedule for p in {2,3,4}, m in {1,4,8} and check its structure."""
    built = {"gpipe": gpipe(p, m), "1f1b": one_f_one_b(p, m), "zb-h1": zb_h1(p, m)}
    if m % p == 0:
        built["interleaved"] = interleaved(p, m, 2)
    with capsys.disabled():
        print(f"\n--- p={p} m={m} ---")
        for name, sched in built.items():
            print(f"[{name}]\n{sched}")
    for sched in built.values():
        assert validate(sched) is sched
        assert not has_cycle(sched)
        assert (sched.num_stages, sched.num_microbatches) == (p, m)
        v = sched.num_chunks
        for acts in sched:
            fwd = [a for a in acts if a.kind == "F"]
            assert sorted((a.chunk, a.mb) for a in fwd) == [(c, i) for c in range(v)
                                                            for i in range(m)]

    for acts in built["gpipe"]:
        assert list(acts) == [F(i) for i in range(m)] + [B(i) for i in range(m)]

    for s, acts in enumerate(built["1f1b"]):
        w = min(p - 1 - s, m)
        kinds = "".join(a.kind for a in acts)
        # warm-up forwards, then strict F/B alternation, then the remaining backwards
        assert kinds == "F" * w + "FB" * (m - w) + "B" * w, (s, kinds)
        assert [a.mb for a in acts if a.kind == "F"] == list(range(m))
        assert [a.mb for a in acts if a.kind == "B"] == list(range(m))

    for s, acts in enumerate(built["zb-h1"]):
        assert [a for a in acts if a.kind == "BI"] == [BI(i) for i in range(m)]
        assert [a for a in acts if a.kind == "BW"] == [BW(i) for i in range(m)]
        # replacing BI by B and dropping BW gives back exactly the 1F1B list
        as_1f1b = [B(a.mb) if a.kind == "BI" else a for a in acts if a.kind != "BW"]
        assert as_1f1b == list(built["1f1b"][s])


# ---------------------------------------------------------------------------------------------
# memory: peak in-flight micro-batches
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("p,m", GRID)
def test_peak_in_flight(p, m):
    assert simulate(one_f_one_b(p, m)).peak_in_flight[0] == min(p, m)
    assert peak_in_flight(one_f_one_b(p, m)) == tuple(min(p - s, m) for s in range(p))
    assert peak_in_flight(gpipe(p, m)) == (m,) * p
    # ZB-H1 never holds more than 1F1B's stage 0 does
    assert peak_in_flight(zb_h1(p, m)) == (min(p, m),) * p
    if m % p == 0:
        for v in (2, 3):
            expected = tuple(min(2 * (p - 1 - s) + (v - 1) * p + 1, v * m) for s in range(p))
            assert peak_in_flight(interleaved(p, m, v)) == expected


# ---------------------------------------------------------------------------------------------
# time: bubble fractions
# ---------------------------------------------------------------------------------------------


def test_hand_timed_1f1b():
    """p=2, m=2, f=1, b=2 worked out by hand."""
    res = simulate(one_f_one_b(2, 2), f_time=1, b_time=2)
    got = [[(repr(sl.action), sl.start, sl.end) for sl in tl] for tl in res.timelines]
    assert got == [
        [("F0", 0, 1), ("F1", 1, 2), ("B0", 4, 6), ("B1", 7, 9)],
        [("F0", 1, 2), ("B0", 2, 4), ("F1", 4, 5), ("B1", 5, 7)],
    ]
    assert res.makespan == 9
    assert res.busy == (6, 6)
    assert res.bubble_fraction == pytest.approx(1 / 3)


def test_comm_time_delays_every_hop():
    res = simulate(one_f_one_b(2, 1), f_time=1, b_time=2, comm_time=0.5)
    check_timeline(res)
    # F0 on s0, hop, F0 on s1, B0 on s1, hop, B0 on s0
    assert res.makespan == 1 + 0.5 + 1 + 2 + 0.5 + 2


@pytest.mark.parametrize("p,m", GRID + [(5, 3), (3, 16)])
@pytest.mark.parametrize("f,b", [(1, 1), (1, 2), (1, 3), (2, 1)])
def test_gpipe_and_1f1b_bubble_formula_is_exact(p, m, f, b):
    """With comm_time=0 both bubbles equal (p-1)/(m+p-1) for any b/f ratio, not only f=b."""
    expected = (p - 1) / (m + p - 1)
    for sched in (gpipe(p, m), one_f_one_b(p, m)):
        res = simulate(sched, f_time=f, b_time=b)
        check_timeline(res)
        assert res.makespan == pytest.approx((m + p - 1) * (f + b))
        assert res.bubble_fraction == pytest.approx(expected)
        # every stage idles the same (p-1)(f+b)
        for s in range(p):
            assert res.idle(s) == pytest.approx((p - 1) * (f + b))


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8), (3, 3), (3, 9), (5, 10)])
@pytest.mark.parametrize("v", [2, 3, 4])
@pytest.mark.parametrize("f,b", [(1, 1), (1, 2)])
def test_interleaved_bubble_formula(p, m, v, f, b):
    res = simulate(interleaved(p, m, v), f_time=f, b_time=b)
    check_timeline(res)
    assert res.bubble_fraction == pytest.approx((p - 1) / (v * m + p - 1))
    assert res.bubble_fraction < simulate(one_f_one_b(p, m), f, b).bubble_fraction


@pytest.mark.parametrize("p,m", [(2, 2), (2, 8), (3, 4), (4, 4), (4, 8), (4, 16), (5, 7)])
def test_zb_h1_bubble(p, m):
    # f = bi = bw (the paper's setting): a third of 1F1B's idle time
    res = simulate(zb_h1(p, m), f_time=1, b_time=2)
    check_timeline(res)
    assert res.bubble_fraction == pytest.approx((p - 1) / (3 * m + p - 1))
    ref = simulate(one_f_one_b(p, m), f_time=1, b_time=2)
    for s in range(p):
        assert res.idle(s) == pytest.approx(ref.idle(s) / 3)
    # more generally each stage idles (p-1)(f+bi-bw) when bw <= min(f, bi)
    for f, bi, bw in [(2, 1, 1), (1, 2, 1), (3, 2, 1), (1.5, 1, 0.5)]:
        r = simulate(zb_h1(p, m), f_time=f, b_time=bi + bw, bi_time=bi, bw_time=bw)
        check_timeline(r)
        for s in range(p):
            assert r.idle(s) == pytest.approx((p - 1) * (f + bi - bw))


def test_zb_h1_with_few_microbatches_is_still_valid():
    for p, m in [(4, 1), (4, 2), (4, 3)]:
        res = simulate(zb_h1(p, m))
        check_timeline(res)
        assert res.bubble_fraction <= simulate(one_f_one_b(p, m)).bubble_fraction + 1e-12


def test_split_durations_default_to_half_of_b():
    res = simulate(zb_h1(2, 2), f_time=1, b_time=3)
    assert (res.bi_time, res.bw_time) == (1.5, 1.5)
    res = simulate(zb_h1(2, 2), f_time=1, b_time=3, bi_time=2)
    assert res.bw_time == 1
    with pytest.raises(ValueError, match="duration of BW actions must be > 0"):
        simulate(zb_h1(2, 2), f_time=1, b_time=2, bi_time=2)


# ---------------------------------------------------------------------------------------------
# validate(): broken lists are rejected with clear messages
# ---------------------------------------------------------------------------------------------


def test_validate_accepts_raw_lists_and_strings():
    sched = validate([["F0", "F1", "B0", "B1"], [F(0), B(0), F(1), B(1)]])
    assert isinstance(sched, Schedule)
    assert sched.num_stages == 2 and sched.num_microbatches == 2
    # a valid order that no builder produces (backwards in reverse order)
    validate(["F0 F1 B1 B0", "F0 F1 B1 B0"])


def test_validate_rejects_backward_before_forward():
    with pytest.raises(ScheduleError, match=r"stage 0: B0 \(position 0\) comes before its "
                                             r"forward F0 \(position 1\)"):
        validate([["B0", "F0"], ["F0", "B0"]])
    with pytest.raises(ValueError, match=r"stage 1: BW0 \(position 1\) comes before BI0"):
        validate([["F0", "BI0", "BW0"], ["F0", "BW0", "BI0"]])


def test_validate_rejects_missing_and_duplicate_microbatches():
    with pytest.raises(ScheduleError, match="stage 1: missing micro-batch 1"):
        validate([["F0", "F1", "B0", "B1"], ["F0", "B0"]])
    with pytest.raises(ScheduleError,
                       match=r"stage 0: missing backward for F1 \(need B1, or BI1 and BW1\)"):
        validate([["F0", "F1", "B0"], ["F0", "B0", "F1", "B1"]])
    # a micro-batch missing on every stage is only visible when m is known
    with pytest.raises(ScheduleError, match="stage 0: missing micro-batch 2"):
        validate([["F0", "F1", "B0", "B1"]] * 2, num_microbatches=3)
    with pytest.raises(ScheduleError, match="stage 1: F0 appears 2 times"):
        validate([["F0", "B0"], ["F0", "F0", "B0"]])
    with pytest.raises(ScheduleError, match="has both a full backward B0 and BI0"):
        validate([["F0", "B0", "BI0"], ["F0", "B0"]])
    with pytest.raises(ScheduleError, match="stage 0: BI0 without BW0"):
        validate([["F0", "BI0"], ["F0", "B0"]])
    with pytest.raises(ScheduleError,
                       match=r"F5 \(position 1\) refers to micro-batch 5, but there are only m=2"):
        validate([["F0", "F5", "B0"], ["F0", "B0"]], num_microbatches=2)


@pytest.mark.timeout(10)
def test_validate_detects_deadlock_cycle():
    # stage 0 wants B0 before it has sent F1; stage 1 wants F1 before it sends B0
    with pytest.raises(ScheduleError) as err:
        validate([["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]])
    msg = str(err.value)
    assert "deadlock" in msg
    assert "wait cycle stage 0 -> stage 1 -> stage 0" in msg
    assert "stage 0 is blocked at B0 (position 1) waiting for B0/BI0 on stage 1" in msg
    assert "stage 1 is blocked at F1 (position 0) waiting for F1 on stage 0" in msg


@pytest.mark.timeout(10)
def test_validate_detects_three_stage_and_chunk_deadlocks():
    # no warm-up anywhere, and the last stage swaps its forwards: stages 1 and 2 wait on each
    # other, stage 0 waits on stage 1
    bad = [["F0", "B0", "F1", "B1"], ["F0", "B0", "F1", "B1"], ["F1", "F0", "B0", "B1"]]
    with pytest.raises(ScheduleError) as err:
        validate(bad)
    msg = str(err.value)
    assert "wait cycle stage 1 -> stage 2 -> stage 1" in msg
    assert "stage 0 is blocked at B0 (position 1) waiting for B0/BI0 on stage 1" in msg
    # interleaved: stage 1 runs chunk 1 of mb 0 (virtual stage 3) before chunk 0 (virtual stage 1)
    good = [["F0", "F0.1", "B0.1", "B0"], ["F0", "F0.1", "B0.1", "B0"]]
    validate(good)
    with pytest.raises(ScheduleError, match=r"stage 1 is blocked at F0\.1 \(position 0\) "
                                             r"waiting for F0\.1 on stage 0 chunk 1"):
        validate([good[0], ["F0.1", "F0", "B0.1", "B0"]])


@pytest.mark.timeout(60)
@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 4), m=st.integers(1, 5), seed=st.integers(0, 2**31),
       kind=st.sampled_from(["1f1b", "zb-h1"]))
def test_validate_agrees_with_independent_cycle_check(p, m, seed, kind):
    """Shuffle a valid schedule's stages at random: validate() accepts exactly the lists that
    satisfy the local order rules and have an acyclic dependency graph, and the simulated
    timeline of every accepted list respects every dependency."""
    rng = random.Random(seed)
    stages = [list(acts) for acts in get_schedule(kind, p, m)]
    for acts in stages:
        if rng.random() < 0.7:
            i, j = rng.randrange(len(acts)), rng.randrange(len(acts))
            acts[i], acts[j] = acts[j], acts[i]
    sched = make_schedule(stages, num_microbatches=m)

    def locally_ordered(acts):
        pos = {a: i for i, a in enumerate(acts)}
        return all(
            pos[a] > pos[F(a.mb)] if a.kind in ("B", "BI") else
            (pos[a] > pos[BI(a.mb)] if a.kind == "BW" else True)
            for a in acts
        )

    expect_ok = all(locally_ordered(a) for a in sched) and not has_cycle(sched)
    if expect_ok:
        for f, b in [(1, 2), (2, 1)]:
            check_timeline(simulate(sched, f_time=f, b_time=b))
    else:
        with pytest.raises(ScheduleError):
            validate(sched)


# ---------------------------------------------------------------------------------------------
# get_schedule and argument checking
# ---------------------------------------------------------------------------------------------


def test_get_schedule_names():
    assert get_schedule("gpipe", 2, 4) == gpipe(2, 4)
    assert get_schedule("1f1b", 3, 4) == one_f_one_b(3, 4)
    assert get_schedule("interleaved", 2, 4) == interleaved(2, 4, 2)
    assert get_schedule("interleaved", 2, 4, v=3) == interleaved(2, 4, 3)
    assert get_schedule("zb-h1", 4, 8) == zb_h1(4, 8)
    assert get_schedule("ZB_H1", 4, 8).name == "zb-h1"


@pytest.mark.parametrize(
    "args,kwargs,message",
    [
        (("pipedream", 2, 4), {}, r"unknown pipeline schedule 'pipedream'; choose one of "
                                  r"\['1f1b', 'gpipe', 'interleaved', 'zb-h1'\]"),
        (("1f1b", 0, 4), {}, "1f1b: number of stages p must be >= 1, got 0"),
        (("gpipe", 2, 0), {}, "gpipe: number of micro-batches m must be >= 1, got 0"),
        (("gpipe", 2, 4.0), {}, "gpipe: number of micro-batches m must be an int, got 4.0"),
        (("interleaved", 4, 6), {},
         "m=6 must be a multiple of the number of stages p=4.*use e.g. m=4 or m=8"),
        (("interleaved", 4, 2), {},
         "m=2 must be a multiple of the number of stages p=4.*use e.g. m=4"),
        (("interleaved", 2, 4), {"v": 1}, "needs v >= 2 model chunks per stage, got v=1"),
        (("1f1b", 2, 4), {"v": 2}, r"schedule '1f1b' takes no argument\(s\) \['v'\]"),
    ],
)
def test_get_schedule_errors(args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        get_schedule(*args, **kwargs)


# ---------------------------------------------------------------------------------------------
# the ASCII chart
# ---------------------------------------------------------------------------------------------


def test_render_1f1b_chart():
    chart = render(one_f_one_b(2, 3))
    print("\n" + chart)
    assert chart == "\n".join(
        [
            "1f1b: p=2 m=3 (F=1 B=1): makespan 8, bubble 25.0%",
            "t   0  1  2  3  4  5  6  7",
            "s0  F0 F1 .  B0 F2 B1 .  B2",
            "s1  .  F0 B0 F1 B1 F2 B2 .",
        ]
    )


def test_render_proportional_and_split():
    chart = render(one_f_one_b(2, 2), f_time=1, b_time=2)
    print("\n" + chart)
    lines = chart.splitlines()
    assert lines[0] == "1f1b: p=2 m=2 (F=1 B=2): makespan 9, bubble 33.3%"
    assert lines[2].split() == ["s0", "F0", "F1", ".", ".", "B0", "--", ".", "B1", "--"]
    assert lines[3].split() == ["s1", ".", "F0", "B0", "--", "F1", "B1", "--", ".", "."]
    chart = render(zb_h1(4, 8))
    print("\n" + chart)
    rows = chart.splitlines()[2:]
    assert len(rows) == 4 and all(r.startswith(f"s{s} ") for s, r in enumerate(rows))
    # every action appears exactly once in its row
    for s, row in enumerate(rows):
        expected = [repr(a) for a in zb_h1(4, 8)[s]] + ["."] * row.split().count(".")
        assert sorted(row.split()[1:]) == sorted(expected)


def test_render_interleaved_and_half_slots():
    print("\n" + render(interleaved(2, 4, 2)))
    chart = render(zb_h1(2, 2), f_time=1, b_time=1)  # BI = BW = 0.5: half-unit slots
    assert "1 slot = 0.5" in chart.splitlines()[0]
    assert chart.splitlines()[2].split()[:3] == ["s0", "F0", "---"]


# ---------------------------------------------------------------------------------------------
# communication in the schedule (add_send_recv)
# ---------------------------------------------------------------------------------------------


def test_add_send_recv_puts_the_communication_in_the_printed_lists():
    from wgrumus.distributed.pipeline import add_send_recv
    s = add_send_recv(get_schedule("1f1b", 2, 2))
    assert s.to_strings() == [["F0", "SF0", "F1", "SF1", "RB0", "B0", "RB1", "B1"],
                              ["RF0", "F0", "B0", "SB0", "RF1", "F1", "B1", "SB1"]]
    assert "stage 1: RF0 F0 B0 SB0" in s.format() and "RB0" in render(s)
    assert validate(s) is s and s.compute() == get_schedule("1f1b", 2, 2)
    assert simulate(s).makespan == simulate(s.compute()).makespan
    assert Action.parse("SF2.1") == Action("SF", 2, 1) and repr(Action("RB", 3)) == "RB3"


@pytest.mark.parametrize("name, p, m", [("gpipe", 3, 2), ("1f1b", 4, 6), ("zb-h1", 3, 5),
                                        ("interleaved", 2, 4), ("interleaved", 3, 3)])
def test_every_send_meets_one_receive_on_the_neighbour(name, p, m):
    """Activations go k -> k + 1 (interleaved: the last stage's chunk c feeds stage 0's chunk
    c + 1), gradients k -> k - 1; each message is sent once and received once."""
    from wgrumus.distributed.pipeline import add_send_recv
    s = add_send_recv(get_schedule(name, p, m))
    sent, got = [], []
    for stage, acts in enumerate(s):
        for a in acts:
            k = s.virtual_stage(stage, a.chunk)
            if a.kind in ("SF", "SB"):
                sent.append((a.mb, k + 1 if a.kind == "SF" else k - 1, a.kind[1]))
            elif a.kind in ("RF", "RB"):
                got.append((a.mb, k, a.kind[1]))
    nv = s.num_virtual_stages
    assert sorted(sent) == sorted(got) and len(sent) == len(set(sent)) == 2 * m * (nv - 1)


def test_the_interpreter_refuses_a_list_without_its_communication():
    from wgrumus.distributed.pipeline import parse_actions
    from wgrumus.distributed.pipeline.interpreter import ScheduleExecutionError, StageRunner
    runner = StageRunner(work=None, num_stages=2, num_virtual_stages=2, stage=1)
    with pytest.raises(ScheduleExecutionError, match="F0 on virtual stage 1 runs before its "
                                                     "RF0; build the action list with "
                                                     "add_send_recv"):
        runner.run(parse_actions("F0 B0"))
    with pytest.raises(ScheduleExecutionError, match="SB0 on virtual stage 1: nothing to send"):
        runner.run([Action("SB", 0)])
