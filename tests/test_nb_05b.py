"""Notebook 05b under papermill on 3 ranks, another batch and seed and the other CPU capability, with the worked
solutions."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, recorded_checks, run_notebook


@pytest.mark.notebook
def test_notebook_05b_runs_on_three_ranks_with_solutions():
    import torch

    # under the other CPU kernels (ATEN_CPU_CAPABILITY=default on a vector CPU): the timing checks hold there too
    nb = run_notebook(
        "05b_profiling.ipynb", capability=other_capability(), world_size=3, batch=4, seed=1, solutions=True
    )
    text = printed_text(nb)
    labels = passed_labels(nb)
    assert any(label.startswith("on all 3 ranks one all-reduce per bucket") for label in labels)
    gpu = torch.cuda.is_available()
    assert len(labels) == (7 if gpu else 6), labels  # 4 (+1 on a GPU) sections + 2 exercises
    assert gpu or "check skipped: section 4 reads CUDA kernels" in text
    margins = {m["label"]: m for m in recorded_checks(nb, "margin")}
    assert len(margins) == 4, margins
    assert margins["all-reduces overlapped, blocking in the hook"]["value"] == 0, margins
    assert_exercises_passed(nb, 2)
    # the figures drawn (the DDP timeline and the memory of two steps): the kernel checks each one's style
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert pngs == 2, pngs


@pytest.mark.notebook
def test_notebook_05b_rejects_one_rank():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"world_size must be an int in 2\.\.8, got 1"):
        run_notebook("05b_profiling.ipynb", world_size=1)
