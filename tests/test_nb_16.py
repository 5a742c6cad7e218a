"""Notebook 16 under papermill with another k, another seed and the worked solutions."""

import pytest
from nbrun import printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_16_runs_with_k_2_and_solutions():
    nb = run_notebook("16_speculative_and_structured_decoding.ipynb", k=2, seed=1, solutions=True)
    text = printed_text(nb)
    assert "k=2, seed=1" in text
    assert text.count("check passed") == 9, text
    assert "check passed: exercise 1 keeps the target's distribution" in text
    assert "check passed: exercise 2 matches the closed form" in text
    assert "not attempted" not in text


@pytest.mark.notebook
def test_notebook_16_rejects_a_bad_k():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"k=0: choose one of"):
        run_notebook("16_speculative_and_structured_decoding.ipynb", k=0)
