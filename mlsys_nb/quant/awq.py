"""The AWQ idea (Lin et al. 2023, arXiv:2306.00978): protect the weights that meet large activations.

Input channel j of a linear layer is multiplied by the activations' mean magnitude there; scaling that column
of W up by ``s_j`` before rounding (and the activations down by ``s_j``, folded into the previous operation in a
real model) shrinks its relative rounding error. ``s = mean|x|^α`` (normalised so that max·min = 1); ``α`` is
searched on a grid in [0, 1) for the smallest output error ``‖X W^T − X Q(W·s)^T/s‖²`` on calibration inputs.
Int4 groups with zero points as ``quantize(w, "int4", group_size=g)``'s; α = 0 is round to nearest.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ArgumentError, check_int
from .formats import QuantizedTensor, quantize


@dataclass
class AWQResult:
    """``quantized``: the int4 storage of ``W · s``; ``scales``: s per input channel (fp32; stored with the
    previous layer in a real model); ``alpha``: the exponent picked; ``errors``: output MSE per grid α."""

    quantized: QuantizedTensor
    scales: torch.Tensor
    alpha: float
    errors: dict

    def dequantize(self) -> torch.Tensor:
        """The effective weight ``Q(W · s) / s`` [out, in], float32."""
        return self.quantized.dequantize() / self.scales

    @property
    def nbytes(self) -> int:
        """The int4 storage plus the per-channel scales in fp16."""
        return self.quantized.nbytes + 2 * self.scales.numel()


def awq(w: torch.Tensor, x: torch.Tensor, *, group_size: int = 128, grid: int = 10) -> AWQResult:
    """Activation-aware int4 quantization of ``w`` [out, in] with calibration inputs ``x`` [..., in]."""
    check_int("grid", grid, 1, 1000)
    if x.shape[-1] != w.shape[1]:
        raise ArgumentError(f"x must end in in_features={w.shape[1]}, got shape {tuple(x.shape)}")
    x = x.reshape(-1, x.shape[-1]).float()
    w = w.detach().float()
    mag = x.abs().mean(dim=0).clamp(min=1e-6)
    ref = x @ w.T
    best = None
    errors = {}
    for k in range(grid):
        alpha = k / grid
        s = mag.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        q = quantize(w * s, "int4", group_size=group_size)
        err = float((x @ (q.dequantize() / s).T - ref).pow(2).mean())
        errors[alpha] = err
        if best is None or err < best[0]:
            best = (err, alpha, q, s)
    return AWQResult(best[2], best[3], best[1], errors)
