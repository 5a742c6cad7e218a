"""Notebook 16 under papermill with another k, another seed and the worked solutions."""

import pytest
from nbrun import passed_labels, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_16_runs_with_k_2_and_solutions():
    nb = run_notebook("16_speculative_and_structured_decoding.ipynb", k=2, seed=1, solutions=True)
    text = printed_text(nb)
    labels = passed_labels(nb)
    assert "k=2, seed=1" in text
    assert len(labels) == 9, labels
    assert "exercise 1 keeps the target's distribution" in labels
    assert "exercise 2 matches the closed form" in labels
    assert "not attempted" not in text


@pytest.mark.notebook
def test_notebook_16_rejects_a_bad_k():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"k must be an int in 1\.\.8, got 0"):
        run_notebook("16_speculative_and_structured_decoding.ipynb", k=0)
