"""Does overlapping the gradient all-reduce with backward make a DDP step faster? (gloo, CPU)

    .venv/bin/python benchmarks/ddp_overlap.py [--world-size 2] [--hidden 1024] [--layers 8]
        [--rows 64] [--bucket-mb 4] [--repeats 15] [--out data/measured/ddp_overlap.md]

Each rank times forward + backward + gradient synchronisation of an MLP stack (compute-heavy
layers, big gradients) for: no communication (lower bound), our DDP with all buckets sent after
backward (``no_overlap``, the baseline), our DDP with buckets launched during backward
(``overlap``) and PyTorch's DDP. Variants are interleaved round-robin. Prints medians over the
repeats (the slowest rank per step) and ratios against the baseline measured in the same run.
"""

from __future__ import annotations

import argparse


import mlsys_nb
from mlsys_nb.parallel.harness import TIMING_VARIANTS, time_ddp_steps
from mlsys_nb.runtime.machine import report
from mlsys_nb.runtime.timing import median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--bucket-mb", type=float, default=4.0)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--quick", action="store_true", help="seconds: a 2-layer 16-wide MLP, 1 repeat, no record")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.layers, a.rows, a.repeats, a.out = 16, 2, 2, 1, None
    res = mlsys_nb.launch(
        time_ddp_steps,
        world_size=a.world_size,
        backend="gloo",
        timeout=600,
        kwargs=dict(hidden=a.hidden, layers=a.layers, rows=a.rows, bucket_cap_mb=a.bucket_mb, repeats=a.repeats),
    )
    # a step ends when its slowest rank ends
    step = {v: [max(r["times"][v][i] for r in res) for i in range(a.repeats)] for v in TIMING_VARIANTS}
    med = {v: median(t) for v, t in step.items()}
    base = med["no_overlap"]
    lines = [
        f"world_size {a.world_size}, MLP {a.layers} x Linear({a.hidden}, {a.hidden}), {a.rows} rows per rank, "
        f"gradients {res[0]['grad_bytes'] / 1e6:.1f} MB, bucket {a.bucket_mb} MB, {a.repeats} repeats",
        "",
        "| variant | median step (ms) | min (ms) | max (ms) | vs no_overlap |",
        "|---|---|---|---|---|",
    ]
    for v in TIMING_VARIANTS:
        lines.append(
            f"| {v} | {1e3 * med[v]:.1f} | {1e3 * min(step[v]):.1f} | {1e3 * max(step[v]):.1f} | {med[v] / base:.2f} |"
        )
    hidden = (med["no_overlap"] - med["overlap"]) / max(med["no_overlap"] - med["compute_only"], 1e-12)
    lines += [
        "",
        f"communication time hidden by overlap: {100 * hidden:.0f}% "
        f"((no_overlap - overlap) / (no_overlap - compute_only))",
    ]
    report("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
