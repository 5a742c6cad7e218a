"""Notebook 19 under papermill with another world size and the worked solutions switched on."""

import pytest
from nbrun import other_capability, passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_19_runs_on_two_ranks_with_solutions():
    # under other CPU kernels than this machine's (other_capability: "default" on a vector CPU)
    nb = run_notebook("19_rlhf_systems.ipynb", capability=other_capability(), world_size=2, seed=1, solutions=True)
    text = printed_text(nb)
    labels = passed_labels(nb)
    for check in (
        "every path leaves the rollouts bit-equal",
        "bucketing cut the sync's peak",
        "sync/co-located runs are on-policy and identical step for step, async is exactly one step",
        "PPO raises the true reward with engine rollouts",
        "the 70B split sync equals the hand count",
        "exercise 1",
        "exercise 2",
    ):
        assert any(label.startswith(check) for label in labels), (check, labels)
    assert "not attempted" not in text
