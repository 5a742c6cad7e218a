"""Notebook 25 under papermill with another seed and the worked solutions, under a CPU capability other than the
native one: its trained and sampled checks (a transformer between its bounds, the leak, the search, pruning,
distillation) must hold on a learner's CPU too."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, recorded_checks, run_notebook

NB = "25_data_evaluation_and_compression.ipynb"


@pytest.mark.notebook
def test_notebook_25_runs_with_seed_1_and_solutions():
    nb = run_notebook(NB, capability=other_capability(), seed=1, solutions=True)
    text = printed_text(nb)
    assert "seed=1, steps=60, search_trials=8, search_steps=30, distill_steps=50, solutions=True" in text
    labels = passed_labels(nb)
    assert len(labels) == 8, labels  # six sections' checks and two exercises
    assert_exercises_passed(nb, 2)
    for start in (
        "the loss mask is 1 exactly on the assistant's tokens",
        "packed documents with the block-diagonal mask",
        "exact hashing removes the 10 exact copies; MinHash + LSH removes the 20 planted copies",
        "the transformer's held-out loss lies between the entropy floor and the unigram model",
        "the seeded search is reproducible trial by trial",
        "at 50 % sparsity magnitude pruning costs less held-out loss than random pruning",
    ):
        assert any(label.startswith(start) for label in labels), (start, labels)
    margins = {m["label"]: m for m in recorded_checks(nb, "margin")}
    assert len(margins) == 11, sorted(margins)
    assert all(m["room"] > 0 for m in margins.values()), margins
    # the leak is the point of section 4: the memorising model scores well below the entropy rate
    assert margins["leaky split: true model minus the 6-gram's loss"]["value"] > 0.3


@pytest.mark.notebook
def test_notebook_25_rejects_a_bad_search_budget():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"search_steps must be an int in 20\.\.200, got 5"):
        run_notebook(NB, search_steps=5)
