"""Notebook 06 under papermill on 3 ranks: shards need padding (unit sizes are not multiples of 3)."""
import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_06_runs_on_three_ranks_with_padding():
    nb = run_notebook("06_zero_and_fsdp.ipynb", world_size=3, big_dp=8, solutions=True)
    text = printed_text(nb)
    assert "match (up to padding)" in text, "with 3 ranks the unit sizes do not divide: the padding branch must run"
    assert "ZeRO-3 / ZeRO-1 = 1.5" in text
    assert_exercises_passed(text, 1)
