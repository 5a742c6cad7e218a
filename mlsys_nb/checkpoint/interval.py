"""How often to checkpoint: Young's first-order interval, the share of time lost, and a simulation.

A job saves a checkpoint every ``T`` seconds of work; a save costs ``C`` seconds; failures arrive at
random (a Poisson process, mean time between failures ``M`` seconds for the whole job); after a failure
the job restarts (``R`` seconds) and redoes the work since the last checkpoint.

- ``expected_lost_fraction(T, C, M)``: the first-order share of wall time lost, ``C/T + (T/2 + R)/M``:
  saving costs ``C`` every ``T``, and each failure loses on average half an interval plus the restart.
- ``optimal_interval(C, M)``: the ``T`` minimising it, ``sqrt(2·C·M)`` (Young 1974; Daly 2006 adds higher
  orders, ``daly_interval``). Both assume ``C, T << M``.
- ``exact_lost_fraction(T, C, M, R)``: the same model without the approximation (a renewal argument: a
  segment of ``T + C`` seconds succeeds with probability ``exp(-(T+C)/M)``; each failed try costs the
  time to the failure plus ``R``), the reference ``simulate_lost_fraction`` is tested against.
- ``simulate_lost_fraction``: a seeded simulation of a long run with exponential failures.
- ``best_interval(C, M, R, loss=...)``: the interval minimising a loss found by a numeric search (golden
  section over log T), knowing no formula for the optimum: the check that ``optimal_interval`` is the minimum
  of the first-order loss, and ``daly_interval`` the minimum of the exact one, without trusting either.
- ``llama3_interruptions()``: Llama 3's published interruption counts (``data/interruptions.yaml``) and
  the job and per-GPU MTBF they imply.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import check_int, check_number, load_yaml

__all__ = [
    "optimal_interval",
    "daly_interval",
    "expected_lost_fraction",
    "exact_lost_fraction",
    "simulate_lost_fraction",
    "best_interval",
    "job_mtbf",
    "lost_gpu_hours_per_day",
    "llama3_interruptions",
]


def _positive(name: str, value) -> float:
    return check_number(name, value, 0.0, lo_open=True, unit="seconds")


def optimal_interval(save_s: float, mtbf_s: float) -> float:
    """Young's first-order optimal checkpoint interval in seconds of work: ``sqrt(2 · save_s · mtbf_s)``.

    ``save_s``: seconds one checkpoint stalls training; ``mtbf_s``: mean seconds between failures of
    the whole job. Valid when ``save_s << mtbf_s`` (it minimises ``expected_lost_fraction``)."""
    return math.sqrt(2.0 * _positive("save_s", save_s) * _positive("mtbf_s", mtbf_s))


def daly_interval(save_s: float, mtbf_s: float) -> float:
    """Daly's (2006) higher-order optimum in seconds: ``sqrt(2CM)·(1 + sqrt(C/2M)/3 + C/(18M)) - C`` for
    ``C < 2M``, else ``M``. Approaches ``optimal_interval`` as ``C/M -> 0``."""
    c, m = _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    if c >= 2.0 * m:
        return m
    return math.sqrt(2.0 * c * m) * (1.0 + math.sqrt(c / (2.0 * m)) / 3.0 + c / (18.0 * m)) - c


def expected_lost_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """First-order share of wall time lost to saving and to recomputing: ``C/T + (T/2 + R)/M``
    (a ratio; ``interval_s`` T, ``save_s`` C, ``mtbf_s`` M and ``restart_s`` R in seconds)."""
    t, c, m = _positive("interval_s", interval_s), _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    r = check_number("restart_s", restart_s, 0.0, unit="seconds")
    return c / t + (t / 2.0 + r) / m


def exact_lost_fraction(interval_s: float, save_s: float, mtbf_s: float, restart_s: float = 0.0) -> float:
    """The same model without the first-order approximation: ``1 - T / E[wall per segment]`` with
    ``E[wall per segment] = (M + R)·(exp((T + C)/M) - 1)`` (exponential failures, a save can fail too,
    a restart cannot). A ratio in [0, 1)."""
    t, c, m = _positive("interval_s", interval_s), _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    r = check_number("restart_s", restart_s, 0.0, unit="seconds")
    return 1.0 - t / ((m + r) * math.expm1((t + c) / m))


def simulate_lost_fraction(
    interval_s: float, save_s: float, mtbf_s: float, *, restart_s: float = 0.0, segments: int = 20000, seed: int = 0
) -> float:
    """Share of wall time lost in a simulated run of ``segments`` checkpoint intervals with exponential
    failures (mean ``mtbf_s`` seconds, numpy ``default_rng(seed)``): each segment needs ``interval_s +
    save_s`` seconds without a failure; a failure wastes the time since the segment began plus ``restart_s``."""
    t, c, m = _positive("interval_s", interval_s), _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    r = check_number("restart_s", restart_s, 0.0, unit="seconds")
    n = check_int("segments", segments, 1)
    rng = np.random.default_rng(seed)
    need, wall, pending = t + c, 0.0, n
    while pending:  # every pending segment tries once; the failed ones try again
        to_failure = rng.exponential(m, size=pending)
        failed = to_failure < need
        wall += need * (pending - failed.sum()) + float(to_failure[failed].sum()) + r * failed.sum()
        pending = int(failed.sum())
    return 1.0 - n * t / wall


def best_interval(
    save_s: float, mtbf_s: float, restart_s: float = 0.0, *, loss=exact_lost_fraction, rtol: float = 1e-9
) -> float:
    """The interval T (seconds) minimising ``loss(T, save_s, mtbf_s, restart_s)``, by a golden-section search
    over log T from ``save_s / 1000`` to ``100 · mtbf_s`` (the loss must be unimodal there: both
    ``expected_lost_fraction`` and ``exact_lost_fraction`` are), to a relative precision ``rtol``. It uses no
    formula for the optimum, so it checks ``optimal_interval`` (the minimum of the first-order loss) and
    ``daly_interval`` (close to the minimum of the exact one) from outside."""
    c, m = _positive("save_s", save_s), _positive("mtbf_s", mtbf_s)
    r = check_number("restart_s", restart_s, 0.0, unit="seconds")
    check_number("rtol", rtol, 0.0, 0.1, lo_open=True)
    lo, hi = math.log(c / 1000.0), math.log(100.0 * m)
    g = (math.sqrt(5.0) - 1.0) / 2.0  # the golden ratio's inverse: one new point per step

    def f(x: float) -> float:
        return loss(math.exp(x), c, m, r)

    a, b = hi - g * (hi - lo), lo + g * (hi - lo)
    fa, fb = f(a), f(b)
    while hi - lo > math.log1p(rtol):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - g * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + g * (hi - lo)
            fb = f(b)
    return math.exp((lo + hi) / 2.0)


def job_mtbf(gpu_mtbf_s: float, n_gpus: int) -> float:
    """Mean seconds between failures of a job on ``n_gpus`` independent GPUs: ``gpu_mtbf_s / n_gpus``."""
    return _positive("gpu_mtbf_s", gpu_mtbf_s) / check_int("n_gpus", n_gpus, 1)


def lost_gpu_hours_per_day(n_gpus: int, mtbf_s: float, interval_s: float, restart_s: float) -> float:
    """GPU-hours a job on ``n_gpus`` loses per day to failures (first order): ``86400/M`` failures a day,
    each costing half an interval of recomputation plus the restart, on every GPU:
    ``86400/M · (T/2 + R) · n_gpus / 3600``. Saving time is not included."""
    n = check_int("n_gpus", n_gpus, 1)
    m, t = _positive("mtbf_s", mtbf_s), _positive("interval_s", interval_s)
    r = check_number("restart_s", restart_s, 0.0, unit="seconds")
    return 86400.0 / m * (t / 2.0 + r) * n / 3600.0


def llama3_interruptions() -> dict:
    """Llama 3's published interruption counts (``data/interruptions.yaml``) with the MTBF they imply:
    ``job_mtbf_s`` (days·86400 / unexpected interruptions) and ``gpu_mtbf_s`` (that times the GPUs)."""
    d = dict(load_yaml("interruptions.yaml")["llama3_405b"])
    d["job_mtbf_s"] = d["days"] * 86400.0 / d["unexpected"]
    d["gpu_mtbf_s"] = d["job_mtbf_s"] * d["gpus"]
    return d
