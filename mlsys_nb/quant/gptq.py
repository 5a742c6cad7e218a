"""GPTQ (Frantar et al. 2022, arXiv:2210.17323): one-shot int4 rounding that feeds each column's error forward.

For a linear layer ``y = x W^T`` and calibration inputs ``X`` [n, in], the output error of a weight change
``ΔW`` is ``tr(ΔW H ΔW^T)`` with ``H = X^T X`` (the layer's Hessian, up to a factor 2). Rounding column j alone
leaves an error ``e_j``; the remaining columns ``k > j`` absorb it optimally by ``W[:, k] -= e_j · U[j, k] / U[j, j]``
where ``U`` is the upper Cholesky factor of ``H^{-1}``. Columns are visited in order, in lazy blocks of ``block``
columns (the updates to later blocks are applied once per block, a matmul). Int4 groups with zero points are the
same as ``quantize(w, "int4", group_size=g)``'s; each group's scale is chosen from the weights as updated when the
group starts. ``rtn(w, g)`` (round to nearest) is the baseline.
"""

from __future__ import annotations

import torch

from ..config import ArgumentError, check_int, check_number
from .formats import QuantizedTensor, from_int4_codes, int4_codes, int4_params, quantize


def rtn(w: torch.Tensor, group_size: int = 128) -> QuantizedTensor:
    """Round-to-nearest int4 with zero points in groups of ``group_size`` (the baseline GPTQ and AWQ beat)."""
    return quantize(w, "int4", group_size=group_size)


def hessian(x: torch.Tensor) -> torch.Tensor:
    """``X^T X / n`` in float64 for calibration inputs ``x`` [..., in] (the proxy Hessian of the layer)."""
    x = x.reshape(-1, x.shape[-1]).double()
    return x.T @ x / x.shape[0]


def gptq(
    w: torch.Tensor, x: torch.Tensor, *, group_size: int = 128, damp: float = 0.01, block: int = 128
) -> QuantizedTensor:
    """GPTQ int4 quantization of ``w`` [out, in] with calibration inputs ``x`` [..., in].

    ``damp``: fraction of the mean diagonal of ``H`` added to its diagonal (keeps the Cholesky stable);
    ``block``: columns per lazy batch (a multiple of ``group_size``). Returns a ``QuantizedTensor``
    (same storage as ``rtn``'s)."""
    out_f, in_f = w.shape
    check_int("group_size", group_size, 1, in_f)
    check_number("damp", damp, 0, 1)
    check_int("block", block, group_size, 1 << 20)
    if in_f % group_size or block % group_size:
        raise ArgumentError(f"group_size must divide in_features {in_f} and block {block}, got group_size={group_size}")
    if x.shape[-1] != in_f:
        raise ArgumentError(f"x must end in in_features={in_f}, got shape {tuple(x.shape)}")
    W = w.detach().double().clone()
    H = hessian(x)
    dead = torch.diag(H) == 0
    H[dead, dead] = 1.0
    W[:, dead] = 0.0
    H += damp * torch.diag(H).mean() * torch.eye(in_f, dtype=H.dtype)
    U = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(H)), upper=True)
    n_groups = in_f // group_size
    codes = torch.zeros(out_f, in_f)
    scales = torch.zeros(out_f, n_groups)
    zeros = torch.zeros(out_f, n_groups)
    for i1 in range(0, in_f, block):
        i2 = min(i1 + block, in_f)
        W1 = W[:, i1:i2].clone()
        E1 = torch.zeros_like(W1)
        U1 = U[i1:i2, i1:i2]
        for i in range(i2 - i1):
            col = i1 + i
            if col % group_size == 0:
                s, z = int4_params(W1[:, i : i + group_size].float())
                scales[:, col // group_size], zeros[:, col // group_size] = s, z
            q = int4_codes(W1[:, i : i + 1].float(), s, z)[:, 0]
            codes[:, col] = q
            err = (W1[:, i] - ((q - z) * s).double()) / U1[i, i]
            W1[:, i:] -= err[:, None] * U1[i, i:][None, :]
            E1[:, i] = err
        W[:, i2:] -= E1 @ U[i1:i2, i2:]
    return from_int4_codes(w.shape, group_size, codes.view(-1, group_size), scales.reshape(-1), zeros.reshape(-1))
