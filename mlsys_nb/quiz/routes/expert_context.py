"""Second routes of the topic ``expert_context``: EP and CP bytes and times by hand, MoE parameters
counted on the real MoE model (meta device)."""

from __future__ import annotations

from .model import cfg_of, meta_counts
from .registry import register_route


@register_route("expert_context.ep_bytes_per_layer")
def _(p):
    return 4 * p["top_k"] * p["tokens"] * p["hidden"] * (p["ep"] - 1) / p["ep"] * 2


@register_route("expert_context.ep_vs_tp_moe")
def _(p):
    return p["top_k"]


@register_route("expert_context.cp_causal_imbalance")
def _(p):
    return p["cp"]


@register_route("expert_context.ep_all_to_all_time")
def _(p):
    n, S = p["ep"], p["top_k"] * p["tokens"] * p["hidden"] * 2
    return (n - 1) * p["alpha"] + (n - 1) / n * S / p["beta"]


@register_route("expert_context.cp_ring_bytes")
def _(p):
    blk = 2 * p["b"] * p["seq_len"] // p["cp"] * p["n_kv_heads"] * p["head_dim"] * 2
    return (p["cp"] - 1 if p["pass"] == "forward" else 2 * p["cp"] - 1) * blk


@register_route("expert_context.moe_params")
def _(p):
    """Counted on the real MoE Transformer (meta device): active = total − the unused experts."""
    m = meta_counts(cfg_of("mixtral-8x7b").replace(n_experts=p["n_experts"], top_k=p["top_k"]))
    active = m["total"] - m["n_moe"] * (p["n_experts"] - p["top_k"]) * m["expert"]
    return {"total parameters": m["total"], "active parameters per token": active}.get(p["ask"], 2 * m["total"])
