"""Does async scheduling (``EngineConfig.async_scheduling``) make a decode step faster? Measured against its model.

    .venv/bin/python benchmarks/async_scheduling.py [--models tiny small] [--batches 4 32 64] [--rounds 8]
        [--steps 10] [--threads 1] [--out data/measured/async_scheduling.md]

For each model preset (random weights) and batch size B: a synchronous and an asynchronous engine each decode
B greedy requests (16-token prompts, no stop); after their prefills they take ``--steps`` decode steps each in
turn, ``--rounds`` times, the first engine alternating (``metrics.measure_async_scheduling``). Reported: the
median wall time of a step of each, the measured speed-up (sync / async) with the spread of the per-round
speed-ups, and the model's prediction from the synchronous engine's own phase medians:
``overlap_speedup(c, g)`` if all its CPU work c were hidden behind the forward g, and
``metrics.async_step_model(a, g, r)`` for what the engine really moves to its worker (a = schedule +
prepare; sampling and stop checks r stay in line). "g beside the worker" is the asynchronous engine's forward
(phase median): longer than g alone when the worker's Python and the forward's operator dispatch take turns on
the interpreter lock. ``--quick``: seconds, no record.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from mlsys_nb.inference import LLM, LLMEngine
from mlsys_nb.inference.metrics import async_step_model, measure_async_scheduling, overlap_speedup
from mlsys_nb.runtime.machine import cpu_model, report


def row(preset: str, batch: int, rounds: int, steps: int) -> dict:
    base = LLM(preset, seed=0).engine.model
    r = measure_async_scheduling(
        lambda on: LLMEngine(base, max_num_seqs=max(batch, 1), async_scheduling=on), batch, rounds=rounds, steps=steps
    )
    ph = r["phases"]
    ahead, rest = ph["schedule"] + ph["prepare"], ph["sample"] + ph["postprocess"]
    sync, asyn = statistics.median(r["sync"]), statistics.median(r["async"])
    per_round = [x["sync"] / x["async"] for x in r["rounds"]]
    return {
        "model": preset,
        "batch": batch,
        "sync_ms": 1e3 * sync,
        "async_ms": 1e3 * asyn,
        "speedup": sync / asyn,
        "round_lo": min(per_round),
        "round_hi": max(per_round),
        "cpu_ms": 1e3 * ph["cpu"],
        "ahead_ms": 1e3 * ahead,
        "model_ms": 1e3 * ph["model"],
        "model_beside_ms": 1e3 * r["phases_async"]["model"],
        "all_hidden": overlap_speedup(ph["cpu"], ph["model"]),
        "predicted": (ph["cpu"] + ph["model"]) / async_step_model(ahead, ph["model"], rest),
        "lookahead_ms": 1e3 * r["lookahead"],
        "wait_ms": 1e3 * r["wait"],
        "equal": r["outputs_equal"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", nargs="+", default=["tiny", "small"])
    ap.add_argument("--batches", nargs="+", type=int, default=[4, 32, 64])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the worker needs the other core)")
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--quick", action="store_true", help="seconds: tiny, batch 4, 2 rounds of 3 steps, no record")
    a = ap.parse_args()
    if a.quick:
        a.models, a.batches, a.rounds, a.steps, a.out = ["tiny"], [4], 2, 3, None
    torch.set_num_threads(a.threads)
    start = time.perf_counter()
    rows = [row(m, b, a.rounds, a.steps) for m in a.models for b in a.batches]
    lines = [
        f"CPU: {cpu_model()}; torch threads {a.threads}; {a.rounds} rounds x {a.steps} decode steps per engine, "
        f"interleaved; greedy, 16-token prompts, ignore_eos; random weights (seed 0); {time.perf_counter() - start:.0f} s",
        "",
        "| model | batch | sync step (ms) | async step (ms) | speed-up, measured | per-round range | CPU c (ms) "
        "| of it moved: schedule + prepare (ms) | model g (ms) | g beside the worker (ms) | model: all CPU hidden "
        "| model: what moves "
        "| worker per step (ms) | waited for it (ms) | outputs equal |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} | {r['batch']} | {r['sync_ms']:.2f} | {r['async_ms']:.2f} | {r['speedup']:.3f} "
            f"| {r['round_lo']:.2f}-{r['round_hi']:.2f} | {r['cpu_ms']:.3f} | {r['ahead_ms']:.3f} | {r['model_ms']:.2f} "
            f"| {r['model_beside_ms']:.2f} "
            f"| {r['all_hidden']:.3f} | {r['predicted']:.3f} | {r['lookahead_ms']:.3f} | {r['wait_ms']:.3f} "
            f"| {r['equal']} |"
        )
    report("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
