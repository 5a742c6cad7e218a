"""Pipeline schedules and simulator (single process): golden traces of the papers' op orders, closed
forms over a grid of (p, m, v), validation catching broken schedules, PyTorch's own op orders."""

import math

import pytest

from mlsys_nb.pipeline import SCHEDULES, Action, ScheduleError, schedule, simulate, validate
from mlsys_nb.pipeline.closed_forms import closed_form
from mlsys_nb.pipeline.reference import TORCH_CLASSES, torch_order

# Golden traces written out by hand from the papers' rules (F3 / F1.3 = chunk 1 micro-batch 3).
GOLDEN_1F1B = """\
r0: F0 F1 F2 F3 B0 F4 B1 F5 B2 F6 B3 F7 B4 B5 B6 B7
r1: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 F7 B5 B6 B7
r2: F0 F1 B0 F2 B1 F3 B2 F4 B3 F5 B4 F6 B5 F7 B6 B7
r3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 F7 B7"""
GOLDEN_INTERLEAVED_R0 = (
    "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 F1.3 F0.4 F0.5 F0.6 B1.0 F0.7 B1.1 F1.4 "
    "B1.2 F1.5 B1.3 F1.6 B0.0 F1.7 B0.1 B0.2 B0.3 B1.4 B1.5 B1.6 B1.7 B0.4 B0.5 B0.6 B0.7"
)
GOLDEN_ZBH1 = """\
r0: F0 F1 F2 F3 B0 W0 F4 B1 W1 F5 B2 W2 F6 B3 W3 F7 B4 W4 B5 W5 B6 W6 B7 W7
r1: F0 F1 F2 B0 F3 B1 W0 F4 B2 W1 F5 B3 W2 F6 B4 W3 F7 B5 W4 B6 W5 B7 W6 W7
r2: F0 F1 B0 F2 B1 F3 B2 W0 F4 B3 W1 F5 B4 W2 F6 B5 W3 F7 B6 W4 B7 W5 W6 W7
r3: F0 B0 F1 B1 F2 B2 F3 B3 W0 F4 B4 W1 F5 B5 W2 F6 B6 W3 F7 B7 W4 W5 W6 W7"""
GOLDEN_ZBH2 = """\
r0: F0 F1 F2 F3 F4 F5 F6 B0 W0 F7 B1 W1 B2 W2 B3 W3 B4 W4 B5 W5 B6 W6 B7 W7
r1: F0 F1 F2 F3 F4 B0 F5 B1 F6 B2 W0 F7 B3 W1 B4 W2 B5 W3 B6 W4 B7 W5 W6 W7
r2: F0 F1 F2 B0 F3 B1 F4 B2 F5 B3 F6 B4 W0 F7 B5 W1 B6 W2 B7 W3 W4 W5 W6 W7
r3: F0 B0 F1 B1 F2 B2 F3 B3 F4 B4 F5 B5 F6 B6 W0 F7 B7 W1 W2 W3 W4 W5 W6 W7"""
# DualPipeV n = 4, N = 10, rank 0 ("F1.3" = phase 1, micro-batch 3; Bz = deferred-weight backward)
GOLDEN_DUALPIPEV_R0 = (
    "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 Bz1.0 W1.0 F1.1 Bz1.1 W1.1 F1.2 Bz1.2 W1.2 F1.3 [F0.7+B1.3] "
    "[F1.4+B0.0] [F0.8+B1.4] [F1.5+B0.1] [F0.9+B1.5] [F1.6+B0.2] B1.6 [F1.7+B0.3] B1.7 [F1.8+B0.4] B1.8 "
    "[F1.9+B0.5] B1.9 Bz0.6 W0.6 Bz0.7 W0.7 Bz0.8 W0.8 Bz0.9 W0.9"
)


def _plain(sched, r):
    """Rank r's compute order in the single-chunk notation (F3, B3, W3)."""
    return " ".join(f"{a.kind}{a.microbatch}" for a in sched.compute[r])


def test_golden_traces_match_papers():
    s = schedule("1f1b", 4, 8)
    assert "\n".join(f"r{r}: {_plain(s, r)}" for r in range(4)) == GOLDEN_1F1B
    s = schedule("interleaved-1f1b", 4, 8, 2)
    assert " ".join(f"{a.kind}{a.chunk}.{a.microbatch}" for a in s.compute[0]) == GOLDEN_INTERLEAVED_R0
    for name, golden in (("zb-h1", GOLDEN_ZBH1), ("zb-h2", GOLDEN_ZBH2)):
        s = schedule(name, 4, 8)
        assert "\n".join(f"r{r}: {_plain(s, r)}" for r in range(4)) == golden, name
    s = schedule("dualpipev", 4, 10)
    txt = " ".join(str(a).replace("Bi", "Bz") for a in s.compute[0])
    assert txt == GOLDEN_DUALPIPEV_R0


