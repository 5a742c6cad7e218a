"""Notebook 05b under papermill on 3 ranks, another batch and seed, with the worked solutions."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_05b_runs_on_three_ranks_with_solutions():
    nb = run_notebook("05b_profiling.ipynb", world_size=3, batch=4, seed=1, solutions=True)
    text = printed_text(nb)
    assert "check passed: on all 3 ranks one all-reduce per bucket" in text
    assert text.count("check passed") == 7, text
    assert_exercises_passed(text, 2)


@pytest.mark.notebook
def test_notebook_05b_rejects_one_rank():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"world_size"):
        run_notebook("05b_profiling.ipynb", world_size=1)
