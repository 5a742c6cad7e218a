"""Serving metrics from ``RequestOutput.metrics``, the CPU overhead of a step, and overlap scheduling.

Per request (seconds): TTFT = first token - arrival (queueing + prefill); TPOT = (last token - first
token) / (output tokens - 1), the mean decode interval; ITL = every gap between consecutive tokens;
end-to-end latency = finish - arrival. ``summarize(outputs, duration)`` gives their percentiles in
milliseconds and the throughputs (requests/s, output tokens/s, total tokens/s over ``duration``).

CPU overhead: ``LLMEngine.step_times`` records the seconds of each phase of every step (schedule,
prepare, model, sample, postprocess). ``phase_breakdown(step_times)`` takes medians over pure decode
steps; everything but ``model`` is CPU work that a GPU would wait on at small batch sizes.
``measure_decode_overhead`` steps one engine per batch size in turn (interleaved, so a burst of load
on a shared machine hits every batch size alike). ``cpu_per_sequence_ratio(rows)`` compares the CPU
time per sequence at the largest and the smallest batch (fastest step of each): well below 1 when
the CPU work is mostly a cost per step (vectorised preparation), near 1 when it is a cost per
sequence.

Latency histograms (``sequence.Histogram``): the engine observes, for every finished request, its queue time
(arrival -> first scheduled), TTFT, mean inter-token latency (TPOT) and end-to-end latency into
cumulative-bucket histograms with vLLM's bucket bounds; the server's ``/metrics`` exports them in
Prometheus' text format (``_bucket{le=...}``, ``_sum``, ``_count``), so ``histogram_quantile`` works on them.

Overlap scheduling (SGLang's zero-overhead scheduler, vLLM's async scheduling): while the GPU runs
step N, the CPU prepares step N+1. Sequential step time is c + g (CPU c, GPU g); overlapped it is
max(c, g), so the closed-form speed-up is ``(c + g) / max(c, g)`` (at most 2, when c = g).
``overlap_speedup`` is that model; ``simulate_overlap`` is an independent route to it, an event
simulation of the two-stage pipeline step by step (also on a measured per-step trace). Both are
models: nothing here overlaps real CPU and GPU work.

The engine's ``async_scheduling`` overlaps for real what it can: step t+1's schedule and batch (``a``
seconds) with step t's forward (``g``), while sampling and the stop checks (``r``) stay in line, so the
model of its step is r + (a + g) / overlap_speedup(a, g) (``async_step_model``).
``measure_async_scheduling`` times a synchronous and an asynchronous engine's decode steps interleaved.
"""

from __future__ import annotations

import statistics

from collections import deque

from ..config import check_choice, check_int, check_number
from .sequence import LATENCY_BUCKETS, TPOT_BUCKETS, TTFT_BUCKETS, Histogram


PERCENTILES = (50, 90, 99)
PHASES = ("schedule", "prepare", "model", "sample", "postprocess")  # an engine step's timed phases (step_times)
STAT_NAMES = ("prompt_tokens", "cached_tokens", "generation_tokens", "requests_finished", "requests_failed")


class EngineMetrics:
    """What an ``LLMEngine`` counts as it runs (vLLM's ``Stats``); the server's ``/metrics`` exports it.

    - ``stats``: counts since the start: prompt, cached and generated tokens; finished and failed requests.
    - ``histograms``: vLLM's latency histograms, in seconds: the queue time (arrival -> first scheduled) of each
      request when it is first scheduled; TTFT, TPOT and end-to-end latency when it finishes (its first sample's).
    - ``step_times``: per step, the wall seconds of each phase (``PHASES``, plus async scheduling's
      ``lookahead``/``wait``/``overlapped``) and the step's sequences, new tokens and decodes; only the last
      ``window`` steps (bounded memory). ``num_steps`` counts every step."""

    def __init__(self, window: int):
        self.stats = dict.fromkeys(STAT_NAMES, 0)
        self.histograms = {
            "request_queue_time_seconds": Histogram(LATENCY_BUCKETS),
            "time_to_first_token_seconds": Histogram(TTFT_BUCKETS),
            "time_per_output_token_seconds": Histogram(TPOT_BUCKETS),
            "e2e_request_latency_seconds": Histogram(LATENCY_BUCKETS),
        }
        self.step_times: deque[dict] = deque(maxlen=window)
        self.num_steps = 0

    def record_step(self, times: dict, scheduled, num_decodes: int, **extra) -> None:
        """One step: ``times`` (phase -> seconds), ``scheduled`` [(sequence, new tokens)], its decodes."""
        self.num_steps += 1
        self.step_times.append(
            dict(
                times,
                **extra,
                num_seqs=len(scheduled),
                num_tokens=sum(n for _, n in scheduled),
                num_decodes=num_decodes,
            )
        )

    def first_token(self, prompt_tokens: int, cached_tokens: int) -> None:
        """A request's first sample got its first token: its prompt (and the part read from the cache) counts."""
        self.stats["prompt_tokens"] += prompt_tokens
        self.stats["cached_tokens"] += cached_tokens

    def request_finished(self, m) -> None:
        """A finished request's latencies (``RequestMetrics`` of its first sample, seconds) into the histograms."""
        self.stats["requests_finished"] += 1
        for name, value in (
            ("time_to_first_token_seconds", m.ttft),
            ("time_per_output_token_seconds", m.tpot),
            ("e2e_request_latency_seconds", m.e2e),
        ):
            if value is not None:
                self.histograms[name].observe(value)


