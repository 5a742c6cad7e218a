"""Notebook 23 under papermill with another seed, fewer training steps and the worked solutions."""

import pytest
from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
def test_notebook_23_runs_with_seed_1_and_solutions():
    # the fewest steps the notebook allows (40 and 10; the defaults train 80 and 30): every check must hold there too
    nb = run_notebook("23_quantization_and_lora.ipynb", seed=1, steps=40, ft_steps=10, solutions=True)
    text = printed_text(nb)
    assert "seed=1, steps=40, ft_steps=10, solutions=True" in text
    assert text.count("check passed") == 11, text
    assert_exercises_passed(text, 2)
    assert "QLoRA's fine-tune tracks LoRA's" in text


@pytest.mark.notebook
def test_notebook_23_rejects_a_bad_steps():
    import papermill as pm

    with pytest.raises(pm.PapermillExecutionError, match=r"steps must be an int in \[40, 400\]"):
        run_notebook("23_quantization_and_lora.ipynb", steps=5)
