"""Number formats and mixed precision: what fp32, tf32, bf16, fp16, fp8 and fp4 do to the numbers (notebook 22).

- ``formats``: ``format_info(name)`` derives each format's range and epsilon from its bit layout (exponent
  bits, mantissa bits, bias, special-value rule; tested against ``torch.finfo`` and every fp8 value; ``FORMATS``,
  ``BLOCK_FORMATS``, ``make_format`` for a layout of your own, ``relative_error``);
  ``round_to_format(x, name)`` rounds to the format's grid (equal bit for bit to torch's real bf16/fp16/fp8 casts,
  tested on random inputs; the simulation of tf32 and fp4, which have no CPU cast); ``cast``;
  ``stochastic_round`` (unbiased rounding to the same grid);
  ``block_quantize`` simulates the block-scaled MXFP8 / MXFP4 (32 elements, e8m0 scale) and NVFP4
  (16 elements, e4m3 scale) formats.
- ``scaler``: ``LossScaler``, dynamic loss scaling from scratch whose scales and skipped steps equal
  ``torch.amp.GradScaler("cpu")``'s (``scaler_trajectory`` runs both with infs injected; tested).
- ``fp8``: FP8 matmuls on ``torch._scaled_mm`` (real fp8 operands on CPU, emulated numerics): per-tensor
  current and delayed (amax history) scaling (``tensor_matmul``, ``amax_scale``, ``DelayedScaling``),
  DeepSeek-V3's 1×128 / 128×128 tile scaling (``tile_matmul``), on ``activations_with_outliers``, compared by
  ``relative_matmul_error``.
- ``recipes``: ``measure_optimizer_bytes`` runs one real optimizer step of the recipes torch builds on a CPU
  (``REAL_RECIPES``: fp32, and bf16-mixed with fp32 master weights) and counts the distinct storages torch
  allocated (parameters, gradients, master copies, ``optimizer.state``), compared with ``mlsys_nb.memory``'s
  bytes per parameter (``calculator_bytes``, ``bytes_mismatch``); a build without its master or with one moment
  fails that comparison. ``RecipeAdam`` / ``build_recipe(model, precision)``: an AdamW holding, for every recipe,
  tensors of the dtypes the calculator's bytes imply (``recipe_storage``; fp8 codes + 128×128 block scales for
  fp8-dsv3), a consistency check for the recipes a CPU cannot run (``measure_recipe``);
  ``model_state_bytes_per_param`` (the calculator's bytes per parameter) and ``fp8_scale_bytes``.
- ``checks``: notebook 22's checks on real runs, as functions a test runs with the idea broken:
  ``linear_output_dtypes`` + ``check_autocast_tracks_fp32`` (autocast ran the matmuls in bf16 and its loss curve
  stays near fp32's without repeating it), ``flat_grads`` + ``small_grad_error`` + ``check_loss_scale_restores``
  (a loss scale restores fp16's small gradients in a real fp16 backward).
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
    round_to_format,
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
from .checks import (
    check_autocast_tracks_fp32,
    check_loss_scale_restores,
    flat_grads,
    linear_output_dtypes,
    small_grad_error,
)
from .recipes import (
    REAL_RECIPES,
    RECIPES,
    Fp8Blocks,
    RecipeAdam,
    build_recipe,
    bytes_mismatch,
    calculator_bytes,
    fp8_scale_bytes,
    measure_optimizer_bytes,
    measure_recipe,
    model_state_bytes_per_param,
    recipe_storage,
)
from .scaler import LossScaler, scaler_trajectory

__all__ = [
    "BLOCK_FORMATS",
    "FORMATS",
    "REAL_RECIPES",
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
    "bytes_mismatch",
    "calculator_bytes",
    "cast",
    "check_autocast_tracks_fp32",
    "check_loss_scale_restores",
    "format_info",
    "flat_grads",
    "fp8_scale_bytes",
    "linear_output_dtypes",
    "make_format",
    "measure_optimizer_bytes",
    "measure_recipe",
    "model_state_bytes_per_param",
    "round_to_format",
    "quantize_tensor",
    "quantize_tiles",
    "recipe_storage",
    "relative_error",
    "relative_matmul_error",
    "representable_values",
    "scaler_trajectory",
    "small_grad_error",
    "stochastic_round",
    "tensor_matmul",
    "tile_matmul",
]
