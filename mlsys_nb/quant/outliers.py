"""Outlier features and the two answers to them: LLM.int8()'s decomposition and SmoothQuant's scale migration.

Large transformers develop a few hidden channels whose activations are 10-100× the rest, in every token
(Dettmers et al. 2022, arXiv:2208.07339). Int8 with one absmax scale per token row then spends its 255 levels on
the outlier and rounds everything else to a few levels. ``int8_matmul`` is that vector-wise W8A8 product (one
scale per row of X, one per output channel of W; int32 accumulation simulated exactly in float64);
``llm_int8_matmul`` keeps the columns holding a value above ``threshold`` in full precision and the rest in int8
(LLM.int8()); ``smoothquant_matmul`` divides channel j of X by ``s_j = max|X_j|^α / max|W_j|^(1−α)`` and multiplies
W's input column j by it (Xiao et al. 2022, arXiv:2211.10438), the same product with the difficulty moved into
the weights, then int8 for both. ``channel_outliers`` makes activations with such channels (a model, labelled).
"""

from __future__ import annotations

import torch

from ..config import check_int, check_number


def channel_outliers(m: int = 256, k: int = 512, channels: int = 4, magnitude: float = 60.0, *, seed: int = 0):
    """Float32 activations [m, k]: standard normal, with ``channels`` random columns ``magnitude``× larger."""
    check_int("channels", channels, 0, k)
    check_number("magnitude", magnitude, 1)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g)
    x[:, torch.randperm(k, generator=g)[:channels]] *= magnitude
    return x


def absmax_int8(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row-wise absmax int8: codes (float64 holding integers in [-127, 127]) and scales [rows, 1]."""
    s = (t.double().abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-12)
    return torch.round(t.double() / s), s


def int8_matmul(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``x @ w.T`` with x [m, k] and w [n, k] both in vector-wise int8 (float64 result)."""
    qx, sx = absmax_int8(x)
    qw, sw = absmax_int8(w)
    return (qx @ qw.T) * sx * sw.T


def llm_int8_matmul(x: torch.Tensor, w: torch.Tensor, threshold: float = 6.0) -> torch.Tensor:
    """LLM.int8(): columns of x with any ``|value| > threshold`` multiplied in full precision, the rest in int8."""
    check_number("threshold", threshold, 0, lo_open=True)
    big = (x.abs() > threshold).any(dim=0)
    out = x[:, big].double() @ w[:, big].double().T
    if (~big).any():
        out = out + int8_matmul(x[:, ~big], w[:, ~big])
    return out


def smoothquant_matmul(x: torch.Tensor, w: torch.Tensor, alpha: float = 0.5) -> torch.Tensor:
    """SmoothQuant: ``(x / s) @ (w · s).T`` in vector-wise int8, ``s_j = max|x_j|^α / max|w_j|^(1−α)``."""
    check_number("alpha", alpha, 0, 1)
    s = x.abs().amax(dim=0).clamp(min=1e-6).pow(alpha) / w.abs().amax(dim=0).clamp(min=1e-6).pow(1 - alpha)
    return int8_matmul(x / s, w * s)
