"""Notebook 21 under papermill with another seed and the worked solutions."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_21_runs_with_seed_1_and_solutions():
    nb = run_notebook("21_inside_one_gpu.ipynb", seed=1, compile=False, solutions=True)
    text = printed_text(nb)
    assert "seed=1, compile=False, solutions=True" in text
    assert text.count("check passed") == 11, text
    assert_exercises_passed(text, 2)
    assert "flash_attention equals SDPA" in text
