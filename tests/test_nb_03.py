"""Notebook 03 under papermill with non-default parameters (7 ranks: odd, other sizes)."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_03_runs_on_7_ranks_with_other_sizes():
    # an odd world size once (the default run, 4 ranks, is executed by nbval)
    nb = run_notebook("03_collectives.ipynb", world_size=7, numels=[13, 999], seed=2, solutions=True)
    assert_exercises_passed(printed_text(nb), 2)
