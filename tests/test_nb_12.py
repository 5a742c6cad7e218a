"""Notebook 12 under papermill with 8 ranks and the worked solutions (the defaults run under nbval)."""

import pytest

from nbrun import printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_putting_parallelism_together_eight_ranks_with_solutions():
    # n_boot=4: the calibration's bootstrap with another (smaller) number of refits than the default 20
    nb = run_notebook("12_putting_parallelism_together.ipynb", world_size=8, solutions=True, seed=1, n_boot=4)
    text = printed_text(nb)
    assert "check passed: coordinates are row-major with tp fastest" in text
    assert "pp2 x dp2 x tp2" in text and "equal single-process training" in text
    assert "skipping the dp sync is caught" in text
    assert "check passed: Llama 3 405B's published layout fits" in text
    assert "check passed: DeepSeek-V3's published layout fits" in text
    assert "fit, 15 leave-one-out fits and 4 bootstrap fits" in text
    assert "check passed: within every bootstrap interval, both published layouts stay in the top 10" in text
    assert "exercise 1: not attempted" in text and "exercise 2: not attempted" in text
    assert "check passed: exercise 1 (solution)" in text and "check passed: exercise 2 (solution)" in text
