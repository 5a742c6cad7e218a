"""Notebook 01 under papermill with a non-default world size and the exercise solutions
(the defaults, exercises not attempted, run under nbval).

One odd world size, 3: the even and odd groups differ in size and the halves of exercise 2 are
uneven (1 and 2 ranks), which the default 4 never shows. The deliberate hang is stopped after 2 s (4 s at the
defaults): the launch's timeout counts from the moment every rank has joined, and the ranks block in recv at once."""

import pytest

from nbrun import assert_exercises_passed, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_first_distributed_program_odd_world_size():
    nb = run_notebook("01_first_distributed_program.ipynb", world_size=3, quick=True, hang_timeout=2.0, solutions=True)
    assert_exercises_passed(nb, 2)
