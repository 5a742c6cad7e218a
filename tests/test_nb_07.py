"""Notebook 07 under papermill with a non-default tensor-parallel degree (the defaults, t = 4, run
under nbval): every check cell must pass with t = 3 as well (3 does not divide 8 heads: the sizes derive
from t), with sizes derived from the parameters."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_tensor_parallelism_notebook_with_three_ranks():
    nb = run_notebook("07_tensor_parallelism.ipynb", world_size=3, seed=1, solutions=True)
    text = printed_text(nb)
    assert "t = 3 ranks" in text
    assert "equal the single-process model" in text
    assert_exercises_passed(nb, 2)


@pytest.mark.notebook
def test_notebook_rejects_an_unsupported_world_size():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"world_size must be an int in 2\.\.8, got 9"):
        run_notebook("07_tensor_parallelism.ipynb", world_size=9)
