"""Notebook 05 under papermill with a world size that does not divide 2 (3 ranks)."""

import pytest
from nbrun import assert_exercises_passed, passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_05_runs_on_three_ranks():
    nb = run_notebook("05_data_parallelism.ipynb", world_size=3, seed=1, solutions=True)
    text = printed_text(nb)
    assert any(
        label.startswith("every variant on every rank equals single-process training") for label in passed_labels(nb)
    )
    assert "3 ranks" in text
    assert_exercises_passed(nb, 1)
