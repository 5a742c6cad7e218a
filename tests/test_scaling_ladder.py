"""The scaling ladder: budgets become exact-FLOP token counts, runs are deterministic, and trained
models land between the unigram entropy and the language's entropy rate."""

import math

import pytest

from mlsys_nb import flops
from mlsys_nb.models import ladder
from mlsys_nb.models.corpus import MarkovLanguage


def test_plan_turns_budgets_into_tokens():
    p = ladder.plan([1e9, 3e9], [(1, 8), (2, 16)], min_steps=10, max_steps=500)
    assert len(p) == 4
    for _, r in p.iterrows():
        cfg = ladder.model_config(int(r["n_layers"]), int(r["hidden"]), vocab=8, seq_len=32)
        fpt = flops.flops_per_token(cfg, 32, causal=True)
        C, D = r["C (FLOPs)"], r["D (tokens)"]
        assert r["steps"] == int(C / fpt // (ladder.BATCH * 32))
        assert C >= fpt * D > C - fpt * ladder.BATCH * 32  # D x FLOPs/token within one step of C
    assert len(ladder.plan([1e9], [(1, 8)], min_steps=10, max_steps=20)) == 0  # too many steps: dropped


def test_tiny_runs_learn_and_are_deterministic():
    rows = ladder.plan([1e9], [(1, 8)], min_steps=10, max_steps=500).iloc[:1].copy()
    rows["steps"] = 25
    rows["D (tokens)"] = 25 * ladder.BATCH * 32
    a = ladder.train_rows(rows, eval_seqs=64)
    b = ladder.train_rows(rows, eval_seqs=64)
    lang = MarkovLanguage(**ladder.LANGUAGE)
    assert a["loss"].iloc[0] == b["loss"].iloc[0]
    assert lang.entropy_rate - 0.05 < a["loss"].iloc[0] < math.log(lang.vocab)
    assert a.attrs["entropy_rate"] == pytest.approx(lang.entropy_rate)


def test_stored_full_ladder_is_consistent():
    full = ladder.load_measured()
    H = full.attrs["entropy_rate"]
    assert len(full) >= 10 and full["C (FLOPs)"].nunique() >= 3
    assert (full["loss"] > H - 0.02).all() and (full["loss"] < full.attrs["unigram_entropy"]).all()
    best = ladder.iso_flop_optima(full)
    assert (best["loss"].diff().dropna() < 0).all(), "best loss must fall with compute"


def test_band_z_is_sized_for_the_runs_checked_together():
    from scipy.stats import t

    z1, z4 = ladder.band_z(1, 24), ladder.band_z(4, 24)
    assert z1 == pytest.approx(t.ppf(0.975, 23) * math.sqrt(1 + 1 / 24))
    assert z4 == pytest.approx(t.ppf(1 - (1 - 0.95**0.25) / 2, 23) * math.sqrt(1 + 1 / 24))
    assert 2.0 < z1 < z4 < 3.0  # Sidak: four runs together need a wider band than one
    assert ladder.band_z(4, 1000) < z4  # a spread from more seeds is known better
    with pytest.raises(ValueError, match="k"):
        ladder.band_z(0, 24)


def test_stored_seed_runs_are_the_quick_ladder_at_24_seeds():
    runs = ladder.load_seed_runs()
    plan = ladder.plan(ladder.SEED_BUDGETS, ladder.SEED_SIZES)
    assert runs["seed"].nunique() == 24 and len(runs) == 24 * len(plan)
    for col in ("C (FLOPs)", "N (params)", "steps", "D (tokens)"):
        assert sorted(set(runs[col])) == sorted(set(plan[col])), col
    spread = ladder.seed_spread(runs)
    assert (spread["n"] == 24).all() and (spread["log_sd"] > 0).all()


@pytest.fixture(scope="module")
def band_inputs():
    full = ladder.load_measured()
    fit = ladder.fit_ladder(full, bootstrap=2, starts=12, seed=0)
    spread = ladder.seed_spread(ladder.load_seed_runs())
    return fit, spread, ladder.band_z(4, int(spread["n"].min())), ladder.fit_misfit(fit, full)


@pytest.mark.parametrize("lr_scale", [1.0, 0.1, 10.0])
def test_a_run_with_a_wrong_learning_rate_falls_outside_the_band(band_inputs, lr_scale):
    """Notebook 11's check, on its most informative run (1e10 FLOPs, the 2-layer model, 103 steps): a fresh seed
    lands inside the band; the mutation, a learning rate 10x off either way, lands outside."""
    fit, spread, z, misfit = band_inputs
    plan = ladder.plan(ladder.SEED_BUDGETS, ladder.SEED_SIZES)
    row = plan[(plan["C (FLOPs)"] == 1e10) & (plan["hidden"] == 16)]
    key = (1e10, float(row["N (params)"].iloc[0]))
    run = ladder.train_rows(row, seed=200, lr_scale=lr_scale)  # a seed outside the stored 24
    centre, half, lo, hi = ladder.prediction_band(
        fit, row["N (params)"], row["D (tokens)"], [spread.loc[key, "log_sd"]], z, misfit
    )
    loss = float(run["loss"].iloc[0])
    inside = bool(lo[0] < loss < hi[0])
    assert inside == (lr_scale == 1.0), f"lr x{lr_scale}: loss {loss:.3f}, band {lo[0]:.3f}-{hi[0]:.3f}"