@pytest.mark.parametrize(
    "name,p,m,costs,makespan,busy",
    [
        ("1f1b", 4, 8, dict(F=1, B=2), 33, 24),
        ("gpipe", 4, 8, dict(F=1, B=2), 33, 24),
        ("interleaved-1f1b", 4, 8, dict(F=1, B=2), 28.5, 24),
        ("zb-h1", 4, 8, dict(F=1, B=1, W=1), 27, 24),
        ("zbv", 4, 8, dict(F=2, B=2, W=2), 51, 48),  # golden is per half-size chunk: F = I = W = 1
        ("dualpipev", 4, 10, dict(F=2, B=2, W=2, FB=6), 66, 60),  # per chunk F=1, B=2, W=1, F&B=3
        ("dualpipe", 8, 20, dict(F=1, B=1, W=1, FB=3), 66, 60),
    ],
)
def test_golden_makespans(name, p, m, costs, makespan, busy):
    r = simulate(schedule(name, p, m), **costs)
    assert r.makespan == pytest.approx(makespan) and r.busy[0] == pytest.approx(busy)


def _grid():
    cases = []
    for p in (1, 2, 3, 4, 5, 8):
        for m in (1, 2, 3, 4, 6, 8, 16, 24):
            for c in (dict(F=1, B=2), dict(F=1.5, B=2.5)):
                cases += [("gpipe", p, m, None, c), ("1f1b", p, m, None, c)]
            for c in (dict(F=1, B=1, W=1), dict(F=1.5, B=1.0, W=0.7)):
                cases += [(n, p, m, None, c) for n in ("zb-h1", "zb-h2", "zbv")]
            for v in (2, 3, 4):
                if m % p == 0:
                    cases += [("interleaved-1f1b", p, m, v, c) for c in (dict(F=1, B=2), dict(F=1, B=1))]
            if m >= 2 * p:
                cases.append(("dualpipev", p, m, None, dict(F=1, B=1, W=1)))
                if p % 2 == 0 and m % 2 == 0:
                    cases.append(("dualpipe", p, m, None, dict(F=1, B=1, W=1)))
    return cases


def test_simulated_bubbles_and_peaks_equal_closed_forms():
    checked = {"bubble_time": 0, "internal_idle": 0, "peak_activations": 0}
    for name, p, m, v, c in _grid():
        s = schedule(name, p, m, v)
        validate(s)
        r, cf = simulate(s, **c), closed_form(name, p, m, v, **c)
        where = f"{name} p={p} m={m} v={v} {c}"
        if cf["bubble_time"] is not None:
            checked["bubble_time"] += 1
            assert r.bubble_time == pytest.approx(cf["bubble_time"]), where
            assert r.bubble_ratio == pytest.approx(cf["bubble_ratio"]), where
            assert r.bubble_fraction == pytest.approx(cf["bubble_fraction"]), where
        if cf["internal_idle"] is not None:
            checked["internal_idle"] += 1
            assert max(map(abs, r.internal_idle)) < 1e-9, where
        if cf["peak_activations"] is not None:
            checked["peak_activations"] += 1
            assert r.peak_activations == pytest.approx(cf["peak_activations"]), where
    assert min(checked.values()) > 20, checked  # the grid really exercised every kind of check


