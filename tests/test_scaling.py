"""Scaling laws against published constants (arXiv:2203.15556, 2404.10102, 2001.08361), derived allocation tables), the
fitter's recovery of known constants, the synthetic language's exact entropy rate, and the ladder."""

import numpy as np
import pytest

from mlsys_nb import scaling
from mlsys_nb.models.corpus import MarkovLanguage


def test_published_constants_and_allocation_exponents():
    c, e = scaling.law("chinchilla"), scaling.law("epoch")
    assert c.params() == {"E": 1.69, "A": 406.4, "B": 410.7, "alpha": 0.34, "beta": 0.28}
    assert (c.a, c.b, c.G) == pytest.approx((0.4516, 0.5484, 1.3447), abs=1e-4)
    assert (e.a, e.G) == pytest.approx((0.5126, 0.1196), abs=1e-4)
    assert set(scaling.law_names()) >= {"chinchilla", "epoch", "kaplan"}


@pytest.mark.parametrize(
    "name, C, N, D, ratio, L",
    [
        ("chinchilla", 1e19, 2.280e8, 7.311e9, 32.07, 2.9857),
        ("chinchilla", 1e21, 1.824e9, 9.136e10, 50.08, 2.3289),
        ("chinchilla", 1e25, 1.168e11, 1.427e13, 122.12, 1.8453),
        ("epoch", 1e19, 2.622e8, 6.357e9, 24.25, 2.9271),
        ("epoch", 1e23, 2.945e10, 5.660e11, 19.22, 2.0321),
    ],
)
def test_compute_optimal_table(name, C, N, D, ratio, L):
    law = scaling.law(name)
    n, d = law.compute_optimal(C)
    assert (n, d) == pytest.approx((N, D), rel=5e-4)
    assert 6 * n * d == pytest.approx(C)
    assert law.tokens_per_parameter(C) == pytest.approx(ratio, abs=0.01)
    assert law.optimal_loss(C) == pytest.approx(L, abs=1e-4)


def test_optimum_is_the_minimum_of_the_iso_flop_curve():
    for name in ("chinchilla", "epoch"):
        law = scaling.law(name)
        C = 3e21
        ns = np.logspace(8, 11, 20001)
        numeric = ns[np.argmin(law.iso_flop(C, ns))]
        assert numeric == pytest.approx(law.compute_optimal(C)[0], rel=1e-3)


def test_point_checks_twenty_tokens_and_iso_loss():
    assert scaling.law("chinchilla").loss(175e9, 300e9) == pytest.approx(2.0023, abs=1e-4)
    assert scaling.law("epoch").loss(175e9, 300e9) == pytest.approx(2.0085, abs=1e-4)
    n, d = scaling.twenty_tokens_per_param(1e23)
    assert n == pytest.approx(2.887e10, rel=1e-3) and d == 20 * n
    law = scaling.law("chinchilla")
    ns = np.array([1e9, 1e10, 1e11])
    d = law.iso_loss(2.1, ns)
    assert law.loss(ns, d) == pytest.approx([2.1] * 3)
    assert np.isnan(law.iso_loss(1.7, 1e9))  # below what a 1e9 model can reach


def test_kaplan_law_and_allocation():
    k = scaling.law("kaplan")
    # the joint form reduces to L(N) = (N_c/N)^alpha_N as D -> infinity (Kaplan eq. 1.1)
    assert k.loss(1e9, 1e30) == pytest.approx((8.8e13 / 1e9) ** 0.076, rel=1e-6)
    c_pfd = 100.0
    n, d = k.compute_optimal(c_pfd * 8.64e19)
    assert n == pytest.approx(1.3e9 * 100**0.73)
    assert 6 * n * d == pytest.approx(c_pfd * 8.64e19)
    # Kaplan grows N much faster than Chinchilla: tokens/param falls with C
    chinchilla = scaling.law("chinchilla")
    assert k.tokens_per_parameter(1e24) < k.tokens_per_parameter(1e20) < chinchilla.tokens_per_parameter(1e20)
    assert k.loss(1e9, k.iso_loss(3.0, 1e9)) == pytest.approx(3.0)


def test_inference_demand_makes_the_model_smaller():
    law = scaling.law("chinchilla")
    base = law.inference_optimal(1e23, 0.0)
    assert base["N"] == pytest.approx(base["chinchilla_N"], rel=1e-3)
    over = law.inference_optimal(1e23, 2e13)
    assert over["N"] < 0.7 * base["N"] and over["D"] > base["D"]
    assert law.loss(over["N"], over["D"]) == pytest.approx(over["loss"])
    assert over["total_flops"] < over["chinchilla_total_flops"]


