"""Every schedule executed on 4 real gloo ranks (one launch): gradients equal the unpipelined
model's, each rank ran exactly its schedule's order, and the measured timeline is causal."""

import pytest

from mlsys_nb.pipeline import SCHEDULES, simulate
from mlsys_nb.pipeline.executor import run_schedules


@pytest.fixture(scope="module")
def runs():
    return run_schedules(
        SCHEDULES, world_size=4, m=8, hidden=16, microbatch_size=3, seed=3, backend="gloo", timeout=180
    )


@pytest.mark.slow
def test_gradients_equal_unpipelined_model(runs):
    assert set(runs) == set(SCHEDULES)
    for name, run in runs.items():
        assert run.grad_error < 1e-5, (name, run.grad_error)
        assert run.loss == pytest.approx(run.reference_loss, rel=1e-5), name


@pytest.mark.slow
def test_real_order_and_causality(runs):
    for name, run in runs.items():
        s, tl = run.schedule, run.timeline
        assert run.order_matches(), name
        assert run.causal(), name
        bad = tl.copy()  # the checks can fail: a swapped pair of ops on rank 0 is noticed
        i, j = bad.index[bad["rank"] == 0][:2]
        bad.loc[[i, j], "start"] = bad.loc[[j, i], "start"].values
        assert not type(run)(s, 0, 0, 0, bad).order_matches()
        # the simulator, fed the measured median op costs, orders every rank's ops as the run did
        costs = run.op_costs()
        sim = simulate(s, F=costs["F"], B=costs["B"], W=costs.get("W") if s.split_backward else None)
        assert run.same_order_as(sim), name
        assert not type(run)(s, 0, 0, 0, bad).same_order_as(sim), name  # a swapped pair on rank 0 is noticed


def _sim(sched):
    return simulate(sched, F=1, B=2, W=1 if sched.split_backward else None)


@pytest.mark.slow
def test_simulation_of_another_schedule_does_not_match_the_run(runs):
    """The order comparison bites: simulating a different schedule with the same ops on every rank
    (GPipe for the 1F1B run and back, ZB-H1 for ZB-H2) puts some rank's ops
    in another order, while the run's own schedule matches at any costs."""
    for got, other in (("1f1b", "gpipe"), ("gpipe", "1f1b"), ("zb-h2", "zb-h1")):
        run, wrong = runs[got], _sim(runs[other].schedule)
        assert sorted(map(tuple, wrong.timeline[["rank", "kind", "microbatch", "stage"]].values.tolist())) == sorted(
            map(tuple, run.timeline[["rank", "kind", "microbatch", "stage"]].values.tolist())
        ), (got, other, "not the same ops: pick another pair")
        assert not run.same_order_as(wrong), (got, other)
        assert run.same_order_as(_sim(run.schedule)), got


@pytest.mark.slow
def test_transformer_blocks_on_two_ranks():
    """The same check with the package's Llama-style transformer blocks, on 2 ranks (one launch)."""
    runs = run_schedules(
        SCHEDULES,
        world_size=2,
        m=4,
        block="transformer",
        hidden=16,
        seq_len=5,
        microbatch_size=2,
        seed=1,
        backend="gloo",
        timeout=180,
    )
    for name, run in runs.items():
        assert run.grad_error < 1e-5 and run.order_matches() and run.causal(), (name, run.grad_error)
