"""Notebook 24 under papermill on 2 ranks (resumed on 3 and on 1 process), with more steps and the worked solutions,
under a CPU capability other than the native one (its simulated and timed checks must hold on a learner's CPU)."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, run_notebook

from mlsys_nb.runtime import parse_margins


@pytest.mark.notebook
def test_notebook_24_runs_on_2_ranks_with_solutions():
    nb = run_notebook(
        "24_checkpoints_and_failures.ipynb",
        capability=other_capability(),
        seed=1,
        world_size=2,
        steps=8,
        solutions=True,
    )
    text = printed_text(nb)
    assert "seed=1, world_size=2, steps=8, solutions=True" in text
    assert len(passed_labels(nb)) == 8, passed_labels(nb)
    assert_exercises_passed(nb, 2)
    assert "saved on 2 ranks, resumed on 3 and on 1 process" in text
    assert "process exited with signal SIGKILL" in text
    # the figures drawn (lost time against the checkpoint interval): the kernel checks each one's style
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert pngs == 1, pngs
    margins = {m["label"]: m for m in parse_margins(text)}
    assert sorted(margins) == [
        "async save: shortest stall / synchronous one",
        "resharded resumes: max relative difference",
        "resume without the optimizer state: max relative difference",
        "simulated loss: best other interval / loss at T*",
        "simulation vs exact formula: largest relative gap",
    ]
    assert all(m["room"] > 0 for m in margins.values()), margins
