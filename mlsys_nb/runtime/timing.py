"""One way to time things: a timer, a lap clock, the repeat loop, the statistics we report, and the profiler.

- ``Timer()``: context manager or decorator; wall seconds from ``time.perf_counter`` in ``.seconds``
  (``cpu=True`` adds this process's CPU seconds from ``time.process_time`` in ``.cpu_seconds``);
  every timed run is also appended to ``.samples`` (and ``.cpu_samples``), so a decorated function
  collects one sample per call.
- ``Laps()``: one running clock split into consecutive phases: ``laps("name")`` ends the current phase
  and adds its wall seconds to ``laps.times["name"]``; ``laps.elapsed()`` is the wall seconds since the
  start (the engine's per-step phase times, a training loop's time column).
- ``repeat(fn, n, warmup)``: call ``fn()`` ``warmup`` times untimed, then ``n`` times timed; a list of seconds.
- ``median(xs)``, ``lower_quartile(xs)`` and ``quantile(xs, q)``: the statistics of repeats. The
  median is the usual summary; the lower quartile is for a time whose noise only ever adds (a message
  on a busy machine), where the quick runs are the ones closest to the cost itself; ``quantile(xs, 0.9)``
  is a tail (p90), and ``method="nearest"`` picks a measured value instead of interpolating.
- ``profile_ops(fn)``: run ``fn()`` under ``torch.profiler`` and return the self CPU seconds per op
  (``aten::mm``, ...), largest first.
- ``ATTEMPTS``: how many measurements a timed check makes before its claim counts as refuted (one more
  try is a fresh measurement, never a looser bound; ``comm.overlap`` and ``comm.pingpong`` use it).

Durations only; timestamps stay ``time.perf_counter()``: a request's arrival, scheduling and token
times (``inference.sequence.RequestMetrics``, set in the engine and ``run_workload``), the server's
token log (``inference.server.engine_thread``), the event times that line up overlap (``parallel.ddp``'s bucket
launch/ready/done, the ``pipeline.executor`` op log, and ``rl.placement``'s start/end, there
``time.monotonic``: one clock for all processes), and the deadlines of waits (``time.monotonic``).
Code strings run inside a rank (``benchmarks/cluster.py``'s in-rank all_reduce) keep their own
``perf_counter`` pairs: a rank need not import this package. Timing numbers are never asserted in
tests; compare variants interleaved in one run instead.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time

from ..config import check_choice, check_int, check_number

__all__ = ["ATTEMPTS", "Timer", "Laps", "repeat", "median", "lower_quartile", "quantile", "profile_ops"]

ATTEMPTS = 3  # measurements a timed check makes before its claim counts as refuted


class Timer(contextlib.ContextDecorator):
    """Wall-clock seconds (``time.perf_counter``) of a ``with`` block or of each call of a decorated function.

    ``with Timer() as t: ...`` then ``t.seconds`` (s); ``Timer(cpu=True)`` also reads ``time.process_time``
    (CPU seconds of this process, all its threads) into ``t.cpu_seconds``. Each run appends to
    ``t.samples`` (s) and, with ``cpu=True``, ``t.cpu_samples`` (s). Not reentrant: one block at a time.
    """

    def __init__(self, cpu: bool = False):
        if not isinstance(cpu, bool):
            raise TypeError(f"cpu must be a bool, got {cpu!r}")
        self.cpu = cpu
        self.seconds = float("nan")
        self.cpu_seconds = float("nan")
        self.samples: list[float] = []
        self.cpu_samples: list[float] = []
        self._start: float | None = None
        self._cpu_start = 0.0

    def __enter__(self) -> Timer:
        if self._start is not None:
            raise RuntimeError("Timer is already running (not reentrant): use one Timer per nested block")
        if self.cpu:
            self._start, self._cpu_start = time.perf_counter(), time.process_time()
        else:
            self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        self.seconds = time.perf_counter() - self._start
        self.samples.append(self.seconds)
        if self.cpu:
            self.cpu_seconds = time.process_time() - self._cpu_start
            self.cpu_samples.append(self.cpu_seconds)
        self._start = None
        return False


class Laps:
    """Wall-clock seconds (``time.perf_counter``) of consecutive phases on one running clock.

    ``laps = Laps()`` starts the clock; ``laps("name")`` ends the phase running since the previous call
    (or the start), adds its seconds to ``laps.times["name"]`` (a repeated name sums) and returns them;
    ``laps.elapsed()`` is the seconds since the start, whatever the phases; ``laps.start`` is the start
    itself, a ``time.perf_counter()`` timestamp (to place events on the same clock). Phases tile the time: the
    sum of ``laps.times`` equals ``elapsed()`` read at the last ``laps(...)`` call.
    """

    def __init__(self):
        self.start = self.last = time.perf_counter()
        self.times: dict[str, float] = {}

    def __call__(self, phase: str) -> float:
        if not isinstance(phase, str):
            raise TypeError(f"phase must be a str (the phase's name), got {phase!r}")
        now = time.perf_counter()
        seconds = now - self.last
        self.times[phase] = self.times.get(phase, 0.0) + seconds
        self.last = now
        return seconds

    def elapsed(self) -> float:
        """Wall seconds since this ``Laps`` was made."""
        return time.perf_counter() - self.start


def repeat(fn, n: int, warmup: int = 0) -> list[float]:
    """Call ``fn()`` ``warmup`` times (not timed), then ``n`` times, each timed alone; the ``n`` wall
    times in seconds, in call order. ``n >= 1``, ``warmup >= 0``."""
    n, warmup = check_int("n", n, 1), check_int("warmup", warmup, 0)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    for _ in range(warmup):
        fn()
    t = Timer()
    for _ in range(n):
        with t:
            fn()
    return t.samples


def _values(xs, what: str) -> list[float]:
    xs = [float(x) for x in xs]
    if not xs:
        raise ValueError(f"{what} of no values: xs must hold at least one number")
    return xs


def median(xs) -> float:
    """Median of ``xs`` (any iterable of numbers; same unit out as in): ``statistics.median``."""
    return statistics.median(_values(xs, "median"))


def lower_quartile(xs) -> float:
    """25th percentile of ``xs`` (same unit out as in): ``quantile(xs, 0.25)``, linear interpolation
    between the sorted values (the same as ``numpy.quantile(xs, 0.25)``)."""
    return quantile(_values(xs, "lower_quartile"), 0.25)


def quantile(xs, q: float, method: str = "linear") -> float:
    """The ``q``-quantile of ``xs`` (0 <= q <= 1; same unit out as in), at sorted position ``q * (n - 1)``:
    ``method="linear"`` interpolates between the two values around it, ``method="nearest"`` takes the
    value at the rounded position (ties to even). Both as ``numpy.quantile(xs, q, method=...)``."""
    xs = sorted(_values(xs, "quantile"))
    q = check_number("q", q, 0.0, 1.0)
    method = check_choice("method", method, ("linear", "nearest"))
    pos = q * (len(xs) - 1)
    if method == "nearest":
        return xs[round(pos)]
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (pos - lo) * (xs[hi] - xs[lo])


def profile_ops(fn, *, warmup: int = 1) -> dict[str, float]:
    """Run ``fn()`` once under ``torch.profiler`` (CPU activity) after ``warmup`` untimed calls; the self
    CPU time per op in seconds (time inside the op, not in the ops it calls), summed over its calls,
    as ``{op name: seconds}`` largest first. The profiler adds microseconds per op, so use it to see
    where time goes, and ``repeat`` to say how long something takes."""
    warmup = check_int("warmup", warmup, 0)
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {fn!r}")
    from .profiling import light_profile  # torch.profiler's trace, without importing the compiler

    for _ in range(warmup):
        fn()
    with light_profile("cpu") as prof:
        fn()
    rows = [(e.key, e.self_cpu_time_total * 1e-6) for e in prof.key_averages()]  # profiler reports us
    return dict(sorted(rows, key=lambda r: r[1], reverse=True))
