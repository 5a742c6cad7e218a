"""The int8 weight-only Triton matmul (``mlsys_nb.kernels.triton_int8``), interpreted on CPU tensors (compiled on
a GPU): equal to the matmul with the kit's dequantized int8 weights (``quant.quantize(w, "int8", group_size=-1)``)
on ragged shapes, batch 1-17, fp32 and bf16 activations; beside PyTorch's CPU kernel
``torch._weight_int8pack_mm`` on the same operands; and the same check fails on a kernel that applies the scales
per input channel or forgets them (the ``mistake`` argument)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from mlsys_nb.config import ArgumentError
from mlsys_nb.quant import int8_weights, quantize
import mlsys_nb.kernels  # noqa: F401  (at collection: sets TRITON_INTERPRET before any test imports triton)

DEV = "cuda" if torch.cuda.is_available() else "cpu"  # interpreted on CPU tensors, compiled on a GPU
TOL = 1e-5  # relative to the largest output: fp32 sums of exact products, in another order


@pytest.fixture(scope="module")
def ti():
    return pytest.importorskip("mlsys_nb.kernels.triton_int8")


def weight(n: int, k: int, seed: int = 0) -> torch.Tensor:
    """A [n, k] weight whose rows span 100x in magnitude (so each row's scale matters)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.02 * torch.logspace(-1, 1, n)[:, None]


def rel_err(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want.double()).abs().max() / want.double().abs().max()).item()


def test_equals_the_dequantized_matmul(ti):
    n, k = 37, 83  # neither a multiple of a tile
    w = quantize(weight(n, k), "int8", group_size=-1)
    assert w.nbytes == n * k + 4 * n  # int8 codes and one fp32 scale per output channel: ~half of bf16's 2·n·k
    g = torch.Generator().manual_seed(1)
    for dtype in (torch.float32, torch.bfloat16):
        for batch in (1, 5, 16, 17):
            x = torch.randn(batch, k, generator=g).to(dtype)
            want = F.linear(x.double(), w.dequantize().double())
            got = ti.int8_weight_only_matmul(x.to(DEV), w_on(w), out_dtype=torch.float32).cpu()
            assert rel_err(got, want) < TOL, (dtype, batch)
    out = ti.int8_weight_only_matmul(x.to(DEV).reshape(1, batch, k), w_on(w)).cpu()  # bf16 in, bf16 out
    assert out.dtype == torch.bfloat16 and out.shape == (1, batch, n)
    torch.testing.assert_close(out[0], want.bfloat16())


def w_on(w):
    return dataclasses.replace(w, codes=w.codes.to(DEV), scales=w.scales.to(DEV))


@pytest.mark.parametrize("mistake", ["scales_per_input", "no_scales"])
def test_the_check_catches_misapplied_scales(ti, mistake):
    """The equality check above, on a kernel with its scales per input channel or missing: it fails."""
    w = quantize(weight(48, 48, seed=2), "int8", group_size=-1)  # square: per-input scales index the same vector
    x = torch.randn(4, 48, generator=torch.Generator().manual_seed(3))
    want = F.linear(x.double(), w.dequantize().double())
    assert rel_err(ti.int8_weight_only_matmul(x.to(DEV), w_on(w)).cpu(), want) < TOL
    assert rel_err(ti.int8_weight_only_matmul(x.to(DEV), w_on(w), mistake=mistake).cpu(), want) > 100 * TOL


def test_beside_torch_weight_int8pack_mm(ti):
    """PyTorch's CPU int8 weight-only kernel on the same operands (bf16 activations and scales): equal up to the
    last bf16 rounding. Its codes from ``quant.int8_weights`` are the kit quantizer's; K is a multiple of 16,
    which the CPU kernel needs (other K crash it)."""
    n, k = 37, 80
    w = quantize(weight(n, k, seed=4), "int8", group_size=-1)
    q, s = int8_weights(weight(n, k, seed=4))
    assert torch.equal(q, w.codes) and torch.equal(s, w.scales.bfloat16())
    x = torch.randn(3, k, generator=torch.Generator().manual_seed(5)).bfloat16()
    torch_out = torch._weight_int8pack_mm(x, q, s)
    ours = ti.int8_weight_only_matmul(x.to(DEV), w_on(dataclasses.replace(w, scales=s))).cpu()
    torch.testing.assert_close(ours, torch_out)  # bf16: within about one rounding step
    assert rel_err(ours, torch_out) < 2**-7


def test_bad_input_names_the_parameter(ti):
    w = quantize(weight(16, 32), "int8", group_size=-1)
    x = torch.randn(2, 32)
    with pytest.raises(ArgumentError, match="mistake"):
        ti.int8_weight_only_matmul(x, w, mistake="scales_per_row")
    with pytest.raises(ArgumentError, match="w must be"):
        ti.int8_weight_only_matmul(x, quantize(weight(16, 32), "int8"))  # one scale per tensor
    with pytest.raises(ArgumentError, match="w must be"):
        ti.int8_weight_only_matmul(x, quantize(weight(16, 32), "int4", group_size=16))
    with pytest.raises(ArgumentError, match=r"x must be \[\.\.\., 32\]"):
        ti.int8_weight_only_matmul(torch.randn(2, 31), w)
    with pytest.raises(ArgumentError, match="square"):
        ti.int8_weight_only_matmul(x, w, mistake="scales_per_input")


@pytest.mark.parametrize("name", ["triton_int8", "triton_fused"])
def test_without_triton_the_import_error_names_the_extra(monkeypatch, name):
    """Triton is an optional extra (``mlsys_nb.kernels`` itself never imports it): without it, the module says how
    to install it."""
    import importlib
    import sys

    monkeypatch.setitem(sys.modules, "triton", None)  # what an install without the extra looks like
    monkeypatch.setitem(sys.modules, "triton.language", None)
    for mod in ("triton_kernels", name):
        monkeypatch.delitem(sys.modules, f"mlsys_nb.kernels.{mod}", raising=False)
    with pytest.raises(ImportError, match=r"pip install -e \.\[kernels\]"):
        importlib.import_module(f"mlsys_nb.kernels.{name}")
