"""Second routes of the topic ``checkpoint``: the interval found by searching a grid of intervals, the waste and
the failure cost summed term by term, bytes counted per state from the ZeRO paper's recipe, the GPU and link
read from ``data/hardware.yaml`` directly; never ``mlsys_nb.checkpoint`` or ``memory.bytes_per_param``."""

from __future__ import annotations

from .registry import register_route


@register_route("checkpoint.write_time")
def _(p):
    bf16_weights, fp32_master, adam_m, adam_v = 2, 4, 4, 4  # bytes per parameter (ZeRO §3, mixed-precision Adam)
    return p["n"] * (bf16_weights + fp32_master + adam_m + adam_v) / p["bw"]


@register_route("checkpoint.optimal_interval")
def _(p):
    c, m = p["c"], p["m"]
    lo, hi = c, 50 * m
    for _ in range(200):  # ternary search of the convex waste C/T + T/2M
        a, b = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        if c / a + a / (2 * m) < c / b + b / (2 * m):
            hi = b
        else:
            lo = a
    return (lo + hi) / 2


@register_route("checkpoint.lost_fraction")
def _(p):
    saving = p["c"] / p["t"]
    failures_per_second = 1 / p["m"]
    return saving + failures_per_second * (p["t"] / 2 + p["r"])


@register_route("checkpoint.job_mtbf")
def _(p):
    rate = p["n"] / (p["years"] * 365 * 86400)  # failures per second, summed over GPUs
    return 1 / rate


@register_route("checkpoint.restart_cost")
def _(p):
    failures_per_day = 24 * 3600 / p["m"]
    hours_each = (p["t"] / 2 + p["r"]) / 3600
    return failures_per_day * hours_each * p["n"]


@register_route("checkpoint.offload_traffic")
def _(p):
    grads_down = 2 * p["n"]
    params_up = 2 * p["n"]
    return grads_down + params_up


@register_route("checkpoint.offload_break_even")
def _(p):
    from ...config import load_yaml

    hw = load_yaml("hardware.yaml")
    peak = float(hw["gpus"][p["gpu"]]["peak_flops"]["bf16"])
    bw = float(hw["links"][p["link"]]["per_direction_bytes_per_s"])
    return 4 * peak * p["mfu"] / (6 * bw)