def _synthetic(law, sigma, seed):
    rng = np.random.default_rng(seed)
    N, D = [], []
    for C in np.logspace(18, 22, 5):  # iso-FLOP design as in Chinchilla's approach 2
        n0, _ = law.compute_optimal(C)
        for f in np.logspace(-1, 1, 7):
            N.append(n0 * f)
            D.append(C / (6 * n0 * f))
    N, D = np.array(N), np.array(D)
    return N, D, law.loss(N, D) * np.exp(rng.normal(0, sigma, N.size))


def test_fit_recovers_known_constants_exactly_without_noise():
    truth = scaling.law("epoch")
    N, D, L = _synthetic(truth, 0.0, 0)
    fitted = scaling.fit(N, D, L, starts=8)
    for k, v in truth.params().items():
        assert getattr(fitted, k) == pytest.approx(v, rel=2e-3), k


def test_fit_with_noise_has_intervals_covering_the_truth():
    truth = scaling.law("chinchilla")
    N, D, L = _synthetic(truth, 0.001, 1)
    fitted = scaling.fit(N, D, L, bootstrap=30, seed=0, starts=8)
    for k, v in truth.params().items():
        lo, hi = fitted.ci[k]
        assert lo < hi
        assert getattr(fitted, k) == pytest.approx(v, rel=0.05), k
    for k in ("E", "alpha", "beta"):
        lo, hi = fitted.ci[k]
        assert lo <= truth.params()[k] <= hi, (k, fitted.ci[k])
    frame = fitted.to_frame(truth.params())
    assert list(frame.index) == ["E", "A", "B", "alpha", "beta"]


def test_markov_language_entropy_rate_is_exact():
    lang = MarkovLanguage(vocab=6, order=2, concentration=0.5, seed=3)
    # stationary: pi P = pi on the context chain
    assert lang.stationary.sum() == pytest.approx(1.0)
    x = lang.sample(4000, 40, seed=1)
    # the true model's empirical loss on a long sample converges to the entropy rate
    assert lang.true_loss(x) == pytest.approx(lang.entropy_rate, abs=0.01)
    assert lang.entropy_rate < lang.unigram_entropy < np.log(6)
    # independent check of the rate for order 1: H = -sum_i pi_i sum_j P_ij log P_ij with pi from eig
    l1 = MarkovLanguage(vocab=5, order=1, concentration=1.0, seed=2)
    w, v = np.linalg.eig(l1.probs.T)
    pi = np.real(v[:, np.argmin(np.abs(w - 1))])
    pi = pi / pi.sum()
    assert l1.entropy_rate == pytest.approx(-(pi[:, None] * l1.probs * np.log(l1.probs)).sum(), rel=1e-9)
    np.testing.assert_array_equal(lang.sample(3, 10, seed=5), lang.sample(3, 10, seed=5))


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: scaling.law("gpt"), "unknown scaling law"),
        (lambda: scaling.law("chinchilla").compute_optimal(-1), "C"),
        (lambda: scaling.law("chinchilla").loss(0, 1e9), "N"),
        (lambda: scaling.fit([1e6] * 3, [1e9] * 3, [3.0] * 3), "at least 5"),
        (lambda: scaling.fit([1e6] * 6, [1e9] * 5, [3.0] * 6), "same length"),
        (lambda: scaling.ChinchillaLaw(E=1.0, A=1.0, B=1.0, alpha=-0.1, beta=0.3), "alpha"),
        (lambda: scaling.law("epoch").inference_optimal(1e21, -5), "inference_tokens"),
        (lambda: MarkovLanguage(vocab=1), "vocab"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises((ValueError, KeyError), match=match):
        call()


def test_the_fit_runs_blas_on_one_thread_and_restores_it(monkeypatch):
    """L-BFGS-B on 5-vectors must not wake BLAS pool threads (the quick fit ran ~9x slower beside load):
    inside the fit every BLAS library runs one thread; after it, the count it had before."""
    import scipy.optimize
    from threadpoolctl import threadpool_info, threadpool_limits

    seen, real = [], scipy.optimize.minimize

    def spy(*a, **kw):
        seen.append({i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"})
        return real(*a, **kw)

    monkeypatch.setattr(scipy.optimize, "minimize", spy)
    N, D, L = _synthetic(scaling.law("epoch"), 0.0, 0)
    with threadpool_limits(limits=2, user_api="blas"):
        before = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
        scaling.fit(N, D, L, starts=2)
        after = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    assert seen and all(set(s.values()) == {1} for s in seen), seen
    assert after == before
