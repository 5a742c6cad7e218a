"""The quiz families of notebook 05 §8-9 (sampler shards, the batch-size recipe, the critical batch) and
notebook 08 §10 (bytes across stage boundaries): each key's idea broken once, and its second route
(quiz/routes/data_parallel.py: torch's own ``DistributedSampler``, hand products, a bisection on the
trade-off curve; quiz/routes/pipeline.py: meta tensors' sizes, sends counted stage by stage) catches it."""

from __future__ import annotations

import pytest

from mlsys_nb import quiz
from mlsys_nb.parallel import data as pdata

NEW = (
    "data_parallel.samples_per_rank",
    "data_parallel.sampler_padding",
    "data_parallel.accumulation_steps",
    "data_parallel.tokens_per_step",
    "data_parallel.critical_batch_cost",
    "pipeline.boundary_bytes",
    "pipeline.pp_bytes_per_rank",
    "pipeline.tp_over_pp_bytes",
)


def _worked_fails(name, seeds=range(24)) -> list[int]:
    """Seeds whose worked solution (the second route) fails the family's check."""
    from mlsys_nb.quiz import routes

    return [s for s in seeds if not (q := quiz.make(name, s)).check(routes.worked_response(q)).ok]


@pytest.mark.parametrize("name", NEW)
def test_the_new_families_pass_by_their_second_routes(name):
    assert _worked_fails(name) == []


def _floor_always(n, world, drop_last=False):
    return n // world  # the padding forgotten: every rank reads ⌊N/W⌋ even without drop_last


def _recipe_without_dp(global_batch, dp, micro_batch=1, seq_len=1):
    return pdata.BatchRecipe(dp, global_batch // micro_batch, micro_batch, seq_len)  # dp left out of the division


def _swapped_tradeoff(batch, noise_scale):
    return 1 + batch / noise_scale, 1 + noise_scale / batch  # steps and examples swapped


BROKEN = {
    "sampler without padding": ("data_parallel.samples_per_rank", pdata, "samples_per_rank", _floor_always),
    "padding as the remainder": ("data_parallel.sampler_padding", pdata, "samples_per_rank", _floor_always),
    "accumulation without dp": ("data_parallel.accumulation_steps", pdata, "decompose_batch", _recipe_without_dp),
    "tokens of one rank": (
        "data_parallel.tokens_per_step",
        pdata.BatchRecipe,
        "tokens",
        property(lambda r: r.per_rank * r.seq_len),
    ),
    "steps and examples swapped": (
        "data_parallel.critical_batch_cost",
        pdata,
        "critical_batch_tradeoff",
        _swapped_tradeoff,
    ),
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_data_key_fails_its_worked_solutions(monkeypatch, what):
    name, owner, attr, broken = BROKEN[what]
    monkeypatch.setattr(owner, attr, broken)
    assert len(_worked_fails(name)) >= 6, f"a key broken by {what!r} passed its worked solutions"


def test_a_broken_boundary_key_fails_its_worked_solutions(monkeypatch):
    """Boundary bytes that ignore the dtype (always 2 B), a per-rank count without the gradients coming back,
    and TP bytes that forget the backward's all-reduces each fail the second routes."""
    import mlsys_nb.parallel.tensor as tensor
    from mlsys_nb import pipeline

    real_boundary, real_step, real_tp = pipeline.boundary_bytes, pipeline.pp_bytes_per_step, tensor.tp_bytes_per_layer
    monkeypatch.setattr(pipeline, "boundary_bytes", lambda mbs, s, h, dtype="bf16": real_boundary(mbs, s, h))
    assert len(_worked_fails("pipeline.boundary_bytes")) >= 6  # the fp32 draws

    def forward_only(p, m, mbs, seq_len, hidden, v=1, dtype="bf16"):
        return [m * (v - (r == p - 1)) * real_boundary(mbs, seq_len, hidden, dtype) for r in range(p)]

    monkeypatch.setattr(pipeline, "pp_bytes_per_step", forward_only)

    def sends_back(p):  # every rank but the first stage's: rank 0 holds a later stage only when interleaved
        return p["rank"] > 0 or p["v"] > 1

    sending_back = [s for s in range(24) if sends_back(quiz.make("pipeline.pp_bytes_per_rank", s).params)]
    assert len(sending_back) >= 12 and _worked_fails("pipeline.pp_bytes_per_rank") == sending_back
    monkeypatch.setattr(pipeline, "pp_bytes_per_step", real_step)
    monkeypatch.setattr(tensor, "tp_bytes_per_layer", lambda *a, **k: real_tp(*a, **k) / 2)
    assert _worked_fails("pipeline.tp_over_pp_bytes") == list(range(24))