def percentile(xs, p: float) -> float:
    """Linear-interpolation percentile (numpy's default) of a non-empty list."""
    xs = sorted(xs)
    if not xs:
        raise ValueError("percentile of an empty list")
    k = (len(xs) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def summarize(outputs, duration: float) -> dict:
    """Latency percentiles (ms) and throughputs of finished ``RequestOutput``s over ``duration`` seconds."""
    ms = 1e3
    ttft = [o.metrics.ttft * ms for o in outputs]
    e2e = [o.metrics.e2e * ms for o in outputs]
    tpot = [o.metrics.tpot * ms for o in outputs if o.metrics.tpot is not None]
    itl = [g * ms for o in outputs for g in o.metrics.itl]
    out_tokens = sum(len(c.token_ids) for o in outputs for c in o.outputs)
    in_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    row = {
        "requests": len(outputs),
        "duration_s": duration,
        "requests_per_s": len(outputs) / duration,
        "output_tokens_per_s": out_tokens / duration,
        "total_tokens_per_s": (in_tokens + out_tokens) / duration,
    }
    for name, xs in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl), ("e2e_ms", e2e)):
        for p in PERCENTILES:
            row[f"{name}_p{p}"] = percentile(xs, p) if xs else float("nan")
    return row


def phase_breakdown(step_times, *, decode_only: bool = True) -> dict:
    """Median seconds per phase over the recorded steps (only steps that were pure decodes by default),
    with ``cpu`` (all phases but the model) and ``cpu_share`` = cpu / (cpu + model)."""
    steps = [s for s in step_times if not decode_only or s["num_decodes"] == s["num_tokens"]]
    if not steps:
        raise ValueError("no recorded step matches (run some decode steps first)")
    row = {p: statistics.median(s.get(p, 0.0) for s in steps) for p in PHASES}
    row["cpu"] = sum(row[p] for p in PHASES if p != "model")
    row["cpu_share"] = row["cpu"] / (row["cpu"] + row["model"])
    row["steps"] = len(steps)
    return row


def overlap_speedup(cpu_s: float, model_s: float) -> float:
    """Closed-form speed-up (dimensionless) of overlapping the CPU work of step N+1 (``cpu_s`` seconds)
    with the model of step N (``model_s`` seconds): the limit of many steps."""
    check_number("cpu_s", cpu_s, 0, unit="seconds")
    check_number("model_s", model_s, 0, unit="seconds")
    if cpu_s + model_s == 0:
        raise ValueError("cpu_s=0 and model_s=0: a step takes some time, give one of them > 0")
    return (cpu_s + model_s) / max(cpu_s, model_s)


def simulate_overlap(cpu_s, model_s) -> tuple[float, float]:
    """Event simulation of a decode loop, sequential and overlapped: (sequential seconds, overlapped seconds).

    ``cpu_s[i]`` / ``model_s[i]``: seconds of CPU work and of model work of step i. Sequential: each step
    runs its CPU part, then its model. Overlapped (one step of look-ahead): the CPU prepares step i while
    the model runs step i-1, so the CPU part of step i starts when the CPU is free and step i-1 has been
    launched, and the model of step i starts when its CPU part is done and the model is free."""
    if len(cpu_s) != len(model_s) or not len(cpu_s):
        raise ValueError(f"cpu_s and model_s: need one value per step each, got {len(cpu_s)} and {len(model_s)}")
    check_number("min(cpu_s)", min(cpu_s), 0, unit="seconds")
    check_number("min(model_s)", min(model_s), 0, unit="seconds")
    cpu_free = model_free = launched = 0.0
    for c, g in zip(cpu_s, model_s):
        cpu_done = max(cpu_free, launched) + c  # prepare step i once step i-1 is on the device
        launched = max(cpu_done, model_free)  # the model takes step i when it is done with step i-1
        cpu_free, model_free = cpu_done, launched + g
    return float(sum(cpu_s) + sum(model_s)), model_free


