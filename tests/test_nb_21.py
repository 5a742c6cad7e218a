"""Notebook 21 under papermill with another seed, the worked solutions and the compiled chain, under PyTorch's
kernels of another CPU capability (``other_capability()``: "default", the scalar kernels, on an x86 machine
with vector ones): the speed-up checks must say why they are not asserted there, every other check must hold,
and the compiled chain must compute eager's values from its own capability's inductor cache."""

import pytest
from nbrun import assert_exercises_passed, other_capability, passed_labels, printed_text, run_notebook

from mlsys_nb.runtime import parse_margins


@pytest.mark.notebook
def test_notebook_21_runs_with_seed_1_and_solutions_under_another_capability():
    cap = other_capability()
    nb = run_notebook("21_inside_one_gpu.ipynb", capability=cap, seed=1, compile=True, solutions=True)
    text = printed_text(nb)
    passes = passed_labels(nb)
    assert "seed=1, compile=True, solutions=True" in text
    assert len(passes) == 12, passes
    assert_exercises_passed(nb, 2)
    assert any(p.startswith("flash_attention equals SDPA") for p in passes), passes
    assert any(p.endswith("48 heads on 108 SMs take 2 splits") for p in passes), passes
    assert "lscpu" not in text
    # the figures drawn (cache hierarchy, roofline, attention's peak memory): the kernel checks each one's style
    pngs = sum("image/png" in o.get("data", {}) for c in nb.cells for o in c.get("outputs", []))
    assert pngs == 3, pngs
    labels = {m["label"] for m in parse_margins(text)}
    assert "matmul FLOP/s over add FLOP/s" in labels  # BLAS is vectorised under every capability
    if cap == "default":  # scalar kernels: the bandwidth and fusion speed-ups are printed with the reason
        assert "printed, not asserted" in text and text.count("not asserted: PyTorch's CPU kernels") == 2, text
        assert not labels & {"L2-sized read over DRAM-sized read", "compiled chain speed-up over eager"}, labels
        assert any(p.endswith("computes the same values as eager (speed-up printed only)") for p in passes), passes
    else:
        assert "L2-sized read over DRAM-sized read" in labels and "compiled chain speed-up over eager" in labels
