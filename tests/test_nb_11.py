"""Notebook 11 under papermill with non-default parameters (the defaults run under nbval): another
preset and sequence length, another GPU and cluster, 3 ranks for the quick ladder, another seed, and the CPU
kernels of another capability (the quick ladder trains there)."""

import pytest

from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, recorded_checks, run_notebook


@pytest.mark.notebook
def test_compute_and_scaling_laws_notebook_other_preset_three_ranks():
    nb = run_notebook(  # under the other CPU kernels (ATEN_CPU_CAPABILITY=default on a vector CPU)
        "11_compute_and_scaling_laws.ipynb",
        capability=other_capability(),
        world_size=3,
        preset_name="llama-3.1-8b",
        seq_len=8192,
        gpu_name="H100-SXM",
        n_gpus=1024,
        mfu_assumed=0.35,
        seed=1,
        solutions=True,
    )
    text = printed_text(nb)
    assert "llama-3.1-8b: 8,030,261,248 parameters" in text  # Llama Team 2024 Table 3 shape, exact count
    assert "FlopCounterMode == formula, exactly, forward and backward" in text
    assert "runs on 3 ranks" in text
    assert_exercises_passed(nb, 2)
    assert "closed form OK" in text
    assert "all 4 fresh runs (seed 2) fall inside the stored fit's prediction band" in passed_labels(nb)
    margins = [m["label"] for m in recorded_checks(nb, "margin")]
    assert sum(label.startswith("fresh run") for label in margins) == 4, margins
