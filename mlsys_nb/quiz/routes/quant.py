"""Second routes of the topic ``quant``: bits counted from the stored layout, parameter counts of the real model
built on the meta device and its linear shapes written out by hand, without ``mlsys_nb.quant``'s calculators or
``inference.kv_cache_bytes``."""

from __future__ import annotations

from .model import cfg_of, kv_per_token, model_counts
from .registry import register_route


def _bits(p):
    """Bits per weight from the layout: the code, plus the group's constants over the group size."""
    g = p["g"]
    if p["scheme"] == "int8":
        return 8 + 32 / g
    if p["scheme"] == "int4":
        return 4 + (16 + 16) / g
    return 4 + (8 + 32 / 256) / g if p["dq"] else 4 + 32 / g


def _shapes(cfg):
    h, d = cfg.hidden, cfg.head_dim
    q, kv = cfg.n_heads * d, cfg.n_kv_heads * d
    f = cfg.ffn_hidden
    return {"q_proj": h + q, "k_proj": h + kv, "v_proj": h + kv, "o_proj": q + h, "gate_proj": h + f,
            "up_proj": h + f, "down_proj": f + h}  # fmt: skip


def _lora(model, r, targets):
    cfg = cfg_of(model)
    return cfg.n_layers * r * sum(_shapes(cfg)[t] for t in targets)


ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _base_split(model):
    """(block linear weights, every other parameter) from the meta-built model: its nn.Linear weights minus the
    untied LM head, and the rest."""
    c = model_counts(model)
    cfg = c["cfg"]
    block = c["linear"] - cfg.vocab_size * cfg.hidden
    return block, c["total"] - block


@register_route("quant.bits_per_weight")
def _(p):
    return _bits(p)


@register_route("quant.scale_share")
def _(p):
    code = 8 if p["scheme"] == "int8" else 4
    return 1 - code / _bits(p)


@register_route("quant.model_weight_bytes")
def _(p):
    block, rest = _base_split(p["model"])
    return block * _bits(p) / 8 + 2 * rest


@register_route("quant.kv_cache_int8_bytes")
def _(p):
    return kv_per_token(cfg_of(p["model"]), 1.0) * p["batch"] * p["ctx"]


@register_route("quant.lora_trainable_params")
def _(p):
    return _lora(p["model"], p["r"], p["targets"])


@register_route("quant.lora_state_bytes")
def _(p):
    return 12 * _lora(p["model"], p["r"], ALL)


def _qlora_total(model, r):
    block, rest = _base_split(model)
    return block * (4 + 8 / 64 + 32 / (64 * 256)) / 8 + 2 * rest + 12 * _lora(model, r, ALL)


@register_route("quant.qlora_bytes")
def _(p):
    return _qlora_total(p["model"], p["r"])


@register_route("quant.paged_optimizer_eviction")
def _(p):
    """Everything QLoRA holds (the layout's bits and the model's shapes by hand) plus the spike, minus the GPU."""
    return max(0.0, _qlora_total(p["model"], p["r"]) + p["spike_gb"] * 1e9 - p["mem"] * 1e9)


@register_route("quant.full_over_qlora")
def _(p):
    return 12 * model_counts(p["model"])["total"] / _qlora_total(p["model"], 64)


@register_route("quant.decode_speedup_bound")
def _(p):
    return (16 if p["dtype"] == "bf16" else 32) / _bits(p)


@register_route("quant.multi_lora_adapters")
def _(p):
    cfg = cfg_of(p["model"])
    free = p["mem"] * 1e9 - 2 * model_counts(p["model"])["total"] - kv_per_token(cfg, 2.0) * p["batch"] * p["ctx"]
    return free // (2 * _lora(p["model"], p["r"], p["targets"]))
