"""Notebook 18 under papermill with another seed and the worked solutions switched on."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_18_runs_with_solutions_and_another_seed():
    nb = run_notebook("18_rlhf.ipynb", seed=1, solutions=True)
    text = printed_text(nb)
    for check in (
        "the SFT policy writes",
        "held-out accuracy",
        "PPO raised the true reward",
        "without KL the RM score is higher",
        "GRPO raised the true reward",
        "DPO raised the true reward",
        "all three methods beat the SFT policy",
        "7B on one GPU holds",
    ):
        assert f"check passed: {check}" in text, check
    assert_exercises_passed(text, 2)
