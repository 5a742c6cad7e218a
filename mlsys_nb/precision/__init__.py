"""Number formats and mixed precision: what fp32, tf32, bf16, fp16, fp8 and fp4 do to the numbers (notebook 22).

- ``formats``: ``format_info(name)`` derives each format's range and epsilon from its bit layout (exponent
  bits, mantissa bits, bias, special-value rule; tested against ``torch.finfo`` and every fp8 value);
  ``quantize(x, name)`` rounds to the format's grid (equal bit for bit to torch's real bf16/fp16/fp8 casts,
  tested on random inputs; the simulation of tf32 and fp4, which have no CPU cast); ``cast``;
  ``stochastic_round`` (unbiased rounding to the same grid);
  ``block_quantize`` simulates the block-scaled MXFP8 / MXFP4 (32 elements, e8m0 scale) and NVFP4
  (16 elements, e4m3 scale) formats.
- ``scaler``: ``LossScaler``, dynamic loss scaling from scratch whose scales and skipped steps equal
  ``torch.amp.GradScaler("cpu")``'s (``scaler_trajectory`` runs both with infs injected; tested).
- ``fp8``: FP8 matmuls on ``torch._scaled_mm`` (real fp8 operands on CPU, emulated numerics): per-tensor
  current and delayed (amax history) scaling, DeepSeek-V3's 1×128 / 128×128 tile scaling.
- ``recipes``: ``RecipeAdam`` / ``build_recipe(model, precision)``, an AdamW holding exactly what each
  ``TrainConfig.precision`` recipe stores (weights, gradients, fp32 master or not, moments, in the recipe's dtypes;
  fp8 codes + 128×128 block scales for fp8-dsv3); ``measure_recipe`` trains the kit's transformer with it and
  measures the bytes held, tested against ``mlsys_nb.memory.estimate`` (``model_state_bytes_per_param``).
"""

from .formats import (
    BLOCK_FORMATS,
    FORMATS,
    FormatInfo,
    block_bits_per_element,
    block_quantize,
    block_scale,
    cast,
    format_info,
    make_format,
    quantize,
    relative_error,
    representable_values,
    stochastic_round,
)
from .fp8 import (
    DelayedScaling,
    activations_with_outliers,
    amax_scale,
    quantize_tensor,
    quantize_tiles,
    relative_matmul_error,
    tensor_matmul,
    tile_matmul,
)
from .recipes import (
    RECIPES,
    Fp8Blocks,
    RecipeAdam,
    build_recipe,
    fp8_scale_bytes,
    measure_recipe,
    model_state_bytes_per_param,
)
from .scaler import LossScaler, scaler_trajectory

__all__ = [
    "BLOCK_FORMATS",
    "FORMATS",
    "RECIPES",
    "DelayedScaling",
    "FormatInfo",
    "Fp8Blocks",
    "LossScaler",
    "RecipeAdam",
    "activations_with_outliers",
    "amax_scale",
    "block_bits_per_element",
    "block_quantize",
    "block_scale",
    "build_recipe",
    "cast",
    "format_info",
    "fp8_scale_bytes",
    "make_format",
    "measure_recipe",
    "model_state_bytes_per_param",
    "quantize",
    "quantize_tensor",
    "quantize_tiles",
    "relative_error",
    "relative_matmul_error",
    "representable_values",
    "scaler_trajectory",
    "stochastic_round",
    "tensor_matmul",
    "tile_matmul",
]
