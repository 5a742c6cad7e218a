"""Why weight-only quantization speeds up decode: fewer weight bytes per token on a memory-bound step.

- ``int8_weights(w)``: per-output-channel absmax int8 weights and bf16 scales, the operands of the CPU kernel
  ``torch._weight_int8pack_mm(x_bf16, w_int8, scales)`` (``int8_linear``).
- ``time_decode_matmuls(out_features, in_features, batches, reps, stat)``: batch-b matmuls with fp32
  ``F.linear``, bf16 ``F.linear`` and int8 weights with bf16 activations, interleaved (each repeat runs every
  variant once, so a busy neighbour slows all of them alike); the median (or the fastest: ``stat="min"``) in
  seconds per call.
- ``vector_kernels()`` (``runtime.machine``'s, re-exported) -> (bool, why): whether PyTorch runs vector kernels
  on this CPU; without them ``torch._weight_int8pack_mm`` is a scalar loop, several times slower than fp32
  ``F.linear`` (on an AVX-512 machine under "default", 4096x4096: 12.5 ms against 3.0 ms at batch 1; 99-142 ms
  against 7.1 ms at batch 8, fastest of 15, ``data/measured/quant.md``), so speed-ups are asserted only with them.
- ``weight_only_decode_cost(model, gpu, *, bits_per_weight, ...)``: the roofline's decode step
  (``inference.roofline.decode_cost``, compute in ``dtype``) with the weights read at ``bits_per_weight``
  (scales included) instead; ``decode_speedup_bound(bits_per_weight, dtype)``: the ratio of weight bytes, the
  most a memory-bound step whose bytes are all weights can gain.
"""

from __future__ import annotations

import dataclasses
import time

import torch
import torch.nn.functional as F

from ..config import check_choice, check_int, check_number, dtype_bytes
from ..inference.roofline import decode_cost, matmul_params
from ..runtime.machine import vector_kernels  # noqa: F401  (re-exported: notebook 23 reads it here)
from ..runtime.timing import median
from .formats import quantize

__all__ = [
    "decode_speedup_bound",
    "int8_linear",
    "int8_weights",
    "time_decode_matmuls",
    "vector_kernels",
    "weight_only_decode_cost",
]


def int8_weights(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row absmax int8 weights [out, in] (int8) and their scales [out] (bf16): ``w ≈ q · s``; the codes of
    ``formats.quantize(w, "int8", group_size=-1)``, its fp32 scales rounded to bf16 (what the kernel takes)."""
    qt = quantize(w, "int8", group_size=-1)
    return qt.codes, qt.scales.bfloat16()


def int8_linear(x: torch.Tensor, q: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x @ (q · s)^T`` through ``torch._weight_int8pack_mm`` (bf16 activations and output)."""
    return torch._weight_int8pack_mm(x.bfloat16(), q, scales)


def time_decode_matmuls(
    out_features: int = 4096, in_features: int = 4096, batches=(1, 8), reps: int = 7, stat: str = "median"
) -> dict:
    """Seconds per call of each variant at each batch, the median of ``reps`` calls (``stat="min"``: the
    fastest, what a call costs when nothing interrupts it; a busy machine only adds time, a whole scheduler
    time slice at a time): ``{batch: {"fp32": s, "bf16": s, "int8": s}}``, the variants interleaved in every
    repeat (one warm-up call each first)."""
    check_choice("stat", stat, ("median", "min"))
    check_int("out_features", out_features, 1)
    check_int("in_features", in_features, 1)
    check_int("reps", reps, 1, 1000)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(out_features, in_features, generator=g) * 0.02
    wb = w.bfloat16()
    q, s = int8_weights(w)
    out = {}
    for b in batches:
        check_int("batch", b, 1)
        x = torch.randn(b, in_features, generator=g)
        xb = x.bfloat16()
        fns = {
            "fp32": lambda x=x: F.linear(x, w),
            "bf16": lambda xb=xb: F.linear(xb, wb),
            "int8": lambda xb=xb: torch._weight_int8pack_mm(xb, q, s),
        }
        times = {k: [] for k in fns}
        for f in fns.values():
            f()
        for _ in range(reps):
            for k, f in fns.items():
                t0 = time.perf_counter()
                f()
                times[k].append(time.perf_counter() - t0)
        out[b] = {k: median(v) if stat == "median" else min(v) for k, v in times.items()}
    return out


def weight_only_decode_cost(model, gpu, *, bits_per_weight: float, context: int = 1024, batch: int = 1, dtype="bf16"):
    """``decode_cost(model, gpu, context, batch=batch, dtype=dtype)`` with the matmul weights read at
    ``bits_per_weight`` bits each (weight-only quantization: compute and KV cache stay in ``dtype``)."""
    check_number("bits_per_weight", bits_per_weight, 0, 64, lo_open=True)
    c = decode_cost(model, gpu, context, batch=batch, dtype=dtype)
    saved = matmul_params(model, active=False) * (dtype_bytes(dtype) - bits_per_weight / 8)
    return dataclasses.replace(c, bytes=c.bytes - saved)


def decode_speedup_bound(bits_per_weight: float, dtype="bf16") -> float:
    """Bytes of a ``dtype`` weight over bytes of a quantized one: the speed-up bound of a memory-bound decode
    step whose bytes are all weights (16 / 4.25 ≈ 3.8 for int4 g128 against bf16)."""
    check_number("bits_per_weight", bits_per_weight, 0, 64, lo_open=True)
    return 8 * dtype_bytes(dtype) / bits_per_weight
