"""Fine-tuning states: LoRA and QLoRA (Hu et al. 2021, arXiv:2106.09685; Dettmers et al. 2023, arXiv:2305.14314).

A block's linear shapes as one TP rank holds them, the adapters' parameters, and what a rank holds under
``TrainConfig(finetune=...)``: the frozen base (QLoRA: its linear weights in NF4) and the trainable adapters.
"""

from __future__ import annotations

from ..config import LORA_TARGETS, ArgumentError, ModelConfig, TrainConfig, check_int

_ROW_PARALLEL = ("o_proj", "down_proj")  # Megatron: input dimension split over TP; the others split the output


def block_linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """``{name: (in_features, out_features)}`` of one block's linear layers (dense models without MLA)."""
    cfg = model
    if cfg.is_moe or cfg.kv_lora_rank:
        raise ArgumentError(f"model must be a dense model without MLA for LoRA's closed forms, got {cfg.name!r}")
    h, q, kv, f = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.ffn_hidden
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "up_proj": (h, f)}
    shapes["down_proj"] = (f, h)
    if cfg.activation == "swiglu":
        shapes["gate_proj"] = (h, f)
    return shapes


def _rank_shapes(model: ModelConfig, tp: int) -> dict[str, tuple[float, float]]:
    """``block_linear_shapes`` as one TP rank holds them: column-parallel layers keep ``out/tp`` outputs (K and
    V: their KV heads, replicated past ``n_kv_heads`` as ``config.attention_params`` counts them), row-parallel
    ones ``in/tp``."""
    kv_heads_rank = model.n_kv_heads / tp if tp <= model.n_kv_heads else 1
    out = {}
    for name, (i, o) in block_linear_shapes(model).items():
        if name in _ROW_PARALLEL:
            out[name] = (i / tp, o)
        elif name in ("k_proj", "v_proj"):
            out[name] = (i, model.head_dim * kv_heads_rank)
        else:
            out[name] = (i, o / tp)
    return out


def block_linear_weights(model: ModelConfig, tp: int = 1) -> float:
    """Weights (elements, biases excluded) of one block's linear layers that one TP rank holds."""
    return sum(i * o for i, o in _rank_shapes(model, tp).values())


def lora_layer_params(model: ModelConfig, r: int, targets=LORA_TARGETS, tp: int = 1) -> float:
    """LoRA parameters (elements) one TP rank holds for one block: ``r·(in + out)`` per targeted linear layer
    (Hu et al. 2021, arXiv:2106.09685) with ``in``/``out`` as the rank holds them: on a column-parallel layer A
    (``in → r``) is replicated and B split with the output, on a row-parallel one A is split with the input and
    B (``r → out``) replicated."""
    check_int("r", r, 1)
    shapes = _rank_shapes(model, tp)
    unknown = [x for x in targets if x not in shapes]
    if unknown:
        raise ArgumentError(f"targets must be among {sorted(shapes)}, got {unknown}")
    return sum(r * (shapes[x][0] + shapes[x][1]) for x in targets)


def finetune_elements(model: ModelConfig, train: TrainConfig, n_rank: float, layers: int) -> dict[str, float]:
    """Elements one rank holds under ``train.finetune``, before ZeRO: ``frozen`` (in the parameter dtype),
    ``quantized`` (QLoRA: the blocks' linear weights, stored in NF4) and ``trainable``. ``n_rank``: the model's
    parameters on this rank (TP/PP/EP applied), ``layers``: its transformer layers."""
    t = train
    if t.finetune == "full":
        return dict(frozen=0.0, quantized=0.0, trainable=n_rank)
    trainable = layers * lora_layer_params(model, t.lora_rank, t.lora_targets, t.tp)
    quantized = layers * block_linear_weights(model, t.tp) if t.finetune == "qlora" else 0.0
    return dict(frozen=n_rank - quantized, quantized=quantized, trainable=trainable)


def nf4_bytes_per_weight(t: TrainConfig) -> float:
    """Bytes per NF4 weight with double quantization (QLoRA's base), from the format's owner."""
    from ..quant.formats import bits_per_weight

    return bits_per_weight("nf4", t.qlora_group_size, True) / 8
