"""Redraw time of the scaling-law widget (issue 6 target: slider -> redraw <= 100 ms median).

A "redraw" = set the compute slider (the widget recomputes the allocation, time and cost and
updates its artists in place) + render the figure with Agg, which is what displaying it costs.
Baseline measured in the same run: rendering the same figure with no state change (pure
matplotlib cost), so the ratio shows what the widget's own work adds. Wall and CPU medians are
both printed (the machine may be shared: CPU time is the steadier number).

    .venv/bin/python benchmarks/scaling_widget.py [--repeats 15] [--out data/measured/scaling_widget.md]
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
    for i in range(repeats):
        with t:
            fn(i)
    return median(t.samples), median(t.cpu_samples)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="3 repeats, no record")
    args = ap.parse_args(argv)
    if args.quick:
        args.repeats, args.out = 3, None

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from mlsys_nb.widgets.scaling import ScalingWidget

    w = ScalingWidget()
    canvas = FigureCanvasAgg(w.figure)
    canvas.draw()
    budgets = [10 ** (19 + 0.37 * (i % 20)) for i in range(args.repeats)]

    def slider(i):
        w.controls["compute"].value = budgets[i]
        canvas.draw()

    def law_switch(i):
        w.controls["law"].value = ("chinchilla", "epoch", "kaplan")[i % 3]
        canvas.draw()

    def inference(i):
        w.set_state({"inference": True, "inference_tokens": 10 ** (11 + i % 4)})
        canvas.draw()

    base = timed(lambda i: canvas.draw(), args.repeats)
    rows = [
        ("render only (baseline)", *base),
        ("compute slider", *timed(slider, args.repeats)),
        ("law switch", *timed(law_switch, args.repeats)),
        ("inference demand on", *timed(inference, args.repeats)),
    ]
    lines = ["| action | wall median (ms) | CPU median (ms) | wall / baseline |", "|---|---|---|---|"]
    for name, wall, cpu in rows:
        lines.append(f"| {name} | {wall * 1e3:.1f} | {cpu * 1e3:.1f} | {wall / base[0]:.2f} |")
    table = "\n".join(lines)
    print(table)
    if args.out:
        text = "\n".join(
            [
                "# Scaling-law widget redraw time",
                "",
                f"Machine: {machine()} "
                "(shared machine: wall times are inflated by other jobs; CPU time is this process's own).",
                f"Regenerate: `.venv/bin/python benchmarks/scaling_widget.py --out data/measured/scaling_widget.md` "
                f"({args.repeats} repeats, 9 x 3.8 in figure, Agg). Target: redraw <= 100 ms median.",
                "",
                table,
                "",
            ]
        )
        Path(args.out).write_text(text)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
