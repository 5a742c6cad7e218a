"""Serving throughput: the engine vs transformers ``generate`` with static batching, and engine ablations.

    .venv/bin/python benchmarks/serving.py [--quick] [--requests 64] [--batch 16] [--out data/measured/serving.md]

One seeded workload (full: 64 requests, prompt and output lengths uniform in 16-256, all arriving at
t=0) on the ``small`` preset with random weights (its RoPE table extended to 512 positions so that a
256-token prompt can generate 256 tokens; the weights are the same shapes), at most ``--batch``
sequences at a time everywhere, greedy decoding, every request producing exactly its output length.
Systems, run one after the other in the same process on the same weights:

- ``engine``: ``LLM`` with continuous batching, chunked prefill, prefix caching (the defaults);
- ``engine, static batching``: the same engine admitting a new batch only when the last one is done;
- ``engine, no prefix caching``: (this workload shares no prefixes, so it should change little);
- ``engine, 4x in flight``: the engine with four times as many sequences in flight (paging makes room);
- ``transformers generate (static)``: ``to_hf(model)`` (a ``LlamaForCausalLM`` with the same weights),
  batches of ``--batch`` requests in arrival order, left-padded, ``generate(do_sample=False)`` for the
  longest output of the batch (shorter requests keep their first tokens: the waste of static batching),
  in batches of ``--batch`` and of 4x that.

Prints output tokens/s (useful tokens only), ratios to transformers, and TTFT/TPOT/latency percentiles
from the engine's per-request metrics; then the CPU overhead of a decode step by phase at several batch
sizes with the overlap-scheduling closed form applied to it. ``--quick``: 4 short requests on ``tiny`` (a few seconds).
"""

from __future__ import annotations

import argparse

import torch


def run_engine(model, reqs, batch, **kw):
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.metrics import summarize
    from mlsys_nb.inference.workload import run_workload

    eng = LLMEngine(model, max_num_seqs=batch, max_num_batched_tokens=512, **kw)
    outs, secs = run_workload(eng, reqs, realtime=False, use_tqdm=True)
    assert [len(o.outputs[0].token_ids) for o in outs] == [r.max_tokens for r in reqs]
    return summarize(outs, secs), [o.outputs[0].token_ids for o in outs]


def run_hf(hf, reqs, batch):
    from tqdm.auto import tqdm

    from mlsys_nb.runtime.timing import Laps

    clock, tokens, outs = Laps(), 0, []
    for i in tqdm(range(0, len(reqs), batch), desc="transformers generate"):
        group = reqs[i : i + batch]
        width = max(len(r.prompt_token_ids) for r in group)
        ids = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + r.prompt_token_ids for r in group])
        mask = torch.tensor([[0] * (width - len(r.prompt_token_ids)) + [1] * len(r.prompt_token_ids) for r in group])
        n = max(r.max_tokens for r in group)
        with torch.inference_mode():
            out = hf.generate(
                ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=0
            )
        outs += [out[j, width : width + r.max_tokens].tolist() for j, r in enumerate(group)]
        tokens += sum(r.max_tokens for r in group)
    secs = clock.elapsed()
    return {"duration_s": secs, "output_tokens_per_s": tokens / secs}, outs


