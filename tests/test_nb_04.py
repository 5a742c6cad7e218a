"""Notebook 04 under papermill with non-default parameters (3 ranks, a short size list)."""
import pytest
from nbrun import run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_notebook_04_runs_with_other_parameters():
    # world sizes {2, 3}: a non-power of two; few repeats keep it short
    nb = run_notebook("04_communication_cost.ipynb", world_size=3,
                      sizes=[2**k for k in range(10, 20)], repeats=3, warmup=1)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "held-out median relative error" in text and "of the memory-copy bandwidth" in text
