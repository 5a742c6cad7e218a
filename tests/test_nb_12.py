"""Notebook 12 under papermill with 8 ranks and the worked solutions (the defaults run under nbval)."""

import pytest

from nbrun import passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_putting_parallelism_together_eight_ranks_with_solutions():
    # n_boot=4: the calibration's bootstrap with another (smaller) number of refits than the default 20
    nb = run_notebook("12_putting_parallelism_together.ipynb", world_size=8, solutions=True, seed=1, n_boot=4)
    text = printed_text(nb)
    labels = passed_labels(nb)

    def recorded(start):
        return any(label.startswith(start) for label in labels)

    assert recorded("coordinates are row-major with tp fastest")
    assert "pp2 x dp2 x tp2" in text and "equal single-process training" in text
    assert "skipping the dp sync is caught" in text
    assert recorded("Llama 3 405B's published layout fits")
    assert recorded("DeepSeek-V3's published layout fits")
    assert "fit, 15 leave-one-out fits and 4 bootstrap fits" in text
    assert "within every bootstrap interval, both published layouts stay in the top 10" in labels
    assert "exercise 1: not attempted" in text and "exercise 2: not attempted" in text
    assert recorded("exercise 1 (solution)") and recorded("exercise 2 (solution)")
