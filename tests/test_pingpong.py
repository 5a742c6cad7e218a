"""``mlsys_nb.comm.pingpong``: the predictions are the algorithm's step counts written out (pure, no
ranks), and a wrong algorithm's prediction differs enough to be caught (notebook 04 asserts both
against measurement)."""

import numpy as np
import pytest

from mlsys_nb.comm import pingpong


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_predictions_are_the_ring_step_counts(n):
    rng = np.random.default_rng(n)
    a, b, g = rng.uniform(1e-6, 1e-4), rng.uniform(1e8, 1e10), rng.uniform(1e-11, 1e-9)
    s = rng.uniform(1e3, 1e8, size=4)
    ar = 2 * (n - 1) * a + 2 * (n - 1) / n * s / b + (n - 1) / n * s * g  # reduce-scatter half reduces
    ag = (n - 1) * a + (n - 1) / n * s / b
    assert np.allclose(pingpong.predict("all_reduce", s, n, a, b, g), ar, rtol=1e-12)
    assert np.allclose(pingpong.predict("all_gather", s, n, a, b, g), ag, rtol=1e-12)
    d = rng.uniform(1e-11, 1e-9)  # the backend's flat-buffer copy: S·δ on the all-gather only
    assert np.allclose(pingpong.predict("all_gather", s, n, a, b, g, copy_s_per_byte=d), ag + s * d, rtol=1e-12)
    assert np.allclose(pingpong.predict("all_reduce", s, n, a, b, g, copy_s_per_byte=d), ar, rtol=1e-12)


def test_wrong_algorithm_or_missing_reduction_changes_the_prediction():
    a, b, g, s = 50e-6, 1e9, 0.15e-9, np.array([2.0**20, 2.0**22])
    ring = pingpong.predict("all_reduce", s, 2, a, b, g)
    tree = pingpong.predict("all_reduce", s, 2, a, b, g, "binomial_tree")
    assert (np.abs(tree - ring) / ring > 0.5).all(), "at n = 2 the binomial tree moves twice the ring's bytes"
    no_gamma = pingpong.predict("all_reduce", s, 2, a, b, 0.0)
    assert (no_gamma < ring).all()


def test_negative_copy_cost_is_rejected():
    with pytest.raises(ValueError, match="copy_s_per_byte"):
        pingpong.predict("all_gather", [1024], 2, 1e-5, 1e9, 0.0, copy_s_per_byte=-1e-10)


def test_fit_recovers_alpha_beta_from_exact_times():
    sizes = [2**k for k in range(10, 19)]
    t = [40e-6 + s / 2e9 for s in sizes]
    fit = pingpong.fit_ping_pong(sizes, t)
    assert fit.alpha_s == pytest.approx(40e-6, rel=1e-6) and fit.beta_bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert pingpong.gamma_per_byte([100, 200], [1e-7, 2e-7]) == pytest.approx(1e-9)


# ----------------------------------------------------------------------------- notebook 04's claims
A, B, G, D = 60e-6, 1.2e9, 0.2e-9, 0.5e-9  # α (s), β (B/s), γ and δ (s per byte)
FIT = [4096 * 2**k for k in range(8)]
HELD_OUT = [2 << 20, 4 << 20, 8 << 20]


def _pp(all_reduce_s, all_gather_s, delta=D, seed=0):
    """A ``measure`` result with exact point-to-point times (α + S/β), γ and δ, and the given collective times
    (scaled by a few per cent of random noise)."""
    rng = np.random.default_rng(seed)
    noise = lambda: rng.uniform(0.97, 1.03, size=len(HELD_OUT))  # noqa: E731
    return dict(
        n=2,
        fit_sizes=FIT,
        predict_sizes=HELD_OUT,
        exchange_s=[A + s / B for s in FIT],
        reduce_s=[G * s for s in HELD_OUT],
        copy_s=[delta * s for s in HELD_OUT],
        collective_s={
            "all_reduce": list(np.asarray(all_reduce_s) * noise()),
            "all_gather": list(all_gather_s * noise()),
        },
    )


S = np.asarray(HELD_OUT, dtype=float)
RING_AR = 2 * A + S / B + 0.5 * S * G  # written out at n = 2: 2 steps, S per rank, half the bytes reduced
TREE_AR = 2 * A + 2 * S / B + S * G  # binomial tree at n = 2: reduce to rank 0 (S) then broadcast (S)
PURE_AG = A + 0.5 * S / B  # one step of S/2
GAP = 0.8 * PURE_AG  # gloo's all-gather: the step count, the flat-buffer copy S·δ... and more (shares below)


