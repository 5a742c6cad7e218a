"""Notebook 08 under papermill with a non-default, odd world size (the defaults run under nbval;
DualPipe needs an even p and is skipped with a message)."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_pipeline_notebook_three_ranks():
    nb = run_notebook("08_pipeline_parallelism.ipynb", world_size=3, quick=True, solutions=True)
    text = printed_text(nb)
    assert "p = 3 ranks, m = 6 micro-batches" in text
    assert_exercises_passed(text, 1)