def test_bubble_conventions_against_published_values():
    # idle fraction (p−1)/(m+p−1) and bubble/ideal (p−1)/m for 1F1B
    for p, m, idle in ((4, 1, 0.75), (4, 8, 0.2727), (4, 64, 0.045), (2, 4, 0.2), (8, 32, 0.1795)):
        assert simulate(schedule("1f1b", p, m), F=1, B=2).bubble_fraction == pytest.approx(idle, abs=5e-4)
    for p, m, ratio in ((2, 4, 0.25), (4, 4, 0.75), (4, 16, 0.1875), (8, 32, 0.21875)):
        assert simulate(schedule("1f1b", p, m), F=1, B=2).bubble_ratio == pytest.approx(ratio)
    # interleaved: (p−1)/(v·m), the Playbook plot values for p = 8
    for m, v, ratio in ((32, 8, 0.027), (16, 4, 0.109), (32, 1 * 2, 0.109), (8, 4, 0.219)):
        r = simulate(schedule("interleaved-1f1b", 8, m, v), F=1, B=2)
        assert r.bubble_ratio == pytest.approx(ratio, abs=1e-3)
    for (p, m, v), ratio in {(4, 8, 4): 0.09375, (8, 16, 2): 0.21875, (8, 32, 4): 0.0546875, (4, 4, 2): 0.375}.items():
        assert simulate(schedule("interleaved-1f1b", p, m, v), F=1, B=2).bubble_ratio == pytest.approx(ratio)
    # DualPipe golden bubbles: p = 4, 8 chunks -> 2; p = 16, 64 chunks -> 14; DualPipeV n = 8, N = 16 -> 14
    assert simulate(schedule("dualpipe", 4, 8), F=1, B=1, W=1).bubble_time == pytest.approx(2)
    assert simulate(schedule("dualpipe", 16, 64), F=1, B=1, W=1).bubble_time == pytest.approx(14)
    assert simulate(schedule("dualpipev", 8, 16), F=2, B=2, W=2).bubble_time == pytest.approx(14)
    # ZB-H1, p = 8, m = 24 at unit times: 7
    assert simulate(schedule("zb-h1", 8, 24), F=1, B=1, W=1).bubble_time == pytest.approx(7)


def test_comm_latency_and_imbalance():
    s = schedule("1f1b", 4, 8)
    base = simulate(s, F=1, B=2)
    slow = simulate(s, F=1, B=2, comm=0.5)
    # the first micro-batch crosses 3 boundaries forward and 3 back, each adding the latency
    assert slow.makespan >= base.makespan + 6 * 0.5 - 1e-9
    imb = simulate(s, F=1, B=2, imbalance=[1, 1, 2, 1])
    assert imb.makespan > base.makespan and imb.busy[2] == pytest.approx(2 * base.busy[2])
    # full backward = B + W when W is given
    assert simulate(s, F=1, B=1, W=1).makespan == pytest.approx(base.makespan)


def test_timeline_respects_dependencies_and_order():
    for name in SCHEDULES:
        s = schedule(name, 4, 8)
        r = simulate(s, F=1.0, B=1.3, W=0.6, comm=0.1)
        tl = r.timeline
        ends = {(k, j, st): e for k, j, st, e in zip(tl.kind, tl.microbatch, tl.stage, tl.end)}
        for row in tl.itertuples():
            if row.kind == "F" and row.stage > 0:
                assert row.start >= ends[("F", row.microbatch, row.stage - 1)] - 1e-9
            if row.kind == "B":
                dep = (
                    ("B", row.microbatch, row.stage + 1)
                    if row.stage < s.n_stages - 1
                    else ("F", row.microbatch, row.stage)
                )
                assert row.start >= ends[dep] - 1e-9, (name, row)
            if row.kind == "W":
                assert row.start >= ends[("B", row.microbatch, row.stage)] - 1e-9
        for _, g in tl.groupby("rank"):  # a rank runs one op at a time
            g = g.sort_values("start")
            assert (g.start.values[1:] >= g.end.values[:-1] - 1e-9).all(), name


def test_validate_catches_broken_schedules():
    s = schedule("1f1b", 4, 8)
    validate(s)
    bad_order = schedule("gpipe", 2, 2)
    bad_order.compute[0] = list(reversed(bad_order.compute[0]))  # B before F
    with pytest.raises(ScheduleError, match="order"):
        validate(bad_order)
    # a cross-rank cycle: rank 0 waits for B0 from rank 1 before sending F1; rank 1 needs F1 first
    dead = schedule("1f1b", 2, 2)
    dead.compute[1] = [Action("F", 1, 0, 1), Action("B", 1, 0, 1), Action("F", 0, 0, 1), Action("B", 0, 0, 1)]
    dead.compute[0] = [Action("F", 0, 0, 0), Action("B", 0, 0, 0), Action("F", 1, 0, 0), Action("B", 1, 0, 0)]
    with pytest.raises(ScheduleError, match="deadlock"):
        validate(dead)
    with pytest.raises(ScheduleError, match="deadlock"):
        simulate(dead, F=1, B=1)
    missing = schedule("zb-h1", 2, 2)
    missing.compute[0] = [a for a in missing.compute[0] if not (a.kind == "W" and a.microbatch == 1)]
    with pytest.raises(ScheduleError, match="W present"):
        validate(missing)


