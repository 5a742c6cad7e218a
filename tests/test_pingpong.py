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