def cpu_overhead_table(model, batch_sizes, steps) -> list[str]:
    """Median phase times of pure decode steps per batch size, and the overlap-scheduling model on them."""
    from mlsys_nb.inference.engine import PHASES, LLMEngine
    from mlsys_nb.inference.metrics import measure_decode_overhead, overlap_speedup

    rows = measure_decode_overhead(
        lambda: LLMEngine(model, max_num_seqs=max(batch_sizes)), batch_sizes, prompt_len=64, steps=steps
    )
    out = [
        "",
        f"CPU overhead of a decode step (64-token prompts, median of {steps} decode steps; ms):",
        "",
        "| batch | " + " | ".join(PHASES) + " | CPU (all but model) | CPU share | overlap speed-up (model) |",
        "|---" * (len(PHASES) + 4) + "|",
    ]
    for r in rows:
        out.append(
            f"| {r['batch']} | "
            + " | ".join(f"{1e3 * r[p]:.3f}" for p in PHASES)
            + f" | {1e3 * r['cpu']:.3f} | {r['cpu_share']:.0%} | {overlap_speedup(r['cpu'], r['model']):.2f}x |"
        )
    out += [
        "",
        "Overlap speed-up = (cpu + model) / max(cpu, model): the closed form of preparing step N+1 while "
        "step N runs, applied to the measured phases (a model: on a CPU the model runs on the same cores).",
    ]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 short requests on the tiny preset")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16, help="sequences in flight at most (all systems)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="round-robin repeats; the median run is reported")
    ap.add_argument(
        "--out",
        default="data/measured/serving.md",
        help="append the results (markdown) to this file (never in --quick mode)",
    )
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference.workload import make_workload
    from mlsys_nb.runtime.machine import summary as machine
    from mlsys_nb.models import Transformer, to_hf

    if a.quick:
        preset, cfg, n, lo, hi = "tiny", load_model_preset("tiny"), 4, 4, 8
    else:
        preset, cfg, n, lo, hi = "small", load_model_preset("small").replace(seq_len=512), a.requests, 16, 256
    torch.manual_seed(a.seed)
    model = Transformer(cfg).eval()
    reqs = make_workload(n, prompt_len=(lo, hi), output_len=(lo, hi), vocab_size=min(cfg.vocab_size, 256), seed=a.seed)
    rows, outputs = {}, {}
    big = 4 * a.batch
    systems = [
        ("engine", a.batch, {}),
        ("engine, static batching", a.batch, {"continuous_batching": False}),
        ("engine, no prefix caching", a.batch, {"enable_prefix_caching": False}),
        (f"engine, {big} in flight", big, {}),
    ]
    hf = to_hf(model)
    hf_name = "transformers generate (static)"
    runs = [(name, lambda b=batch, kw=kw: run_engine(model, reqs, b, **kw)) for name, batch, kw in systems]
    runs += [
        (hf_name, lambda: run_hf(hf, reqs, a.batch)),
        (f"transformers generate (static), batches of {big}", lambda: run_hf(hf, reqs, big)),
    ]
    results = {name: [] for name, _ in runs}
    repeats = 1 if a.quick else a.repeats
    for _ in range(repeats):  # round-robin, so slow phases of a shared machine hit every system alike
        for name, fn in runs:
            results[name].append(fn())
    for name, res in results.items():  # the run with the median duration
        row, out = sorted(res, key=lambda x: x[0]["duration_s"])[len(res) // 2]
        rows[name], outputs[name] = row, out
    outputs["hf"] = outputs[hf_name]
    same = sum(x == y for x, y in zip(outputs["engine"], outputs["hf"]))
    base = rows[hf_name]["output_tokens_per_s"]
    useful = sum(r.max_tokens for r in reqs)
    head = (
        f"{n} requests on `{preset}` ({sum(p.numel() for p in model.parameters()):,} parameters, context "
        f"{cfg.seq_len}), prompt and output lengths uniform in {lo}-{hi} (seed {a.seed}), all at t=0, at most "
        f"{a.batch} sequences in flight, greedy, {useful} output tokens, torch threads {a.threads}; each system "
        f"run {repeats}x round-robin, the median run shown."
    )
    lines = [
        head,
        "",
        (
            "| system | seconds | output tokens/s | vs transformers | TTFT p50/p90/p99 (ms) "
            "| TPOT p50/p90/p99 (ms) | latency p50/p99 (ms) |"
        ),
        "|---|---|---|---|---|---|---|",
    ]

    def pct(r, k):
        return "/".join(f"{r[f'{k}_p{p}']:.0f}" for p in (50, 90, 99)) if f"{k}_p50" in r else "n/a"

    for name, r in rows.items():
        lat = f"{r['e2e_ms_p50']:.0f}/{r['e2e_ms_p99']:.0f}" if "e2e_ms_p50" in r else "n/a"
        lines.append(
            f"| {name} | {r['duration_s']:.2f} | {r['output_tokens_per_s']:.1f} | "
            f"{r['output_tokens_per_s'] / base:.2f}x | {pct(r, 'ttft_ms')} | {pct(r, 'tpot_ms')} | {lat} |"
        )
    e = rows["engine"]["output_tokens_per_s"]
    static = rows["engine, static batching"]["output_tokens_per_s"]
    nocache = rows["engine, no prefix caching"]["output_tokens_per_s"]
    best_engine = max(r["output_tokens_per_s"] for k, r in rows.items() if k.startswith("engine"))
    best_hf = max(r["output_tokens_per_s"] for k, r in rows.items() if k.startswith("transformers"))
    lines += [
        "",
        (
            f"engine vs transformers static batching (both {a.batch} in flight): {e / base:.2f}x "
            f"(target >= 2x); best engine row vs best transformers row: {best_engine / best_hf:.2f}x; vs the "
            f"engine's own static batching: {e / static:.2f}x; prefix caching on/off: {e / nocache:.2f}x."
        ),
        f"Greedy outputs identical to transformers (left-padded batches) for {same}/{n} requests.",
    ]
    lines += cpu_overhead_table(model, [1, 2] if a.quick else [1, 4, 16, 64], 2 if a.quick else 30)
    text = "\n".join(lines)
    print(text)
    if a.out and not a.quick:
        with open(a.out, "a") as f:
            f.write(f"\n## {machine()}\n\n{text}\n")


if __name__ == "__main__":
    main()
