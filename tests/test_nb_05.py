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
    labels = passed_labels(nb)
    assert any(label.startswith("3 ranks read 4 = ceil(10/3) samples each") for label in labels)  # section 8
    assert any(
        label.startswith("(dp, accumulation, micro-batch) = (1,4,2), (2,2,2), (4,1,2) give the same")
        for label in labels
    )
    assert any(label.startswith("Llama 3 405B: 128 DP x 16 micro-batches") for label in labels)
    assert_exercises_passed(nb, 1)
