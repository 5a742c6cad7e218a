"""Notebook 10 under papermill with non-default parameters (the defaults run under nbval): another
preset (tied embeddings), another GPU, another sequence length and 3 ranks for the ZeRO section
(3 does not divide the units: the padding is modelled to the byte)."""

import pytest

from nbrun import assert_exercises_passed, printed_text, run_notebook


@pytest.mark.notebook
@pytest.mark.slow
def test_training_memory_notebook_other_preset_three_ranks():
    nb = run_notebook(
        "10_training_memory.ipynb",
        world_size=3,
        preset_name="llama-3.2-1b",
        gpu_name="A100-40GB-SXM",
        seq_len=2048,
        seed=1,
        solutions=True,
    )
    text = printed_text(nb)
    assert "llama-3.2-1b: 1,235,814,400 parameters" in text
    assert "3 ranks x 4 stages: measured per-rank model states equal mlsys_nb.memory to the byte" in text
    assert "the model equals the bytes autograd kept in every one" in text
    assert_exercises_passed(nb, 2)
