"""Notebook 02 under papermill with non-default world sizes (the defaults run under nbval).

World size 2 exercises the smallest ring (left and right neighbour are the same rank) and 5 an
odd ring (the even/odd fix with two even neighbours, a rank without a swap partner)."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 5])
def test_point_to_point_other_world_sizes(world_size):
    nb = run_notebook(
        "02_point_to_point.ipynb", world_size=world_size, quick=True, deadlock_timeout=2.0, solutions=True
    )
    text = printed_text(nb)
    assert "diagnosed: both ranks stuck in send" in text
    assert f"both fixes deliver the left neighbour's tensor on all {world_size} ranks" in text
    assert "check passed: non-blocking = " in text  # the overlap check (re-measured up to 3 times)
    assert_exercises_passed(text, 2)
