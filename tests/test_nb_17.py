"""Notebook 17 under papermill with another seed and the worked solutions switched on."""

import pytest
from nbrun import printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_17_runs_with_solutions_and_another_seed():
    nb = run_notebook("17_rl_fundamentals.ipynb", seed=1, solutions=True)
    text = printed_text(nb)
    for check in (
        "REINFORCE more than doubles",
        "return-to-go cuts the variance",
        "the hand-worked case, lambda = 1",
        "the actor-critic more than doubles",
        "the gradient vanishes exactly",
        "PPO reached 475",
        "exercise 1, my_gae equals",
        "exercise 2, my_clipped gives",
    ):
        assert f"check passed: {check}" in text, check
    assert "not attempted" not in text
