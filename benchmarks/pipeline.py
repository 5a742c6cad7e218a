"""Speed of the pipeline simulator and the schedule widget.

Targets (issue 7): simulating p=64, m=512, v=4 takes < 1 s; a widget slider move redraws in
<= 150 ms median at p=16, m=64. Baseline measured in the same run: GPipe at the same p and m
(the simplest schedule, the same number of micro-batches), so the ratio shows what a schedule's
structure costs on top of the op count.

    .venv/bin/python benchmarks/pipeline.py [--repeats 5] [--out data/measured/pipeline.md]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.timing import Timer, median

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def timed(fn, repeats):
    t = Timer(cpu=True)
    for _ in range(repeats):
        with t:
            fn()
    return median(t.samples), median(t.cpu_samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="p=4, m=8, 1 repeat, one widget move, no record")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.out = 1, None

    from mlsys_nb.pipeline import schedule, simulate

    P, M = (4, 8) if args.quick else (64, 512)
    cases = [
        ("gpipe", None),
        ("1f1b", None),
        ("interleaved-1f1b", 4),
        ("zb-h1", None),
        ("zb-h2", None),
        ("zbv", None),
        ("dualpipe", None),
        ("dualpipev", None),
    ]
    rows = []
    for name, v in cases:
        split = name in ("zb-h1", "zb-h2", "zbv", "dualpipe", "dualpipev")
        costs = dict(F=1.0, B=1.0, W=1.0) if split else dict(F=1.0, B=2.0)
        gen = timed(lambda name=name, v=v: schedule(name, P, M, v), args.repeats)
        s = schedule(name, P, M, v)
        first = timed(
            lambda name=name, v=v, costs=costs: simulate(schedule(name, P, M, v), **costs), args.repeats
        )  # build + simulate
        sim = timed(lambda s=s, costs=costs: simulate(s, **costs), args.repeats)  # schedule reused
        ops = sum(map(len, s.compute))
        rows.append((name, s.v, ops, gen, first, sim))
    base = rows[0][4][0]

    from mlsys_nb.widgets.pipeline import PipelineWidget

    wp, wm = (4, 8) if args.quick else (16, 64)
    w = PipelineWidget(schedule="interleaved-1f1b", p=wp, m=wm, v=2)
    moves = Timer(cpu=True)
    for i in range(1 if args.quick else max(args.repeats, 7)):
        with moves:
            w.controls["F"].value = 1.0 + 0.1 * (i + 1)
    widget_wall = median(moves.samples)
    widget_cpu = median(moves.cpu_samples)

    lines = [
        "# Pipeline simulator and widget speed",
        "",
        # the summary names torch's version, and importing torch is most of a quick run (nothing else needs it)
        f"Machine: {'(not summarised in --quick)' if args.quick else machine()} "
        "(the machine was shared with other jobs: wall times are inflated, CPU times less so).",
        "",
        f"Medians of {args.repeats} runs; regenerate with "
        "`.venv/bin/python benchmarks/pipeline.py --out data/measured/pipeline.md`.",
        "",
        f"## Simulating p = {P}, m = {M} (target: interleaved v = 4 in < 1 s)",
        "",
        "| schedule | v | ops | generate wall (s) | generate + simulate wall (s) | CPU (s) "
        "| simulate only wall (s) | CPU (s) | ratio to gpipe (generate + simulate) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v, ops, gen, first, sim in rows:
        lines.append(
            f"| {name} | {v} | {ops} | {gen[0]:.3f} | {first[0]:.3f} | {first[1]:.3f} | {sim[0]:.3f} | "
            f"{sim[1]:.3f} | {first[0] / base:.2f} |"
        )
    lines += [
        "",
        f"## Widget slider move at p = {wp}, m = {wm} (interleaved-1f1b, v = 2; target <= 150 ms median)",
        "",
        "A move re-simulates the shown schedule, re-simulates all eight schedules for the comparison",
        "table, redraws the Gantt chart and renders it to PNG.",
        "",
        "| measure | median (ms) |",
        "|---|---|",
        f"| wall | {widget_wall * 1e3:.0f} |",
        f"| CPU of this process | {widget_cpu * 1e3:.0f} |",
        "",
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
