"""Notebook 01 under papermill with non-default world sizes and the exercise solutions
(the defaults, exercises not attempted, run under nbval)."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("world_size", [3, 8])
def test_first_distributed_program_other_world_sizes(world_size):
    nb = run_notebook("01_first_distributed_program.ipynb", world_size=world_size, quick=True, solutions=True)
    assert_exercises_passed(printed_text(nb), 2)
