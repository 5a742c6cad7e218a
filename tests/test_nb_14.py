"""Notebook 14 under papermill with another block size, another seed and the worked solutions."""

import pytest
from nbrun import printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_14_runs_with_block_size_8_and_solutions():
    nb = run_notebook("14_kv_cache_management.ipynb", block_size=8, seed=1, solutions=True)
    text = printed_text(nb)
    assert "block_size=8, seed=1" in text
    assert text.count("check passed") == 9, text
    assert "every request wastes <= block_size - 1 = 7 slots" in text
    assert "check passed: exercise 1 matches the block manager" in text
    assert "check passed: exercise 2 matches the radix tree" in text
    assert "not attempted" not in text


@pytest.mark.notebook
def test_notebook_14_rejects_a_bad_block_size():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"block_size=3: choose one of \(1, 2, 4, 8, 16, 32\)"):
        run_notebook("14_kv_cache_management.ipynb", block_size=3)
