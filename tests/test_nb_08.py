"""Notebook 08 under papermill with a non-default world size (the defaults run under nbval)."""
import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_pipeline_notebook_two_ranks():
    nb = run_notebook("08_pipeline_parallelism.ipynb", world_size=2, quick=True, solutions=True)
    text = printed_text(nb)
    assert "p = 2 ranks, m = 4 micro-batches" in text
    assert_exercises_passed(text, 1)
