"""Notebook 22 under papermill with another seed, fewer training steps and the worked solutions, on PyTorch's
kernels of another CPU capability (``other_capability()``: "default" on a vector machine), as a learner's CPU would
run it: its checks on training and random data must hold there too."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, run_notebook

from mlsys_nb.runtime import parse_margins


@pytest.mark.notebook
def test_notebook_22_runs_with_seed_1_and_solutions_on_other_kernels():
    nb = run_notebook(
        "22_number_formats_and_mixed_precision.ipynb", capability=other_capability(), seed=1, steps=20, solutions=True
    )
    text = printed_text(nb)
    assert "seed=1, steps=20, solutions=True" in text
    assert len(passed_labels(nb)) == 9, passed_labels(nb)
    assert_exercises_passed(nb, 2)
    assert "LossScaler's scales and skipped steps equal GradScaler's" in text
    # the figures drawn (rounding error, loss curves and scales, FP8 outlier sweep): the kernel checks each one's style
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert pngs == 3, pngs
    labels = [m["label"] for m in parse_margins(text)]
    assert len(labels) == len(set(labels)) and "exercise 1: Kahan bf16 gap to the master" in labels, labels
    assert all(m["room"] > 0 for m in parse_margins(text))


@pytest.mark.notebook
def test_notebook_22_rejects_a_bad_steps():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"steps must be an int in 10\.\.200, got 5"):
        run_notebook("22_number_formats_and_mixed_precision.ipynb", steps=5)
