"""Speed of the 5D planner (``mlsys_nb.planner.search``) against an exhaustive search.

Target (issue 19): searching a 16k-GPU space takes < 2 s including building the table. The
baseline a user would otherwise write is the exhaustive loop: ``mlsys_nb.memory.estimate`` on every
candidate layout, then sort the ones that fit. It is timed in the same run (on all candidates, or
on a random sample extrapolated to all of them with ``--quick``; the table says which).

    .venv/bin/python benchmarks/planner.py [--quick] [--repeats 3] [--out data/measured/planner.md]
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlsys_nb.runtime.machine import summary as machine  # noqa: E402
from mlsys_nb.runtime.timing import Timer, median  # noqa: E402

CASES = {
    "Llama 3.1 405B, 16,384 H100, 16M tokens x 8K": (
        "llama-3.1-405b",
        dict(gpus=16384, gpu="H100-SXM", global_batch_tokens=2048 * 8192, seq_len=8192),
    ),
    "DeepSeek-V3, 2,048 H800, 15,360 x 4K": (
        "deepseek-v3",
        dict(
            gpus=2048,
            gpu="H800-SXM",
            global_batch_tokens=15360 * 4096,
            seq_len=4096,
            precision="fp8-dsv3",
            ep_copies=4,
            ep_bytes=1.5,
        ),
    ),
    "Llama 3 70B, 1,024 H100, 4M tokens x 4K": (
        "llama-3-70b",
        dict(gpus=1024, gpu="H100-SXM", global_batch_tokens=1024 * 4096, seq_len=4096),
    ),
}


def timed(fn, repeats, before=None):
    t, out = Timer(cpu=True), None
    for _ in range(repeats):
        if before:
            before()
        with t:
            out = fn()
    return median(t.samples), median(t.cpu_samples), out


def exhaustive(model, kw, sample=None, seed=0):
    """memory.estimate on every candidate (or on `sample` of them): seconds per candidate, count."""
    from mlsys_nb import memory, planner

    ctx = planner.context.plan_context(model, **kw)
    cands, _ = planner.layout_search.layout_candidates(
        ctx,
        None,
        None,
        None,
        None,
        (0, 1, 2, 3),
        ("none", "selective", "full"),
        None,
        ("1f1b", "interleaved-1f1b", "zb-h1", "dualpipe"),
        None,
    )
    pick = random.Random(seed).sample(cands, sample) if sample and sample < len(cands) else cands
    fits = []
    with Timer() as t:
        for lay in pick:
            m = ctx.sequences // (lay.dp * lay.micro_batch)
            tm = planner.model.step_time(ctx, lay)
            if tm is None:
                continue
            b = memory.estimate(ctx.model, planner.context.layout_train_config(ctx, lay, m))
            if b.total <= ctx.cap:
                fits.append((sum(tm[0].values()), lay))
        fits.sort(key=lambda x: x[0])
    return t.seconds / len(pick), len(cands), len(pick)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="one case, one repeat, a sampled baseline (a few seconds)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from mlsys_nb import planner

    repeats = 1 if args.quick else args.repeats
    cases = dict(list(CASES.items())[:1]) if args.quick else CASES
    rows = []
    for label, (model, kw) in cases.items():

        def run(model=model, kw=kw):
            return planner.search(model, **kw)

        cold = timed(run, repeats, before=planner.clear_caches)
        warm = timed(run, repeats)
        df = cold[2]
        per, n, done = exhaustive(model, kw, sample=200 if args.quick else None)
        rows.append((label, df.attrs, cold, warm, per * n, done == n, df.iloc[0]))
    lines = [
        "# Planner speed",
        "",
        f"Machine: {machine()} (shared with other jobs: wall times are noisy, CPU times less so).",
        "",
        f"Medians of {repeats} run(s); `cold` clears the planner's memoised closed forms first. Regenerate with "
        "`.venv/bin/python benchmarks/planner.py --out data/measured/planner.md`. Target: < 2 s for a 16k-GPU search "
        "including the table. Baseline: `mlsys_nb.memory.estimate` + step time on every candidate, then sort "
        "(what the planner avoids by pruning with closed-form bounds first).",
        "",
        "| case | candidates | pruned by bound | timed | memory estimates | cold wall (s) | cold CPU (s) | "
        "warm wall (s) | exhaustive (s) | exhaustive / cold | best layout (dp, tp, pp, cp, ep, zero, recompute, "
        "schedule, v) | MFU (model) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, a, cold, warm, exh, full, best in rows:
        exh_s = f"{exh:.1f}" + ("" if full else " (extrapolated from 200)")
        lay = (
            f"{best.dp}, {best.tp}, {best.pp}, {best.cp}, {best.ep}, {best.zero}, {best.recompute}, "
            f"{best.schedule}, {best.v}"
        )
        lines.append(
            f"| {label} | {a['candidates']} | {a['pruned']} | {a['timed']} | {a['memory_estimates']} | "
            f"{cold[0]:.2f} | {cold[1]:.2f} | {warm[0]:.2f} | {exh_s} | {exh / cold[0]:.1f} | {lay} | "
            f"{best.mfu:.1%} |"
        )
    lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.out and not args.quick:  # quick runs are smoke tests: never a record
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
