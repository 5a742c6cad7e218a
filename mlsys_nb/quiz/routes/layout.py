"""Second routes of the topic ``layout``: α-β times by hand, ZeRO sizes by hand, FLOPs counted on the
graph, and the planner's search where the key evaluates each layout directly."""

from __future__ import annotations

from ... import hardware
from .compute import counted_flops_per_token
from .model import gpu_bytes, peak_bf16
from .registry import register_route


@register_route("layout.tp_within_node")
def _(p):
    nv = hardware.link("nvlink4")
    s, n = p["bytes"], p["tp"]
    inside = 2 * (n - 1) * nv.latency_s + 2 * (n - 1) / n * s / nv.per_direction_bytes_per_s
    across = 2 * (n - 1) * 10e-6 + 2 * (n - 1) / n * s / p["beta_inter"]
    return across / inside


@register_route("layout.smallest_zero_stage")
def _(p):
    n, dp = p["n_params"], p["dp"]
    cap = 0.5 * gpu_bytes(p["gpu"])
    sizes = [(2 + 2 + 12) * n, (2 + 2) * n + 12 * n / dp, 2 * n + 14 * n / dp, 16 * n / dp]
    fits = [z for z, b in enumerate(sizes) if b <= cap]
    return f"ZeRO-{fits[0]}" if fits else "none fits"


@register_route("layout.modelled_mfu")
def _(p):
    """Model FLOPs per step counted by FlopCounterMode on the real model's graph (meta device)."""
    flops_per_step = counted_flops_per_token(p["model"], 4096) * p["global_batch_tokens"]
    return flops_per_step / (p["gpus"] * peak_bf16(p["gpu"]) * p["step_s"])


@register_route("layout.fastest_layout")
def _(p):
    """Each candidate layout through the planner's search (its enumeration, rules and memory filter)
    pinned to that layout's degrees, where the key evaluates each layout directly."""
    from ... import planner
    from ..bank.layout import LAYOUTS

    steps = {}
    for name, lay in LAYOUTS.items():
        try:
            rows = planner.search(
                p["model"],
                gpus=p["gpus"],
                gpu=p["gpu"],
                global_batch_tokens=p["global_batch_tokens"],
                seq_len=4096,
                calibration=None,  # as the bank's key (mlsys_nb.quiz.bank.layout._evaluate)
                tp=[lay["tp"]],
                pp=[lay.get("pp", 1)],
                cp=[1],
                zero=lay["zero"],
                recompute="none",
                micro_batch=[1],
                schedules=[lay.get("schedule", "1f1b")],
                top=None,
            )
        except ValueError:  # nothing of this layout fits (or its rules reject it)
            continue
        steps[name] = float(rows.step_s.min())
    return min(steps, key=steps.get) if steps else "none fits"
