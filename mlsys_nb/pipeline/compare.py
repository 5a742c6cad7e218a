"""Every schedule side by side at one setting (a simulation), with per-setting caches.

- ``compare_schedules(p, m, v, F, B, W, comm)`` -> DataFrame, one row per schedule of ``SCHEDULES``:
  makespan, both bubble conventions, peak activations (rank 0 and max); a schedule that does not
  accept the setting keeps its row with the reason in ``note``.
- ``cached_schedule(name, p, m, v)``, ``cached_simulation(name, p, m, v, F, B, W, comm)``: the
  same objects for repeated settings (the pipeline widget redraws on every slider move). The
  cached objects are shared: do not mutate them.
"""

from __future__ import annotations

from functools import lru_cache

from .schedules import SCHEDULES, ScheduleError, schedule
from .simulate import simulate

__all__ = ["compare_schedules", "cached_schedule", "cached_simulation"]


@lru_cache(maxsize=64)
def cached_schedule(name: str, p: int, m: int, v: int | None):
    """``schedule(name, p, m, v)``, built once per (name, p, m, v); never mutated here."""
    return schedule(name, p, m, v)


@lru_cache(maxsize=64)
def cached_simulation(name: str, p: int, m: int, v: int | None, F: float, B: float, W: float, comm: float):
    """``simulate`` of ``cached_schedule(name, p, m, v)`` once per (schedule, costs)."""
    return simulate(cached_schedule(name, p, m, v), F=F, B=B, W=W, comm=comm)


def compare_schedules(p: int, m: int, v: int, F: float, B: float, W: float, comm: float):
    """Every schedule at these settings (interleaved-1f1b uses ``v``, or 2 if v < 2; V-shaped and
    DualPipe schedules use their 2 chunks). Invalid ones keep a row with the reason. Costs are per
    micro-batch over L/p layers, as in ``simulate``; peak activations in micro-batches × L/p layers."""
    return _compare(p, m, v, F, B, W, comm).copy()


@lru_cache(maxsize=32)
def _compare(p, m, v, F, B, W, comm):
    import pandas as pd

    rows = []
    for name in SCHEDULES:
        vv = max(v, 2) if name == "interleaved-1f1b" else None
        try:
            r = cached_simulation(name, p, m, cached_schedule(name, p, m, vv).v, F, B, W, comm)
        except (ScheduleError, ValueError) as e:
            rows.append({"schedule": name, "v": vv, "note": str(e)})
            continue
        rows.append(
            {
                "schedule": name,
                "v": r.schedule.v,
                "makespan": r.makespan,
                "bubble_fraction (idle/total)": r.bubble_fraction,
                "bubble_ratio (idle/busy)": r.bubble_ratio,
                "peak_activations rank 0 (mb×L/p)": r.peak_activations[0],
                "peak_activations max (mb×L/p)": max(r.peak_activations),
                "note": "",
            }
        )
    return pd.DataFrame(rows)
