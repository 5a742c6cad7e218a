"""Notebook 01 under papermill with a non-default world size and the exercise solutions
(the defaults, exercises not attempted, run under nbval).

One odd world size, 3: the even and odd groups differ in size and the halves of exercise 2 are
uneven (1 and 2 ranks), which the default 4 never shows."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_first_distributed_program_odd_world_size():
    nb = run_notebook("01_first_distributed_program.ipynb", world_size=3, quick=True, solutions=True)
    assert_exercises_passed(printed_text(nb), 2)
