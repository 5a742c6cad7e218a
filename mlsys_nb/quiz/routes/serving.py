"""Second routes of the topic ``serving``: the hand roofline (batching, throughput, GPUs for a target),
paging and prefix sharing by hand, speculative decoding's geometric sum."""

from __future__ import annotations

import math

from .inference import roofline, sequences_that_fit
from .model import cfg_of, kv_per_token
from .registry import register_route


@register_route("serving.decode_throughput")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return p["batch"] / roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"]


@register_route("serving.batching_speedup")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    one = roofline(p["preset"], p["gpu"], 1, 1, 1024)["time"]
    return p["batch"] * one / roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["time"]


@register_route("serving.gpus_for_target")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device), batch doubled while it meets the rate."""
    best = None
    b = 1
    while b <= 1024 and sequences_that_fit(p["preset"], p["gpu"], p["context"]) >= b:
        t = roofline(p["preset"], p["gpu"], b, 1, p["context"])["time"]
        if t * p["per_user"] > 1:
            break
        best = b / t
        b *= 2
    return math.ceil(p["target"] / best)


@register_route("serving.paged_utilization")
def _(p):
    L, bs = p["lengths"], p["block_size"]
    return sum(L) / sum(math.ceil(x / bs) * bs for x in L)


@register_route("serving.prefix_sharing_savings")
def _(p):
    shared = (p["prefix"] // p["block_size"]) * p["block_size"]
    return (p["n"] - 1) * shared * kv_per_token(cfg_of(p["preset"]))


@register_route("serving.speculative_tokens_per_step")
def _(p):
    return sum(p["alpha"] ** i for i in range(p["k"] + 1))


@register_route("serving.speculative_speedup")
def _(p):
    return sum(p["alpha"] ** i for i in range(p["k"] + 1)) / (p["k"] * p["c"] + 1)


@register_route("serving.static_batching_utilization")
def _(p):
    return sum(p["lengths"]) / (len(p["lengths"]) * max(p["lengths"]))


@register_route("serving.overlap_scheduling_speedup")
def _(p):
    return (p["cpu_s"] + p["model_s"]) / max(p["cpu_s"], p["model_s"])
