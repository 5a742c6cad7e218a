"""Notebook 14 under papermill with another block size, another seed and the worked solutions."""

import pytest
from nbrun import passed_labels, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_14_runs_with_block_size_8_and_solutions():
    nb = run_notebook("14_kv_cache_management.ipynb", block_size=8, seed=1, solutions=True)
    text = printed_text(nb)
    labels = passed_labels(nb)
    assert "block_size=8, seed=1" in text
    assert len(labels) == 9, labels
    assert "every request wastes <= block_size - 1 = 7 slots" in text
    assert "exercise 1 matches the block manager" in labels
    assert any(label.startswith("exercise 2 matches the radix tree") for label in labels), labels
    assert "not attempted" not in text


@pytest.mark.notebook
def test_notebook_14_rejects_a_bad_block_size():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"block_size must be 1, 2, 4, 8, 16 or 32, got 3"):
        run_notebook("14_kv_cache_management.ipynb", block_size=3)


def _cell_sources(name):
    import nbformat
    from nbrun import NOTEBOOKS

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    return {c.id: "\n".join(l for l in c.source.splitlines() if not l.startswith("%")) for c in nb.cells}


def test_hit_rate_check_fails_for_a_cache_that_ignores_capacity():
    """Section 7's own check cell, run on the hit rates of a cache that keeps every token whatever its
    capacity: it must raise (and pass on the real cache)."""
    from mlsys_nb.inference.radix import RadixCache

    class IgnoresCapacity(RadixCache):
        def __init__(self, capacity_tokens=None):
            super().__init__()  # the capacity is dropped: nothing is ever evicted

    cells = _cell_sources("14_kv_cache_management.ipynb")
    for cache, fails in ((RadixCache, False), (IgnoresCapacity, True)):
        ns = {}
        for cid in ("nb14-01", "nb14-02", "nb14-20"):  # parameters, imports, section 6's workload
            exec(cells[cid], ns)
        ns["RadixCache"] = cache
        exec(cells["nb14-23"], ns)  # section 7: the capacity sweep
        if fails:
            with pytest.raises(AssertionError, match="strictly fewer hits"):
                exec(cells["nb14-24"], ns)
        else:
            exec(cells["nb14-24"], ns)
