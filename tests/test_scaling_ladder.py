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