def test_send_recv_lowering_pairs_up():
    for name in SCHEDULES:
        s = schedule(name, 4, 8)
        acts = [(r, a) for r in range(4) for a in s.actions[r]]
        sends = [(a.kind[-1], a.microbatch, r, a.peer) for r, a in acts if a.kind.startswith("SEND")]
        recvs = [(a.kind[-1], a.microbatch, a.peer, r) for r, a in acts if a.kind.startswith("RECV")]
        assert sorted(sends) == sorted(recvs) and sends, name
        # every cross-rank boundary of every micro-batch carries one activation and one gradient
        expected = sum(1 for j in range(8) for st in range(s.n_stages - 1) if s.rank_of(j, st) != s.rank_of(j, st + 1))
        assert sum(1 for x in sends if x[0] == "F") == expected == sum(1 for x in sends if x[0] == "B")


@pytest.mark.parametrize(
    "name,p,m,v",
    [
        ("gpipe", 4, 8, None),
        ("interleaved-1f1b", 4, 8, 2),
        ("interleaved-1f1b", 3, 9, 3),
        ("zb-h1", 4, 8, None),
        ("zb-h1", 3, 6, None),
        ("zbv", 4, 8, None),
        ("zbv", 3, 4, None),
        ("dualpipev", 4, 10, None),
        ("dualpipev", 3, 8, None),
    ],
)
def test_same_order_as_torch_pipelining(name, p, m, v):
    assert schedule(name, p, m, v).compute == torch_order(name, p, m, v)


def test_1f1b_differs_from_torch_only_by_its_last_rank_index_bug():
    """torch 2.13's ``Schedule1F1B._get_pipeline_order`` numbers the last rank's forwards 1..m
    (no warm-up forward, so its counter is incremented before first use); its runtime does not use
    this list. Every other rank agrees with ours, and the last rank does after shifting back by one."""
    for p, m in ((4, 8), (3, 5), (2, 6)):
        ours, th = schedule("1f1b", p, m).compute, torch_order("1f1b", p, m)
        assert ours[:-1] == th[:-1]
        shifted = [a._replace(microbatch=a.microbatch - 1) if a.kind == "F" else a for a in th[-1]]
        assert ours[-1] == shifted and ours[-1] != th[-1]
    assert set(TORCH_CLASSES) == set(SCHEDULES) - {"zb-h2", "dualpipe"}


@pytest.mark.parametrize(
    "args,match",
    [
        (("nope", 4, 8), "schedule must be"),
        (("1f1b", 0, 8), "p must be"),
        (("1f1b", 4, 0), "m must be"),
        (("1f1b", 4, 8, 2), "v must be 1"),
        (("interleaved-1f1b", 4, 6, 2), "multiple of p"),
        (("interleaved-1f1b", 4, 8, 1), "v must be"),
        (("zbv", 4, 8, 3), "v must be 2"),
        (("dualpipe", 3, 12), "even number of ranks"),
        (("dualpipe", 4, 6), "m >= 2p"),
        (("dualpipev", 4, 7), "m >= 2p"),
    ],
)
def test_bad_arguments_name_the_parameter(args, match):
    with pytest.raises(ScheduleError, match=match):
        schedule(*args)


def test_simulate_rejects_bad_costs():
    with pytest.raises(ScheduleError, match="pass W"):
        simulate(schedule("zb-h1", 2, 4), F=1, B=1)
    with pytest.raises(ValueError, match="F must be"):
        simulate(schedule("1f1b", 2, 4), F=-1)
    with pytest.raises(ValueError, match="imbalance"):
        simulate(schedule("1f1b", 2, 4), imbalance=[1])


def test_peak_memory_story():
    """1F1B caps in-flight micro-batches at p (GPipe keeps m); pipelining does not reduce the
    activations of rank 0 below one micro-batch through all L layers (p × L/p)."""
    for p, m in ((4, 16), (8, 32)):
        g = simulate(schedule("gpipe", p, m), F=1, B=2)
        o = simulate(schedule("1f1b", p, m), F=1, B=2)
        assert g.peak_activations[0] == m and o.peak_activations[0] == p
        assert math.isclose(g.makespan, o.makespan)


def test_pair_message_order():
    """Linear schedules send each pair's messages in the order the peer receives them; the V-shaped
    and bidirectional ones do not (why the executor matches messages by tag, over gloo)."""
    from mlsys_nb.pipeline.schedules import pair_orders_match

    for name in ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-h2"):
        assert pair_orders_match(schedule(name, 4, 8)), name
    assert not pair_orders_match(schedule("zbv", 4, 8))
    assert not pair_orders_match(schedule("dualpipev", 4, 8))
    swapped = schedule("1f1b", 2, 2)
    row = swapped.actions[1]
    i, j = [k for k, a in enumerate(row) if a.kind == "RECV_F"]
    row[i], row[j] = row[j], row[i]
    assert not pair_orders_match(swapped)
