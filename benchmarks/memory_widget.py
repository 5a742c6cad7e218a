"""How long does the memory widget take to redraw after a slider change? (target: <= 100 ms median)

    .venv/bin/python benchmarks/memory_widget.py [--repeats 30] [--out data/measured/memory_widget.md]

Times, interleaved in one process: (a) the calculator alone (``memory.estimate`` for the state),
the named baseline; (b) a full widget update after one control change (estimate, table, stacked
bar redrawn) including rendering the figure to PNG (what the front end receives), cycling the
sequence-length, TP, ZeRO and model controls. Prints medians, spreads and the ratio to (a).
"""

from __future__ import annotations

import argparse
import io
import platform
import subprocess

import matplotlib

matplotlib.use("Agg")


from mlsys_nb.widgets.memory import MemoryWidget  # noqa: E402
from mlsys_nb.runtime.machine import summary as machine
from mlsys_nb.runtime.timing import Timer, median

TARGET_S = 0.100
CHANGES = [
    {"seq_len": 8192},
    {"tp": 4},
    {"zero": 3},
    {"model": "llama-3.1-70b"},
    {"seq_len": 4096},
    {"tp": 8},
    {"zero": 1},
    {"model": "llama-3.1-8b"},
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=30)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="1 repeat, no record")
    args = ap.parse_args()
    if args.quick:
        args.repeats, args.out = 1, None
    w = MemoryWidget()
    calc_t, full_t = Timer(cpu=True), Timer(cpu=True)
    for i in range(args.repeats + 2):
        change = CHANGES[i % len(CHANGES)]
        state = w.state() | change
        with calc_t:
            w.compute(state)
        with full_t:
            name, value = next(iter(change.items()))
            w.controls[name].value = value  # triggers update()
            w.figure.savefig(io.BytesIO(), format="png")
    calc, full = calc_t.samples[2:], full_t.samples[2:]  # the first two runs are warm-up
    calc_cpu, full_cpu = calc_t.cpu_samples[2:], full_t.cpu_samples[2:]
    rows = [
        ("memory.estimate only (baseline), wall", calc),
        ("widget update + PNG render, wall", full),
        ("memory.estimate only, CPU time of this process", calc_cpu),
        ("widget update + PNG render, CPU time of this process", full_cpu),
    ]
    base = median(calc)
    lines = ["| step | median (ms) | min (ms) | max (ms) | ratio to baseline (wall) |", "|---|---|---|---|---|"]
    for n, xs in rows:
        med = median(xs)
        lines.append(f"| {n} | {med * 1e3:.1f} | {min(xs) * 1e3:.1f} | {max(xs) * 1e3:.1f} | {med / base:.1f} |")
    load = open("/proc/loadavg").read().split()[0] if platform.system() == "Linux" else "?"
    wall, cpu = median(full), median(full_cpu)
    text = "\n".join(lines) + (
        f"\n\nTarget: widget update <= {TARGET_S * 1e3:.0f} ms median. Wall: {wall * 1e3:.0f} ms "
        f"({'meets' if wall <= TARGET_S else 'misses'}); CPU time of the process (what an idle machine would "
        f"take): {cpu * 1e3:.0f} ms ({'meets' if cpu <= TARGET_S else 'misses'}). 1-min load average during "
        f"the run: {load} on {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} cores.\n"
    )
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(
                f"# Memory widget redraw time\n\nMachine: {machine()} (shared with other jobs: noisy).\n"
                f"Command: `.venv/bin/python benchmarks/memory_widget.py --repeats {args.repeats}`\n\n{text}"
            )


if __name__ == "__main__":
    main()
