"""Notebook 08 under papermill with a non-default, odd world size (the defaults run under nbval and
must run every schedule). DualPipe needs an even p: at p = 3 it is the one schedule the notebook
may skip, and only because ``allowed_skips`` names it; any other skip fails the notebook."""

import pytest

from nbrun import assert_exercises_passed, passed_labels, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_pipeline_notebook_three_ranks():
    nb = run_notebook(
        "08_pipeline_parallelism.ipynb", world_size=3, quick=True, solutions=True, allowed_skips="dualpipe"
    )
    text = printed_text(nb)
    assert "p = 3 ranks, m = 6 micro-batches" in text
    assert [line for line in text.splitlines() if line.startswith("skipping")] == [
        "skipping dualpipe: dualpipe needs an even number of ranks p, got p=3"
    ]
    assert_exercises_passed(nb, 1)
    labels = passed_labels(nb)  # section 10: bytes per boundary counted on the ranks, and beside TP and ZeRO-3
    assert "counted on 3 ranks for gpipe, 1f1b, interleaved-1f1b: each micro-batch sends 2,048 B" in " ".join(labels)
    assert any(label.startswith("405B at degree 8: PP sends 8.6 GB per rank per step") for label in labels)


@pytest.mark.notebook
def test_a_skipped_schedule_fails_the_notebook():
    """The check bites: at p = 3 DualPipe cannot run, and without allowed_skips that is an error
    (the notebook stops in its set-up cell, before any rank starts)."""
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="schedules skipped at p=3"):
        run_notebook("08_pipeline_parallelism.ipynb", world_size=3)
