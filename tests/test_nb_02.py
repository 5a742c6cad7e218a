"""Notebook 02 under papermill with a non-default world size (the defaults run under nbval).

World size 5 is an odd ring: the even/odd fix has two even neighbours (ranks 4 and 0) and exercise 2
leaves a rank without a swap partner. The smallest ring (2 ranks, left and right neighbour the same
rank) runs in every run of the notebook: its ring-sum cell launches world sizes 2, 3 and world_size."""

import pytest

from nbrun import assert_exercises_passed, passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_point_to_point_odd_world_size():
    world_size = 5
    nb = run_notebook(
        "02_point_to_point.ipynb", world_size=world_size, quick=True, deadlock_timeout=2.0, solutions=True
    )
    text = printed_text(nb)
    assert "diagnosed: both ranks stuck in send" in text
    assert f"both fixes deliver the left neighbour's tensor on all {world_size} ranks" in text
    labels = passed_labels(nb)
    assert any(label.startswith("non-blocking = ") for label in labels)  # the overlap check (re-measured up to 3 times)
    assert_exercises_passed(nb, 2)