def test_prediction_rows_are_the_formulas_written_out():
    pp = _pp(RING_AR, PURE_AG + S * D)
    rows = pingpong.prediction_rows(pp)
    pred = {(r["op"], r["model"], r["bytes"]): r["predicted_s"] for r in rows}
    for i, s in enumerate(HELD_OUT):
        assert pred[("all_reduce", "ring", s)] == pytest.approx(RING_AR[i], rel=1e-6)
        assert pred[("all_reduce", "rabenseifner", s)] == pytest.approx(RING_AR[i], rel=1e-6)
        assert pred[("all_reduce", "recursive_doubling", s)] == pytest.approx(RING_AR[i] - A, rel=1e-6)
        assert pred[("all_reduce", "binomial_tree", s)] == pytest.approx(TREE_AR[i], rel=1e-6)
        assert pred[("all_reduce", "tree", s)] == pytest.approx(TREE_AR[i], rel=1e-6)
        assert pred[("all_gather", "ring", s)] == pytest.approx(PURE_AG[i], rel=1e-6)
        assert pred[("all_gather", "ring + copy", s)] == pytest.approx(PURE_AG[i] + s * D, rel=1e-6)
    assert {r["k_beta"] for r in rows if r["op"] == "all_reduce" and r["model"] in ("ring", "rabenseifner")} == {1}


def test_all_reduce_check_tells_the_bandwidth_class_apart():
    ring, two = pingpong.check_all_reduce_class(pingpong.prediction_rows(_pp(RING_AR, PURE_AG)), 0.3)
    assert ring < 0.05 and two > 0.5
    # the idea broken: a backend that moves 2S per rank (a tree) must fail the check
    with pytest.raises(AssertionError, match="ring all-reduce prediction misses"):
        pingpong.check_all_reduce_class(pingpong.prediction_rows(_pp(TREE_AR, PURE_AG)), 0.3)
    # a bound so loose that a 2S algorithm passes proves nothing: the check says so
    with pytest.raises(AssertionError, match="cannot tell the bandwidth classes apart"):
        pingpong.check_all_reduce_class(pingpong.prediction_rows(_pp(RING_AR, PURE_AG)), 1.5)


@pytest.mark.parametrize("share", [0.45, 0.7])
def test_all_gather_check_passes_when_the_copy_is_part_of_the_gap(share):
    measured = PURE_AG + GAP
    pure, got = pingpong.check_all_gather(pingpong.prediction_rows(_pp(RING_AR, measured, GAP / S * share)), 0.3, 0.25)
    assert pure < -0.3 and got == pytest.approx(share, abs=0.1)


def test_all_gather_check_fails_when_its_ideas_are_broken():
    measured = PURE_AG + GAP
    rows = lambda ag, delta: pingpong.prediction_rows(_pp(RING_AR, ag, delta))  # noqa: E731
    # no copy cost (δ = 0): the copy explains nothing
    with pytest.raises(AssertionError, match="accounts for 0%"):
        pingpong.check_all_gather(rows(measured, 0.0), 0.3, 0.25)
    # δ three times the gap: the model with δ overshoots further than the one without
    with pytest.raises(AssertionError, match="accounts for"):
        pingpong.check_all_gather(rows(measured, 3 * GAP / S), 0.3, 0.25)
    # an all-gather as fast as its step count: nothing missing, nothing for δ to explain
    with pytest.raises(AssertionError, match="no missing local work"):
        pingpong.check_all_gather(rows(PURE_AG, D), 0.3, 0.25)


def test_re_measuring_passes_a_disturbed_run_but_never_a_wrong_claim():
    good, disturbed = _pp(RING_AR, PURE_AG + GAP, 0.5 * GAP / S), _pp(1.6 * RING_AR, PURE_AG + GAP, 0.5 * GAP / S)
    runs = iter([disturbed, good])
    check = lambda pp: pingpong.check_claims(pingpong.prediction_rows(pp), 0.3, 0.25)  # noqa: E731
    m, got, failures = pingpong.measure_and_check(lambda: next(runs), check)
    assert m is good and len(failures) == 1 and "ring all-reduce prediction misses" in failures[0]
    assert got["ring"] < 0.05 and got["copy_share"] == pytest.approx(0.5, abs=0.1)
    # the idea broken (a backend that moves 2S per rank; an all-gather without the copy): every attempt fails
    calls = []
    for broken in (_pp(TREE_AR, PURE_AG + GAP, 0.5 * GAP / S), _pp(RING_AR, PURE_AG + GAP, 0.0)):
        with pytest.raises(AssertionError, match=r"all 3 attempts failed \(load average") as err:
            pingpong.measure_and_check(lambda b=broken: calls.append(1) or b, check)
        assert err.value.args[0].count("] the ") + err.value.args[0].count("] a ") >= 3
    assert len(calls) == 2 * pingpong.ATTEMPTS
