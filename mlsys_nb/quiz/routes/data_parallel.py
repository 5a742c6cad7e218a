"""Second routes of the topic ``data_parallel``: DDP and ZeRO bytes and times by hand."""

from __future__ import annotations

import math

from .registry import register_route


@register_route("data_parallel.ddp_bytes_per_step")
def _(p):
    return 2 * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@register_route("data_parallel.zero_bytes_per_step")
def _(p):
    return (3 if p["zero"] == 3 else 2) * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@register_route("data_parallel.zero3_vs_ddp_traffic")
def _(p):
    n = p["n"]
    return (3 * (n - 1) / n) / (2 * (n - 1) / n)  # RS + 2 AG vs RS + AG


@register_route("data_parallel.grad_allreduce_time")
def _(p):
    n = p["n"]
    return 2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * 2 * p["n_params"] / p["beta"]


@register_route("data_parallel.bucketing_speedup")
def _(p):
    n, S, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
    k = math.ceil(S / p["bucket"])
    lat, bw = 2 * (n - 1) * a, 2 * (n - 1) / n * S / b
    return (p["tensors"] * lat + bw) / (k * lat + bw)
