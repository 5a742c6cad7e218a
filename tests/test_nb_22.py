"""Notebook 22 under papermill with another seed, fewer training steps and the worked solutions."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_22_runs_with_seed_1_and_solutions():
    nb = run_notebook("22_number_formats_and_mixed_precision.ipynb", seed=1, steps=20, solutions=True)
    text = printed_text(nb)
    assert "seed=1, steps=20, solutions=True" in text
    assert text.count("check passed") == 9, text
    assert_exercises_passed(text, 2)
    assert "LossScaler's scales and skipped steps equal GradScaler's" in text


@pytest.mark.notebook
def test_notebook_22_rejects_a_bad_steps():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"steps must be an int in \[10, 200\]"):
        run_notebook("22_number_formats_and_mixed_precision.ipynb", steps=5)
