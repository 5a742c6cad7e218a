"""Bytes of quantized models and of fine-tuning them (full, LoRA, QLoRA), as closed forms over a ``ModelConfig``.

- ``bits_per_weight(scheme, group_size=None, double_quant=False)``: stored bits per weight of ``formats.quantize``'s
  layouts (tested against ``QuantizedTensor.nbytes``): int8 8 + 32/g (per tensor: 8), int4 4 + 32/g (fp16
  scale and zero point, g = 128 by default), NF4 4 + 32/g (fp32 absmax, g = 64 by default) or with double
  quantization 4 + 8/g + 32/(256·g).
- ``quantized_weight_bytes(model, scheme, ...)``: the linear layers of the blocks at that format, the embedding,
  the LM head and the norms at ``other_dtype`` (the usual recipe: bitsandbytes, GPTQ and AWQ keep the head).
- ``lora_params(model, r)``: r·(in + out) summed over the adapted linear layers of every block (q, k, v, o,
  gate, up, down by default: QLoRA's "all linear layers").
- ``finetune_bytes(model, method, r=64)``: model states of a fine-tune, activations excluded: weights in
  ``dtype`` (bf16) or NF4, gradients in ``dtype`` and AdamW's two fp32 moments for the trainable parameters (the
  accounting of the QLoRA paper's figures: LLaMA-65B needs > 780 GB for 16-bit full fine-tuning, < 48 GB with
  QLoRA; tested). The formula's owner is ``memory.estimate`` (``TrainConfig(finetune=...)``, which also shards
  it over ZeRO/TP/PP and adds activations); ``finetune_bytes`` reads its model-state terms for one GPU.
- ``bits_per_weight`` lives in ``formats`` (the stored layout's owner) and ``linear_shapes`` / ``lora_params``
  call ``memory.block_linear_shapes`` / ``memory.lora_layer_params``; they are re-exported here.
"""

from __future__ import annotations

from ..config import FINETUNES, LORA_TARGETS, TrainConfig, as_model_config, check_choice, check_int, dtype_bytes
from ..memory import block_linear_shapes, block_linear_weights, estimate, lora_layer_params, param_count
from .formats import bits_per_weight

__all__ = ["bits_per_weight", "linear_shapes", "block_linear_params", "quantized_weight_bytes", "lora_params"]
__all__ += ["finetune_bytes", "LINEAR_NAMES", "METHODS"]

LINEAR_NAMES = LORA_TARGETS
METHODS = FINETUNES  # full, LoRA, QLoRA: config's fine-tuning methods


def linear_shapes(model) -> dict:
    """``{name: (in_features, out_features)}`` of one block's linear layers (dense models):
    ``memory.block_linear_shapes``."""
    return block_linear_shapes(as_model_config(model))


def block_linear_params(model) -> int:
    """Weights of the linear layers of all blocks (no embedding, no LM head, no norms, no biases)."""
    cfg = as_model_config(model)
    return int(cfg.n_layers * block_linear_weights(cfg))


def quantized_weight_bytes(
    model, scheme: str, group_size: int | None = None, double_quant: bool = False, other_dtype="bf16"
) -> float:
    """Bytes of ``model``'s weights with the blocks' linear layers in ``scheme`` and the rest in ``other_dtype``."""
    cfg = as_model_config(model)
    q = block_linear_params(cfg)
    return q * bits_per_weight(scheme, group_size, double_quant) / 8 + (param_count(cfg).total - q) * dtype_bytes(
        other_dtype
    )


def lora_params(model, r: int, targets=LINEAR_NAMES) -> int:
    """Trainable LoRA parameters: r·(in + out) for each targeted linear layer of every block
    (``memory.lora_layer_params`` times the layers)."""
    cfg = as_model_config(model)
    return int(cfg.n_layers * lora_layer_params(cfg, r, tuple(targets)))


_PRECISION_OF_DTYPE = {"bf16": "bf16-nomaster", "fp16": "bf16-nomaster", "fp32": "fp32"}


def finetune_bytes(
    model, method: str, *, r: int = 64, targets=LINEAR_NAMES, dtype="bf16", group_size: int = 64
) -> dict:
    """Model-state bytes of fine-tuning ``model`` by ``method`` ("full", "lora", "qlora") on one GPU, activations
    excluded: ``weights`` (frozen base or all weights; QLoRA: the blocks' linear layers in NF4 with double
    quantization), ``adapters`` (LoRA's A and B in ``dtype``), ``grads`` (``dtype``, trainable parameters only),
    ``optimizer`` (AdamW: two fp32 moments per trainable parameter) and ``total``. A thin caller of
    ``memory.estimate`` with ``TrainConfig(finetune=method, precision=...)`` (``dtype`` bf16/fp16:
    "bf16-nomaster", no fp32 master copy, as the QLoRA paper counts; fp32: "fp32")."""
    check_choice("method", method, METHODS)
    check_choice("dtype", dtype, _PRECISION_OF_DTYPE)
    check_int("r", r, 1)
    cfg = as_model_config(model)
    train = TrainConfig(
        precision=_PRECISION_OF_DTYPE[dtype],
        optimizer="adamw",
        finetune=method,
        lora_rank=r,
        lora_targets=tuple(targets),
        qlora_group_size=group_size,
    )
    est = estimate(cfg, train)
    if method == "full":
        weights, adapters = est.params, 0.0
    else:
        weights, adapters = est.detail["finetune"]["frozen_bytes"], est.detail["finetune"]["adapter_bytes"]
    out = dict(weights=weights, adapters=adapters, grads=est.grads, optimizer=est.optimizer)
    out["total"] = sum(out.values())
    return out
