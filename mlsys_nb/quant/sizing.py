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
  QLoRA; tested).
"""

from __future__ import annotations

from ..config import ArgumentError, as_model_config, check_choice, check_int, dtype_bytes
from ..memory import param_count
from .formats import DEFAULT_GROUP, DOUBLE_QUANT_BLOCK, SCHEMES

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
METHODS = ("full", "lora", "qlora")


def bits_per_weight(scheme: str, group_size: int | None = None, double_quant: bool = False) -> float:
    """Stored bits per weight of ``quantize(w, scheme, group_size=...)`` for a large tensor (codes + scales +
    zero points; the per-tensor constants vanish)."""
    check_choice("scheme", scheme, SCHEMES)
    g = DEFAULT_GROUP[scheme] if group_size is None else group_size
    if g is None:
        return 8.0
    check_int("group_size", g, 1)
    if scheme == "int8":
        return 8 + 32 / g
    if scheme == "int4":
        return 4 + (16 + 16) / g
    if double_quant:
        return 4 + 8 / g + 32 / (DOUBLE_QUANT_BLOCK * g)
    return 4 + 32 / g


def linear_shapes(model) -> dict:
    """``{name: (in_features, out_features)}`` of one block's linear layers (dense models)."""
    cfg = as_model_config(model)
    if cfg.is_moe or cfg.kv_lora_rank:
        raise ArgumentError(f"model must be a dense model without MLA for these closed forms, got {cfg.name!r}")
    h, q, kv, f = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.ffn_hidden
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "up_proj": (h, f)}
    shapes["down_proj"] = (f, h)
    if cfg.activation == "swiglu":
        shapes["gate_proj"] = (h, f)
    return shapes


def block_linear_params(model) -> int:
    """Weights of the linear layers of all blocks (no embedding, no LM head, no norms, no biases)."""
    cfg = as_model_config(model)
    return cfg.n_layers * sum(i * o for i, o in linear_shapes(cfg).values())


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
    """Trainable LoRA parameters: r·(in + out) for each targeted linear layer of every block."""
    cfg = as_model_config(model)
    check_int("r", r, 1)
    shapes = linear_shapes(cfg)
    unknown = [t for t in targets if t not in shapes]
    if unknown:
        raise ArgumentError(f"targets must be among {sorted(shapes)}, got {unknown}")
    return cfg.n_layers * sum(r * (shapes[t][0] + shapes[t][1]) for t in targets)


def finetune_bytes(
    model, method: str, *, r: int = 64, targets=LINEAR_NAMES, dtype="bf16", group_size: int = 64
) -> dict:
    """Model-state bytes of fine-tuning ``model`` by ``method`` ("full", "lora", "qlora"), activations excluded:
    ``weights`` (frozen base or all weights; QLoRA: the blocks' linear layers in NF4 with double quantization),
    ``adapters`` (LoRA's A and B in ``dtype``), ``grads`` (``dtype``, trainable parameters only), ``optimizer``
    (AdamW: two fp32 moments per trainable parameter) and ``total``."""
    check_choice("method", method, METHODS)
    cfg = as_model_config(model)
    p = param_count(cfg).total
    b = dtype_bytes(dtype)
    if method == "full":
        weights, trainable, adapters = p * b, p, 0.0
    else:
        trainable = lora_params(cfg, r, targets)
        adapters = trainable * b
        if method == "lora":
            weights = p * b
        else:
            weights = quantized_weight_bytes(cfg, "nf4", group_size, True, other_dtype=dtype)
    out = dict(weights=weights, adapters=adapters, grads=trainable * b, optimizer=8.0 * trainable)
    out["total"] = sum(out.values())
    return out
