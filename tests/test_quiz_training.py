"""The quiz topic ``training`` (notebook 25): each family's worked response (quiz/routes/training.py, never
``mlsys_nb.training``) passes its check, and a key whose idea is broken fails that second route."""

from __future__ import annotations

import math

import pytest

from mlsys_nb import quiz
from mlsys_nb.quiz import routes
from mlsys_nb.quiz.bank import training as bank

SEEDS = range(24)


def _worked_ok(name) -> list[bool]:
    return [quiz.make(name, s).check(routes.worked_response(quiz.make(name, s))).ok for s in SEEDS]


def test_the_topic_has_its_families():
    """The families and the one card of the topic (a family added or dropped shows here by name)."""
    assert quiz.families("training") == [
        "cards.magnitude_pruning",
        "training.bits_per_token",
        "training.distill_loss",
        "training.lsh_probability",
        "training.lsh_threshold",
        "training.packing_fill",
        "training.perplexity",
        "training.response_share",
    ]


@pytest.mark.parametrize("name", [f for f in quiz.families("training") if f.startswith("training.")])
def test_training_families_by_their_worked_routes(name):
    assert all(_worked_ok(name)), name


def _train_on_every_token(real):
    def format_chat(record):  # every token a target: the prompt and the template too
        ids, _ = real(record)
        return ids, [1] * len(ids)

    return format_chat


BROKEN = {  # the idea a key gets wrong -> (family, the bank's name for the owner, real owner -> broken owner)
    "perplexity as 2^loss": ("training.perplexity", "perplexity", lambda real: lambda loss: 2**loss),
    "bits = nats": ("training.bits_per_token", "bits_per_token", lambda real: lambda loss: loss),
    "one band only": ("training.lsh_probability", "lsh_probability", lambda real: lambda j, rows, bands: j**rows),
    "rows and bands swapped": (
        "training.lsh_threshold",
        "lsh_threshold",
        lambda real: lambda rows, bands: real(bands, rows),
    ),
    "a mask that trains on the prompt": ("training.response_share", "format_chat", _train_on_every_token),
}


def _break(monkeypatch, what):
    name, attr, breaker = BROKEN[what]
    monkeypatch.setattr(bank, attr, breaker(getattr(bank, attr)))
    return name


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_a_broken_key_fails_the_worked_solution(monkeypatch, what):
    name = _break(monkeypatch, what)
    assert not all(_worked_ok(name)), f"a key broken by {what!r} passed its worked solutions"


def test_packing_route_catches_a_fill_that_pads_each_document(monkeypatch):
    """A key that pads every document to its own row (no packing) fails the greedy walk."""
    monkeypatch.setattr(bank, "pack", lambda docs, seq_len: {"fill": sum(map(len, docs)) / (len(docs) * seq_len)})
    assert not all(_worked_ok("training.packing_fill"))


def test_distillation_route_catches_a_loss_without_t_squared(monkeypatch):
    """A key without the T² factor fails the hand softmax at T = 2 and 4 (T = 1 draws still agree)."""
    real = bank.distill_loss
    monkeypatch.setattr(bank, "distill_loss", lambda s, t, temperature: real(s, t, temperature) / temperature**2)
    qs = [quiz.make("training.distill_loss", s) for s in SEEDS]
    ok = [q.check(routes.worked_response(q)).ok for q in qs]
    assert all(ok[i] == (q.params["T"] == 1) for i, q in enumerate(qs))
    assert not all(ok)


def test_the_threshold_is_where_one_band_is_expected_to_agree():
    """At the threshold a pair's candidate probability is 1 − (1 − 1/b)^b, about 1 − 1/e: read off the owner."""
    from mlsys_nb.training import lsh_probability

    for rows, bands in bank.BANDS:
        t = bank.lsh_threshold(rows, bands)
        assert bands * t**rows == pytest.approx(1)
        assert float(lsh_probability(t, rows, bands)) == pytest.approx(1 - (1 - 1 / bands) ** bands)
        assert abs(float(lsh_probability(t, rows, bands)) - (1 - 1 / math.e)) < 0.03  # (1 − 1/b)^b → 1/e; b >= 8 here


def test_the_pruning_card_reads_the_record_and_its_route_judges_both_statements():
    """cards.magnitude_pruning: the bank's ratios (portability.csv) span what portability.md's table prints, and
    the route (which reads the table) says "false" of the misconception and "true" of the correction."""
    from mlsys_nb.quiz.bank import cards

    ratios = cards.recorded_pruning_ratios()
    assert len(ratios) >= 4 and max(ratios) < 0.5  # notebook 25's own check, held by every recorded run
    shown = set()
    for seed in range(16):
        q = quiz.make("cards.magnitude_pruning", seed)
        shown.add(q.params["shown"])
        assert routes.second_route(q) == q.answer == ("true" if q.params["shown"] == "correction" else "false")
    assert shown == {"misconception", "correction"}
    q = next(q for s in range(16) if (q := quiz.make("cards.magnitude_pruning", s)).answer == "true")
    assert f"{min(ratios):.3g} to {max(ratios):.3g}" in " ".join(q.solution)


def test_the_pruning_route_rejects_a_bound_the_record_breaks():
    """A correction claiming less than 1 % (below the recorded worst run) is judged false by the route."""
    from mlsys_nb.quiz.routes.registry import ROUTES

    q = next(q for s in range(16) if (q := quiz.make("cards.magnitude_pruning", s)).answer == "true")
    judge = ROUTES["cards.magnitude_pruning"]
    assert judge(dict(q.params, _text=q.text)) == "true"
    tighter = q.text.replace("less than 10%", "less than 1%")
    assert tighter != q.text and judge(dict(q.params, _text=tighter)) == "false"
