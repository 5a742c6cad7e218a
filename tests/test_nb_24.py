"""Notebook 24 under papermill on 2 ranks (resumed on 3 and on 1 process), with more steps and the worked solutions."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_24_runs_on_2_ranks_with_solutions():
    nb = run_notebook("24_checkpoints_and_failures.ipynb", seed=1, world_size=2, steps=8, solutions=True)
    text = printed_text(nb)
    assert "seed=1, world_size=2, steps=8, solutions=True" in text
    assert text.count("check passed") == 8, text
    assert_exercises_passed(text, 2)
    assert "saved on 2 ranks, resumed on 3 and on 1 process" in text
    assert "process exited with signal SIGKILL" in text
