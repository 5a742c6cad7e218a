"""Second routes of the topic ``inference``: a hand roofline and hand KV-cache sizes on the real model's
weights (meta device), where the keys use ``inference.roofline`` and ``inference.kv_cache``."""

from __future__ import annotations

import math

from ... import hardware
from .model import BYTES, cfg_of, gpu_bytes, kv_per_token, model_counts
from .registry import register_route


def roofline(model, gpu, batch, new, context) -> dict:
    """Hand roofline (Williams et al. 2009): FLOPs = 2 × matmul weights × tokens + causal attention
    4·L·n_heads·head_dim per (query, key) pair; bytes = weights once + the cache read and written."""
    m = model_counts(model)
    cfg = m["cfg"]
    keys = new * context + new * (new + 1) / 2
    flops = 2 * m["linear"] * batch * new + batch * 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys
    nbytes = 2 * m["linear"] + batch * (context + new) * kv_per_token(cfg)
    g = hardware.gpu(gpu)
    peak, bw = g.peak("bf16"), g.hbm_bandwidth_bytes_per_s
    return dict(time=max(flops / peak, nbytes / bw), bound="compute" if flops / nbytes >= peak / bw else "memory")


def sequences_that_fit(model, gpu, context, tp=1, usable=0.9) -> int:
    """Full sequences whose bf16 cache fits next to the bf16 weights on each of ``tp`` GPUs."""
    m = model_counts(model)
    cfg = m["cfg"]
    budget = usable * gpu_bytes(gpu) - 2 * m["total"] / tp
    per_seq = math.ceil(kv_per_token(cfg) * context) / (1 if cfg.kv_lora_rank else min(tp, cfg.n_kv_heads))
    return max(0, math.floor(budget / per_seq))


@register_route("inference.kv_cache_bytes")
def _(p):
    return kv_per_token(cfg_of(p["preset"]), BYTES[p["dtype"]]) * p["tokens"]


@register_route("inference.kv_bytes_per_token")
def _(p):
    return kv_per_token(cfg_of(p["preset"]))


@register_route("inference.weight_bytes")
def _(p):
    """Parameters counted on the real model (meta device) × bytes per parameter."""
    return model_counts(p["preset"])["total"] * BYTES[p["dtype"]]


@register_route("inference.max_concurrent_sequences")
def _(p):
    """Weights counted on the real model (meta device) + a hand KV-cache size against the GPU."""
    return sequences_that_fit(p["preset"], p["gpu"], p["seq_len"], p["tp"])


@register_route("inference.fits_tp")
def _(p):
    """Weights counted on the real model (meta device) + a hand KV-cache size, tp = 1, 2, 4, 8 in turn."""
    for tp in (1, 2, 4, 8):
        if sequences_that_fit(p["preset"], p["gpu"], p["context"], tp) >= p["batch"]:
            return f"TP = {tp}"
    return "does not fit on 8 GPUs"


@register_route("inference.gqa_kv_saving")
def _(p):
    cfg = cfg_of(p["preset"])
    return kv_per_token(cfg.replace(n_kv_heads=cfg.n_heads)) / kv_per_token(cfg)


@register_route("inference.ridge_point")
def _(p):
    g = hardware.gpu(p["gpu"])
    return g.peak("bf16") / g.hbm_bandwidth_bytes_per_s


@register_route("inference.decode_step_time")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"]


@register_route("inference.prefill_time")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], p["prompt_len"], 0)["time"]


@register_route("inference.decode_bound")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["bound"]
