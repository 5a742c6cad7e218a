"""Notebook 09 under papermill at another world size, seed and CPU capability with the worked solutions on
(the defaults, 2 ranks and solutions off, run under nbval): every check must pass with 4 ranks too, sizes
derived from ``world_size``, at seed 3 (where the former first-choice check failed) under the CPU kernels of
another capability, and the exercises' solutions must pass their own checks."""

import pytest
from nbrun import other_capability, passed_labels, printed_text, recorded_checks, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_experts_and_context_notebook_four_ranks_with_solutions():
    # under the other CPU kernels (ATEN_CPU_CAPABILITY=default on a vector CPU): section 2 trains routers
    nb = run_notebook(
        "09_experts_and_context.ipynb", capability=other_capability(), world_size=4, seed=3, solutions=True
    )
    text = printed_text(nb)
    assert "4 ranks; 8 experts, top-2" in text
    labels = passed_labels(nb)
    assert len(labels) == 11, labels  # 9 checks + 2 exercise solutions
    assert any(label.startswith("Switch-C's 2048 experts") for label in labels), labels
    margins = [m["label"] for m in recorded_checks(nb, "margin")]
    assert sum(label.startswith("load max/mean") for label in margins) == 4, margins
    assert "not attempted" not in text  # with solutions=True every exercise is solved, then checked
    assert "your merge equals attention over all keys" in text
    assert "your zig-zag layout matches the kit's" in text
    assert "EP on 4 ranks = the dense MoE" in text


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_rejects_an_unsupported_world_size():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match="world_size must be 2, 4 or 8, got 3"):
        run_notebook("09_experts_and_context.ipynb", world_size=3)
