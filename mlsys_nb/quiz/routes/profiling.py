"""Second routes of the topic ``profiling``: the same trace readings by hand, without ``runtime.profiling``."""

from __future__ import annotations

from itertools import accumulate

from .registry import register_route


@register_route("profiling.linear_backward_flops")
def _(p):
    return 2 * (2 * p["tokens"] * p["d_out"] * p["d_in"])


@register_route("profiling.overlap_fraction")
def _(p):
    end, merged = p["backward_end"], []
    for a, b in sorted(p["comm"]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    hidden = sum(max(0.0, min(b, end) - a) for a, b in merged)
    return hidden / sum(b - a for a, b in merged)


@register_route("profiling.step_peak_from_events")
def _(p):
    return max(accumulate(p["mb"])) * 1e6


@register_route("profiling.optimizer_state_appearance")
def _(p):
    return 2 * 4 * p["n_params"]
