"""Second routes of the topic ``compute``: 6·N·D by hand and FLOPs counted by ``FlopCounterMode`` on
the real model's graph (meta device)."""

from __future__ import annotations

import dataclasses
from functools import cache

from .model import cfg_of, peak_bf16
from .registry import register_route


@register_route("flops.training_days")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (p["n_gpus"] * peak_bf16(p["gpu"]) * p["mfu"]) / 86400


@register_route("flops.training_flops")
def _(p):
    return 6 * p["n_params"] * p["tokens"]


@register_route("flops.mfu")
def _(p):
    return p["tokens_per_s"] * 6 * p["n_params"] / (p["n_gpus"] * peak_bf16(p["gpu"]))


@register_route("flops.gpu_hours", "flops.cost_usd")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (peak_bf16(p["gpu"]) * p["mfu"]) / 3600 * p.get("price", 1.0)


@register_route("flops.implied_mfu")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (p["gpu_hours"] * 3600 * peak_bf16(p["gpu"]))


@cache
def _counted(cfg, seq_len: int) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ...models import Transformer

    with torch.device("meta"):  # a longer position table (GPT-2) adds no FLOPs: it is a lookup
        net = Transformer(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, seq_len)))
        x = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as fc:
        net(x, x).backward()
    return fc.get_total_flops()


@cache
def counted_flops_per_token(model: str, seq_len: int) -> float:
    """Forward + backward FLOPs per token counted by FlopCounterMode on the meta-device model (the
    1- and 2-layer models; each further layer adds the difference), with the masked half of the
    s × s attention scores removed (a causal query sees (s + 1) / 2 keys, the counter counts s)."""
    cfg = cfg_of(model)
    one, two = _counted(cfg.replace(n_layers=1), seq_len), _counted(cfg.replace(n_layers=2), seq_len)
    counted = one + (cfg.n_layers - 1) * (two - one)
    masked = 3 * cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * (seq_len - (seq_len + 1) / 2)
    return counted / seq_len - masked


@register_route("flops.flops_per_token")
def _(p):
    """FLOPs counted by FlopCounterMode on the real model's graph (meta device)."""
    return counted_flops_per_token(p["model"], p["seq_len"])