def async_step_model(ahead_s: float, model_s: float, rest_s: float) -> float:
    """Seconds of one step (model) of an engine that overlaps ``ahead_s`` seconds of CPU work (the next step's
    schedule and batch) with the forward (``model_s``), the other ``rest_s`` CPU seconds (sampling,
    stop checks) staying in line: rest + (ahead + model) / overlap_speedup(ahead, model)."""
    check_number("rest_s", rest_s, 0, unit="seconds")
    return rest_s + (ahead_s + model_s) / overlap_speedup(ahead_s, model_s)


def overlap_model_error(speedup, ratios, steps: int = 200) -> float:
    """Largest relative difference between ``speedup(c, g)`` and ``simulate_overlap`` over ``steps`` equal
    steps with CPU/model ratio c/g in ``ratios`` (g = 1 s): at most 1/steps for the right closed form."""
    worst = 0.0
    for r in ratios:
        seq, ovl = simulate_overlap([r] * steps, [1.0] * steps)
        worst = max(worst, abs(speedup(r, 1.0) / (seq / ovl) - 1))
    return worst


def fastest_step(row, part: str = "cpu") -> float:
    """Seconds of ``part`` ("cpu" or "model") in the fastest decode step of a ``measure_decode_overhead`` row.

    Background load only ever adds time to a step, so the fastest of a row's steps is the one closest
    to the undisturbed cost (a median still moves when another process takes the core for half the steps)."""
    check_choice("part", part, ("cpu", "model"))
    return min(step[0 if part == "cpu" else 1] for step in row["trace"])


def cpu_per_sequence_ratio(rows) -> float:
    """CPU seconds per sequence at the largest batch / at the smallest, in the fastest step of each
    (rows of ``measure_decode_overhead``): 1 if the CPU work is a fixed cost per sequence, B_min / B_max if
    it is a fixed cost per step."""
    rows = sorted(rows, key=lambda r: r["batch"])
    if len(rows) < 2 or rows[0]["batch"] == rows[-1]["batch"]:
        raise ValueError(f"rows: need at least two batch sizes, got {[r['batch'] for r in rows]}")
    lo, hi = rows[0], rows[-1]
    return (fastest_step(hi) / hi["batch"]) / (fastest_step(lo) / lo["batch"])


def measure_decode_overhead(
    make_engine, batch_sizes, *, prompt_len: int = 16, steps: int = 20, use_tqdm: bool = True
) -> list[dict]:
    """For each batch size B: B requests decode together for ``steps`` steps; median phase times (seconds).

    ``make_engine()`` returns a fresh ``LLMEngine`` (it must hold B sequences). One engine per batch
    size; after their prefills the engines take one decode step each in turn, so every batch size
    sees the same background load. Only steps in which all B sequences decode count (a chunked prefill
    lets some start early). Each row also holds ``trace``: (CPU seconds, model seconds) of every
    counted step, in order."""
    from tqdm.auto import tqdm

    from .sampling_params import SamplingParams

    def counted(eng, b):
        return [s for s in eng.step_times if s["num_seqs"] == b and s["num_decodes"] == s["num_tokens"] == b]

    batch_sizes = list(batch_sizes)
    engines = []
    for b in batch_sizes:
        eng = make_engine()
        sp = SamplingParams(temperature=0, max_tokens=eng.max_model_len - prompt_len, ignore_eos=True)
        for i in range(b):
            eng.add_request(f"b{b}-{i}", [(7 * i + j) % 200 + 1 for j in range(prompt_len)], sp)
        for _ in range(b * prompt_len + 2):  # prefill (possibly in chunks) until all B sequences decode
            if counted(eng, b):
                break
            eng.step()
        else:
            raise ValueError(f"batch_sizes: batch {b} never decodes together (does the engine hold {b} sequences?)")
        eng.step_times.clear()
        engines.append(eng)
    with tqdm(total=steps * len(engines), desc="decode overhead (interleaved)", disable=not use_tqdm) as bar:
        for _ in range(2 * steps):  # each round: one step of every engine still short of `steps` counted steps
            todo = [(b, e) for b, e in zip(batch_sizes, engines) if len(counted(e, b)) < steps]
            todo = [(b, e) for b, e in todo if e.has_unfinished_requests()]
            if not todo:
                break
            for b, eng in todo:
                n = len(counted(eng, b))
                eng.step()
                bar.update(len(counted(eng, b)) - n)
    rows = []
    for b, eng in zip(batch_sizes, engines):
        decodes = counted(eng, b)[:steps]
        row = phase_breakdown(decodes)
        trace = [(sum(s.get(p, 0.0) for p in PHASES if p != "model"), s.get("model", 0.0)) for s in decodes]
        rows.append({"batch": b, **row, "trace": trace})
    return rows


