"""Serving metrics from ``RequestOutput.metrics``, the CPU overhead of a step, and overlap scheduling.

Per request (seconds): TTFT = first token - arrival (queueing + prefill); TPOT = (last token - first
token) / (output tokens - 1), the mean decode interval; ITL = every gap between consecutive tokens;
end-to-end latency = finish - arrival. ``summarize(outputs, duration)`` gives their percentiles in
milliseconds and the throughputs (requests/s, output tokens/s, total tokens/s over ``duration``).

CPU overhead: ``LLMEngine.step_times`` records the seconds of each phase of every step (schedule,
prepare, model, sample, postprocess). ``phase_breakdown(step_times)`` takes medians over pure decode
steps; everything but ``model`` is CPU work that a GPU would wait on at small batch sizes.

Overlap scheduling (SGLang's zero-overhead scheduler, vLLM's async scheduling): while the GPU runs
step N, the CPU prepares step N+1. Sequential step time is c + g (CPU c, GPU g); overlapped it is
max(c, g), so the closed-form speed-up is ``(c + g) / max(c, g)`` (at most 2, when c = g).
``overlap_speedup`` is that model, applied in the notebook to measured phase times.
"""

from __future__ import annotations

import statistics

PERCENTILES = (50, 90, 99)


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
    from .engine import PHASES

    steps = [s for s in step_times if not decode_only or s["num_decodes"] == s["num_tokens"]]
    if not steps:
        raise ValueError("no recorded step matches (run some decode steps first)")
    row = {p: statistics.median(s.get(p, 0.0) for s in steps) for p in PHASES}
    row["cpu"] = sum(row[p] for p in PHASES if p != "model")
    row["cpu_share"] = row["cpu"] / (row["cpu"] + row["model"])
    row["steps"] = len(steps)
    return row


def overlap_speedup(cpu_s: float, model_s: float) -> float:
    """Closed-form speed-up of overlapping the CPU work of step N+1 with the model of step N."""
    if cpu_s < 0 or model_s < 0 or cpu_s + model_s == 0:
        raise ValueError(f"cpu_s={cpu_s}, model_s={model_s}: must be >= 0 and not both 0")
    return (cpu_s + model_s) / max(cpu_s, model_s)


def measure_decode_overhead(
    make_engine, batch_sizes, *, prompt_len: int = 16, steps: int = 20, use_tqdm: bool = True
) -> list[dict]:
    """For each batch size B: B requests decode together for ``steps`` steps; median phase times.

    ``make_engine()`` returns a fresh ``LLMEngine`` (it must hold B sequences)."""
    from tqdm.auto import tqdm

    from .sampling_params import SamplingParams

    rows = []
    for b in tqdm(list(batch_sizes), desc="decode overhead", disable=not use_tqdm):
        eng = make_engine()
        sp = SamplingParams(temperature=0, max_tokens=steps + 2, ignore_eos=True)
        for i in range(b):
            eng.add_request(f"b{b}-{i}", [(7 * i + j) % 200 + 1 for j in range(prompt_len)], sp)
        while eng.has_unfinished_requests():
            eng.step()
        row = phase_breakdown([s for s in eng.step_times if s["num_seqs"] == b])
        rows.append({"batch": b, **row})
    return rows
