"""Second routes of the topic ``pipeline``: the closed forms where the keys use the simulator."""

from __future__ import annotations

import math

from .registry import ROUTES, register_route


def _pl_bubble_time(p):
    from ... import pipeline as pl

    bt = pl.closed_form(p["schedule"], p["p"], p["m"], p["v"], F=1.0, B=1.0, W=1.0)["bubble_time"]
    if bt is None:  # no closed form for this case: the simulated timeline's idle time, op by op
        r = pl.simulate(pl.schedule(p["schedule"], p["p"], p["m"], p["v"]), F=1.0, B=1.0, W=1.0)
        busy = sum(e - s for *_, s, e in r.rows())
        return r.makespan - busy / p["p"]
    return bt


@register_route("pipeline.bubble_fraction")
def _(p):
    """The schedule's closed-form bubble (the key runs the event simulator)."""
    bt = _pl_bubble_time(p)
    return bt / (3.0 * p["m"] + bt)


@register_route("pipeline.makespan")
def _(p):
    """Busy time + the schedule's closed-form bubble (the key runs the event simulator)."""
    return 3.0 * p["m"] + _pl_bubble_time(p)


@register_route("pipeline.bubble_ratio")
def _(p):
    """The schedule's closed-form bubble over the busy time (the key runs the event simulator)."""
    return _pl_bubble_time(p) / (3.0 * p["m"])


@register_route("pipeline.interleaving_gain")
def _(p):
    return p["v"]


@register_route("pipeline.min_microbatches")
def _(p):
    q, t = p["p"] - 1, p["target"]
    return max(1, math.ceil(q * (1 - t) / t - 1e-9))


@register_route("pipeline.best_schedule_for_memory")
def _(p):
    """Peaks and bubbles from the closed forms (the key reads them off the simulator)."""
    from ... import pipeline as pl

    rows = {}
    for name in ("gpipe", "1f1b", "zb-h2"):
        cf = pl.closed_form(name, p["p"], p["m"], None, F=1.0, B=1.0, W=1.0)
        rows[name] = (
            pl.peak_in_flight(name, p["p"], p["m"], None)[0],
            cf["bubble_time"] / (3 * p["m"] + cf["bubble_time"]),
        )
    return min(rows, key=lambda k: rows[k])


def _peak_acts(p):
    """In-flight micro-batches from the closed forms (the key counts them in the simulator)."""
    from ... import pipeline as pl

    if p["schedule"] == "gpipe":
        return p["m"]
    if p["schedule"] in ("1f1b", "zb-h1"):
        return min(p["p"], p["m"])
    return pl.peak_in_flight(p["schedule"], p["p"], p["m"], p["v"])[0]


for _name in ("gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "zb_h2", "zbv", "dualpipe", "dualpipev"):
    ROUTES[f"pipeline.peak_activations_{_name}"] = _peak_acts


def _message_bytes(p) -> int:
    """One micro-batch's activations [mbs, seq, h], sized by torch on the meta device (no memory used)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[p.get("dtype", "bf16")]
    t = torch.empty(p.get("mbs", 1), p["seq_len"], p["hidden"], dtype=dtype, device="meta")
    return t.numel() * t.element_size()


@register_route("pipeline.boundary_bytes")
def _(p):
    return _message_bytes(p)


def _sends(stages: int, rank: int, p: int, m: int) -> int:
    """Messages rank ``rank`` sends per step, counted stage by stage over the ``stages`` = p·v model chunks it
    holds (stage s on rank s mod p): each micro-batch goes forward out of every stage but the last and its
    gradient backward out of every stage but the first."""
    own = [s for s in range(stages) if s % p == rank]
    return m * sum((s + 1 < stages) + (s > 0) for s in own)


@register_route("pipeline.pp_bytes_per_rank")
def _(p):
    return _sends(p["p"] * p["v"], p["rank"], p["p"], p["m"]) * _message_bytes(p)


@register_route("pipeline.tp_over_pp_bytes")
def _(p):
    """Ring all-reduce bytes per rank, 2(d−1)/d·S (Patarasuk & Yuan), 4 per layer per micro-batch (Megatron's f
    and g in forward and backward), over a middle PP rank's 2 sends per micro-batch."""
    d, x = p["d"], _message_bytes(p)
    tp = p["layers"] * p["m"] * 4 * 2 * (d - 1) / d * x
    return tp / (_sends(d, 1, d, p["m"]) * x)