def measure_async_scheduling(
    make_engine, batch: int, *, prompt_len: int = 16, rounds: int = 5, steps: int = 10
) -> dict:
    """Decode steps of a synchronous and an asynchronous engine, interleaved: wall seconds per step.

    ``make_engine(async_scheduling)`` returns a fresh ``LLMEngine``. Each engine decodes ``batch`` greedy
    requests (``prompt_len``-token prompts); after their prefills the engines take ``steps`` steps each in
    turn, ``rounds`` times, the first engine alternating, so a burst of load hits both alike. Returns
    ``{"sync": [...], "async": [...]}`` (seconds of each timed step, in order), ``"rounds"`` (per round, the
    median step of each), ``"phases"`` and ``"phases_async"`` (``phase_breakdown`` of each engine's timed
    steps, on its own thread: the asynchronous engine's schedule and prepare come ready from its worker),
    ``"lookahead"`` and ``"wait"`` (medians, seconds: the worker's time per step, and how long the engine
    waited for it after the forward), ``"overlapped"`` (median over the asynchronous engine's steps of the share of
    the worker's time that ran beside the forward), ``"spread"`` (the largest / the smallest per-round
    median step of the synchronous engine: how much the load moves one variant between rounds) and
    ``"outputs_equal"`` (both engines generated the same tokens)."""
    import time

    from .sampling_params import SamplingParams

    check_int("batch", batch, 1)
    engines = {}
    for name, on in (("sync", False), ("async", True)):
        eng = make_engine(on)
        sp = SamplingParams(temperature=0, max_tokens=eng.max_model_len - prompt_len, ignore_eos=True)
        for i in range(batch):
            eng.add_request(f"r{i}", [(7 * i + j) % 200 + 1 for j in range(prompt_len)], sp)
        for _ in range(batch * prompt_len + 2):  # prefill until every sequence decodes
            if all(s.output_token_ids for seqs in eng.requests.values() for s in seqs):
                break
            eng.step()
        if len(eng.scheduler.running) != batch:
            raise ValueError(f"batch={batch}: the engine holds {len(eng.scheduler.running)} running sequences")
        left = eng.max_model_len - max(s.num_tokens for s in eng.scheduler.running)
        if left <= rounds * steps:
            raise ValueError(
                f"rounds * steps = {rounds * steps}: only {left} tokens of context are left after the prefill"
            )
        eng.step_times.clear()
        engines[name] = eng
    times = {name: [] for name in engines}
    per_round = []
    for r in range(rounds):
        for name in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
            eng = engines[name]
            for _ in range(steps):
                t0 = time.perf_counter()
                eng.step()
                times[name].append(time.perf_counter() - t0)
        per_round.append({n: statistics.median(times[n][-steps:]) for n in engines})
    toks = {n: [s.output_token_ids for seqs in e.requests.values() for s in seqs] for n, e in engines.items()}
    engines["async"].close()
    ahead = [s for s in engines["async"].step_times if "lookahead" in s]
    return {
        **times,
        "rounds": per_round,
        "phases": phase_breakdown(engines["sync"].step_times),
        "phases_async": phase_breakdown(engines["async"].step_times),
        "lookahead": statistics.median(s["lookahead"] for s in ahead) if ahead else 0.0,
        "wait": statistics.median(s.get("wait", 0.0) for s in ahead) if ahead else 0.0,
        "overlapped": statistics.median(s["overlapped"] for s in ahead) if ahead else 0.0,
        "spread": max(x["sync"] for x in per_round) / min(x["sync"] for x in per_round),
        "outputs_equal": toks["sync"] == toks["async"],
    }
