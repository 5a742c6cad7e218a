"""An int8 weight-only matmul in Triton for decode (batch 1-16): why halving weight bytes speeds up a step.

A decode step multiplies a few activation rows (the batch, b = 1-16) by every weight matrix of the model. An
[N, K] weight in bf16 is 2·N·K bytes read from HBM for 2·b·N·K FLOPs: b FLOP per byte, far below a GPU's
ridge point (about 295 FLOP/byte for bf16 on an H100 SXM), so the step's time is its weight bytes over the
memory bandwidth, and the tensor cores mostly wait. Int8 weights with one fp32 scale per output channel
(the kit's quantizer, ``quant.quantize(w, "int8", group_size=-1)``: N·K + 4·N bytes) halve those bytes, so a
kernel that streams them at the same bandwidth takes up to half the time; what it adds (an int8 -> bf16
conversion in registers, one multiply per output) costs nothing on a step that waits on memory.

The kernel: one program per (block of ``BN`` output channels, block of ``BM`` activation rows). It streams its
``BN`` weight rows along K in ``BK``-wide int8 tiles, converts each tile to the activations' dtype in registers
(the int8 values -127..127 are exact in bf16), multiplies it with ``tl.dot`` accumulating in fp32, and scales
each output once at the end: a scale per output channel n is constant along the sum over k, so
``Σ_k x_k · (q_nk · s_n) = s_n · Σ_k x_k · q_nk``. A scale per *input* channel would not factor out; the
``mistake`` argument keeps that error (``"scales_per_input"``) and a forgotten scale (``"no_scales"``) so a
test can show that the equality check catches each.

On a GPU the tile sizes, ``num_warps`` and ``num_stages`` come from a small autotune list (per weight shape);
under Triton's interpreter (CPU, ``TRITON_INTERPRET=1``) the tiles are fixed and small, and the product runs in
fp32 (the interpreter holds bf16 as raw 16-bit integers, so a bf16 ``tl.dot`` there would multiply bit
patterns): the same sums, exactly, since a bf16 times an int8 is exact in fp32.
"""

from __future__ import annotations

import torch

from ..config import ArgumentError, check_choice
from ..quant.formats import QuantizedTensor
from .triton_kernels import INTERPRETED, tl, triton  # Triton, with TRITON_INTERPRET=1 set first where no CUDA

__all__ = ["MISTAKES", "int8_weight_only_matmul"]

MISTAKES = (None, "scales_per_input", "no_scales")  # None: the right kernel; the others: errors kept for tests
BM = 16  # activation rows per program: tl.dot's smallest tile; a decode batch of 1-16 is one block of rows
GPU_CONFIGS = [  # (BN, BK, num_warps, num_stages): small BN gives many programs on a thin [b, K] x [K, N]
    triton.Config({"BN": bn, "BK": bk}, num_warps=w, num_stages=s)
    for bn, bk, w, s in [
        (16, 256, 4, 4),
        (32, 128, 4, 4),
        (32, 256, 4, 3),
        (64, 128, 4, 4),
        (64, 256, 8, 3),
        (128, 128, 8, 3),
    ]
]
INTERPRETER_TILES = {"BN": 16, "BK": 32}  # small: every program is numpy work on the CPU


@triton.jit
def _int8_wo_kernel(
    x_ptr, q_ptr, s_ptr, out_ptr, M, N, K,
    BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, FP32_DOT: tl.constexpr, MISTAKE: tl.constexpr,
):  # fmt: skip
    rn = tl.program_id(0) * BN + tl.arange(0, BN)  # this program's output channels
    rm = tl.program_id(1) * BM + tl.arange(0, BM)  # its activation rows
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(x_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        q = tl.load(q_ptr + rn[:, None] * K + rk[None, :], mask=(rn[:, None] < N) & (rk[None, :] < K), other=0)
        if MISTAKE == 1:  # the error: the scales multiply the input channels
            q = q.to(tl.float32) * tl.load(s_ptr + rk, mask=rk < K, other=0.0).to(tl.float32)[None, :]
        if FP32_DOT:  # fp32 activations, or the interpreter (which cannot multiply bf16)
            acc += tl.dot(x.to(tl.float32), tl.trans(q.to(tl.float32)), input_precision="ieee")
        else:  # the tile converted to bf16/fp16 in registers (exact), tensor cores, fp32 accumulation
            acc += tl.dot(x, tl.trans(q.to(x.dtype)))
    if MISTAKE == 0:
        acc = acc * tl.load(s_ptr + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    out_mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(out_ptr + rm[:, None] * N + rn[None, :], acc.to(out_ptr.dtype.element_ty), mask=out_mask)


_tuned_kernel = _int8_wo_kernel if INTERPRETED else triton.autotune(GPU_CONFIGS, key=["N", "K"])(_int8_wo_kernel)


def int8_weight_only_matmul(
    x: torch.Tensor, w: QuantizedTensor, *, out_dtype: torch.dtype | None = None, mistake: str | None = None
) -> torch.Tensor:
    """``x @ w.dequantize().T`` for activations ``x`` [..., K] (bf16, fp16 or fp32) and int8 weights ``w`` [N, K]
    with one scale per output channel (``quant.quantize(weight, "int8", group_size=-1)``); fp32 accumulation,
    output [..., N] in ``out_dtype`` (default: ``x``'s dtype). ``mistake``: one of ``MISTAKES`` (tests only)."""
    check_choice("mistake", mistake, MISTAKES)
    if not isinstance(w, QuantizedTensor) or w.scheme != "int8" or w.group_size != -1 or len(w.shape) != 2:
        got = f"{w.scheme} group_size={w.group_size} shape={w.shape}" if isinstance(w, QuantizedTensor) else type(w)
        raise ArgumentError(f"w must be quantize(weight, 'int8', group_size=-1) of a 2-d weight, got {got}")
    n, k = w.shape
    if x.shape[-1] != k or x.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        raise ArgumentError(f"x must be [..., {k}] in bf16, fp16 or fp32, got {tuple(x.shape)} {x.dtype}")
    if mistake == "scales_per_input" and n != k:
        raise ArgumentError(f"mistake='scales_per_input' needs a square weight, got w of shape {w.shape}")
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=out_dtype or x.dtype, device=x.device)
    fp32_dot = INTERPRETED or x.dtype == torch.float32
    args = (x2, w.codes.contiguous(), w.scales.contiguous(), out, m, n, k)
    flags = {"BM": BM, "FP32_DOT": fp32_dot, "MISTAKE": MISTAKES.index(mistake)}
    if INTERPRETED:
        grid = (triton.cdiv(n, INTERPRETER_TILES["BN"]), triton.cdiv(m, BM))
        _tuned_kernel[grid](*args, **flags, **INTERPRETER_TILES)
    else:
        _tuned_kernel[lambda meta: (triton.cdiv(n, meta["BN"]), triton.cdiv(m, BM))](*args, **flags)
    return out.reshape(*x.shape[:-1], n)
