"""Quantization and parameter-efficient fine-tuning: int8 / int4 / NF4, GPTQ and AWQ, LoRA and QLoRA (notebook 23).

- ``formats``: ``quantize(w, scheme, *, group_size=None)`` for "int8" (absmax), "int4" (groups with zero points,
  packed two per byte: ``pack_int4`` / ``unpack_int4``) and "nf4" (QLoRA's code book ``nf4_codebook()``, optional
  double quantization of the scales) returns a ``QuantizedTensor`` with ``.dequantize()`` and ``.nbytes`` (as
  stored); NF4 is equal to bitsandbytes' ``quantize_4bit``/``dequantize_4bit`` bit for bit, and the code book
  re-derived from normal quantiles (``nf4_from_quantiles``) matches the published table (tested).
- ``gptq`` and ``awq``: Hessian-aware rounding with error feedback, activation-aware channel scaling; each beats
  round to nearest (``rtn``) on a layer's output error (tested); ``apply`` runs them over a model's linear layers
  (``quantize_linears``, ``target_linears``, ``linear_inputs``; ``plant_outliers`` gives a model outlier features).
- ``lora``: ``LoRALinear`` (equal to ``peft``'s LoRA in outputs and gradients, tested), ``NF4Linear`` (QLoRA's
  frozen base), ``add_lora``, ``trainable_parameters``, ``state_bytes``.
- ``kv``: KV-cache quantization for the paged pool, KIVI's scheme (K per channel, V per token): ``quantize_kv``.
- ``outliers``: outlier channels (``channel_outliers``) and W8A8 int8 matmuls: naive vector-wise (``int8_matmul``),
  LLM.int8()'s decomposition (``llm_int8_matmul``), SmoothQuant (``smoothquant_matmul``).
- ``sizing``: closed forms: ``bits_per_weight`` (tested against ``.nbytes``), ``quantized_weight_bytes``,
  ``lora_params`` (tested against the module), ``finetune_bytes`` (full / LoRA / QLoRA model states, tested
  against the QLoRA paper's LLaMA-65B figures).
- ``speed``: int8 weights (``int8_weights``) through ``torch._weight_int8pack_mm`` timed against fp32 and bf16
  (interleaved, ``time_decode_matmuls``),
  ``vector_kernels()`` (whether a speed-up is to be expected on this CPU's kernels); the roofline's decode step
  with quantized weights (``weight_only_decode_cost``) and the speed-up bound (``decode_speedup_bound``).
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
from .outliers import channel_outliers, int8_matmul, llm_int8_matmul, smoothquant_matmul
from .sizing import bits_per_weight, finetune_bytes, lora_params, quantized_weight_bytes
from .speed import (
    decode_speedup_bound,
    int8_linear,
    int8_weights,
    time_decode_matmuls,
    vector_kernels,
    weight_only_decode_cost,
)
from .lora import LoRALinear, NF4Linear, add_lora, state_bytes, trainable_parameters
from .kv import KV_QUANT_DTYPES, dequantize_kv, quantize_kv

__all__ = [
    "KV_QUANT_DTYPES",
    "dequantize_kv",
    "quantize_kv",
    "AWQResult",
    "LoRALinear",
    "NF4Linear",
    "NF4_PUBLISHED",
    "QuantizedTensor",
    "add_lora",
    "awq",
    "bits_per_weight",
    "finetune_bytes",
    "lora_params",
    "quantized_weight_bytes",
    "channel_outliers",
    "decode_speedup_bound",
    "int8_linear",
    "int8_matmul",
    "int8_weights",
    "llm_int8_matmul",
    "smoothquant_matmul",
    "time_decode_matmuls",
    "vector_kernels",
    "weight_only_decode_cost",
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
