"""Quantization and parameter-efficient fine-tuning: int8 / int4 / NF4, GPTQ and AWQ, LoRA and QLoRA (notebook 23).

- ``formats``: ``quantize(w, scheme, *, group_size=None)`` for "int8" (absmax), "int4" (groups with zero points,
  packed two per byte) and "nf4" (QLoRA's code book ``nf4_codebook()``, optional double quantization of the
  scales) returns a ``QuantizedTensor`` with ``.dequantize()`` and ``.nbytes`` (as stored); NF4 is equal to
  bitsandbytes' ``quantize_4bit``/``dequantize_4bit`` bit for bit, and the code book re-derived from normal
  quantiles (``nf4_from_quantiles``) matches the published table (tested).
- ``gptq`` and ``awq``: Hessian-aware rounding with error feedback, activation-aware channel scaling; each beats
  round to nearest (``rtn``) on a layer's output error (tested); ``apply`` runs them over a model's linear layers.
- ``lora``: ``LoRALinear`` (equal to ``peft``'s LoRA in outputs and gradients, tested), ``NF4Linear`` (QLoRA's
  frozen base), ``add_lora``, ``trainable_parameters``, ``state_bytes``.
"""

from .apply import linear_inputs, plant_outliers, quantize_linears, target_linears
from .awq import AWQResult, awq
from .formats import (
    NF4_PUBLISHED,
    QuantizedTensor,
    nf4_codebook,
    nf4_from_quantiles,
    pack_int4,
    quantize,
    unpack_int4,
)
from .gptq import gptq, hessian, rtn
from .lora import LoRALinear, NF4Linear, add_lora, state_bytes, trainable_parameters

__all__ = [
    "AWQResult",
    "LoRALinear",
    "NF4Linear",
    "NF4_PUBLISHED",
    "QuantizedTensor",
    "add_lora",
    "awq",
    "gptq",
    "hessian",
    "linear_inputs",
    "nf4_codebook",
    "nf4_from_quantiles",
    "pack_int4",
    "plant_outliers",
    "quantize",
    "quantize_linears",
    "rtn",
    "state_bytes",
    "target_linears",
    "trainable_parameters",
    "unpack_int4",
]
