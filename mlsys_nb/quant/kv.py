"""KV-cache quantization: the int8 / fp8 (e4m3) codes and scales of a paged KV pool (``kv_cache_dtype="int8"|"fp8"``).

KIVI's scheme (Liu et al., 2024, arXiv:2402.02750): K per *channel* (K has outlier channels of steady magnitude,
KIVI §3; one fp32 scale per block, KV head and channel: the group is the block) and V per token (one fp32 scale
per token and KV head). A per-channel scale needs the whole group, and appending a token to a partly filled
block would change the block's channel max, so every append would re-round its earlier tokens (the error
compounds). KIVI keeps the recent tokens in full precision instead: ``inference.paged.PagedKVCache`` keeps the K
of a block in an fp32 *residual* until the block is full and computed, then quantizes it here once, from exact
values. The bytes these formats cost per block (scales included) are ``inference.kv_cache.kv_block_bytes``, the
one formula the engine sizes its pool with; the names of the formats and of the scale dtype live there too.

- ``quantize_kv(x, kind, dim)`` -> ``(codes, scales)``: absmax, one scale per slice along ``dim``.
- ``dequantize_kv(codes, scales, dtype, dim)``: ``codes * scales`` broadcast along ``dim``.
"""

from __future__ import annotations

import torch

from ..config import torch_dtype
from ..inference.kv_cache import KV_QUANT_KINDS, KV_RESIDUAL, KV_SCALE

__all__ = ["KV_QUANT_DTYPES", "KV_RESIDUAL_DTYPE", "KV_SCALE_DTYPE", "dequantize_kv", "quantize_kv"]

KV_QUANT_DTYPES = {kind: torch_dtype(kind) for kind in KV_QUANT_KINDS}  # the codes: int8, float8_e4m3fn
KV_SCALE_DTYPE = torch_dtype(KV_SCALE)  # K: one scale per (block, KV head, channel); V: one per (token, KV head)
KV_RESIDUAL_DTYPE = torch_dtype(KV_RESIDUAL)  # the full-precision K of blocks not yet quantized (the residual)


def quantize_kv(x: torch.Tensor, kind: str, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax quantization of K or V ``x`` to ``kind`` ("int8" or "fp8"), one scale per slice along ``dim``.

    ``dim=-1`` (head_dim): one scale per token and KV head (V's scheme); ``dim`` = the token axis of a
    block ``[..., block_size, n_kv_heads, head_dim]``: one scale per channel (K's scheme, KIVI).
    Returns ``(codes, scales)``: codes shaped like ``x`` (int8, or float8_e4m3fn), scales ``x``'s shape
    without ``dim`` (fp32), with ``x ~ codes * scales.unsqueeze(dim)``. int8 puts the slice's amax on 127
    (``quant.quantize`` with ``group_size=-1``: error <= amax / 254); fp8 puts it on e4m3's max 448 (the
    scale ``precision.fp8.amax_scale`` computes; relative error <= 2^-4 above the smallest normal)."""
    dim = dim % x.ndim
    if dim != x.ndim - 1:
        codes, scales = quantize_kv(x.movedim(dim, -1), kind)
        return codes.movedim(-1, dim), scales
    if kind == "int8":
        from .formats import quantize

        qt = quantize(x, "int8", group_size=-1)
        return qt.codes.view(x.shape), qt.scales.view(x.shape[:-1])
    if kind == "fp8":
        fp8 = KV_QUANT_DTYPES["fp8"]
        amax = x.float().abs().amax(dim=-1)
        s = torch.where(amax > 0, torch.finfo(fp8).max / amax, torch.ones_like(amax))  # fmax / amax (1 if all 0)
        return (x.float() * s[..., None]).to(fp8), 1 / s
    raise ValueError(f"kind={kind!r} is not a quantized KV dtype: use one of {tuple(KV_QUANT_DTYPES)}")


def dequantize_kv(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.float32, dim: int = -1) -> torch.Tensor:
    """``codes * scales`` (scales broadcast along ``dim``, as ``quantize_kv`` made them) in ``dtype``."""
    return (codes.float() * scales.unsqueeze(dim % codes.ndim)).to(dtype)
