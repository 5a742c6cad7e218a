"""Benchmark: how well α, β fitted on 2-rank point-to-point exchanges predict gloo's collectives.

    .venv/bin/python benchmarks/comm_prediction.py [--runs 4] [--neighbour-runs 2] [--out data/measured/comm_prediction.md]

Each run launches 2 ranks (gloo, CPU) and calls ``mlsys_nb.comm.pingpong.measure`` with notebook 04's
sizes and repeats (fit: exchanges of 4 KiB - 512 KiB; held out: all-reduce and all-gather of 2, 4,
8 MiB), then ``pingpong.prediction_rows``: every all-reduce algorithm's prediction (at 2 ranks ring,
recursive doubling and Rabenseifner move S per rank, the binomial and pipelined trees 2S) and the
all-gather's with and without the flat-buffer copy δ. It prints, per run, the median relative error
of each model (and the signed one: negative = too fast). ``--neighbour-runs`` more runs are made
with a busy loop pinned to one core (``taskset -c 1``; started and stopped by this script), as a
learner's laptop with a browser open. The ranges notebook 04 quotes come from this record.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlsys_nb  # noqa: E402
from mlsys_nb.comm import pingpong  # noqa: E402
from mlsys_nb.runtime.machine import info as machine  # noqa: E402
from mlsys_nb.runtime.timing import Timer  # noqa: E402

FIT_SIZES = [int(2 ** (k / 2)) // 64 * 64 for k in range(24, 39)]  # notebook 04: 4 KiB .. 512 KiB
PREDICT_SIZES = [4 * FIT_SIZES[-1], 8 * FIT_SIZES[-1], 16 * FIT_SIZES[-1]]  # 2, 4, 8 MiB
MODELS = [("all_reduce", m) for m in pingpong.ALL_REDUCE_MODELS] + [
    ("all_gather", "ring"),
    ("all_gather", "ring + copy"),
]


def one_run(repeats: int, fit_sizes=FIT_SIZES, predict_sizes=PREDICT_SIZES) -> dict:
    pp = mlsys_nb.launch(
        pingpong.measure,
        world_size=2,
        args=(fit_sizes, predict_sizes),
        kwargs=dict(repeats=repeats),
        backend="gloo",
        timeout=600,
        output="quiet",
    )[0]
    rows = pingpong.prediction_rows(pp)
    return dict(pingpong.median_errors(rows), share=pingpong.copy_share_of_gap(rows))


def neighbour():
    """A busy loop pinned to core 1 (a browser tab that spins): the caller stops it."""
    cmd = [sys.executable, "-c", "while True: pass"]
    if shutil.which("taskset"):
        cmd = ["taskset", "-c", "1"] + cmd
    return subprocess.Popen(cmd)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=4, help="runs without a neighbour")
    ap.add_argument("--neighbour-runs", type=int, default=2, help="runs beside a busy loop on core 1")
    ap.add_argument("--repeats", type=int, default=25, help="timed rounds per run (notebook 04: 25)")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown record here")
    ap.add_argument("--append", default=None, metavar="TITLE", help="append the runs to --out as a section TITLE")
    ap.add_argument(
        "--quick", action="store_true", help="one run, 3 rounds, 2 fit sizes, 1 held out, no neighbour, no record"
    )
    a = ap.parse_args(argv)
    sizes = (FIT_SIZES, PREDICT_SIZES)
    if a.quick:
        a.runs, a.neighbour_runs, a.repeats, a.out = 1, 0, 3, None
        sizes = (FIT_SIZES[::14], PREDICT_SIZES[:1])  # the fewest: alpha, beta need 2 sizes, gamma, delta 1
    if a.runs < 0 or a.neighbour_runs < 0 or a.runs + a.neighbour_runs < 1 or a.repeats < 3:
        raise SystemExit("need --runs >= 0, --neighbour-runs >= 0, one run at least, --repeats >= 3")
    head = machine()
    rows = []
    for k in range(a.runs + a.neighbour_runs):
        busy = k >= a.runs
        proc = neighbour() if busy else None
        try:
            load0 = os.getloadavg()[0]
            with Timer() as t:
                err = one_run(a.repeats, *sizes)
            wall = t.seconds
        finally:
            if proc is not None:
                proc.kill()
                proc.wait()
        row = {"run": k + 1, "neighbour": "busy core 1" if busy else "none", "load (1 min)": f"{load0:.1f}"}
        row["wall (s)"] = f"{wall:.0f}"
        for op, m in MODELS:
            row[f"{op} {m}"] = f"{err[(op, m)]:.0%} ({err[(op, m, 'signed')]:+.0%})"
        row["δ's share of the all-gather gap"] = f"{err['share']:.0%}"
        rows.append(row)
        print(row, flush=True)

    def spread(op, m, which):
        key = "δ's share of the all-gather gap" if op is None else f"{op} {m}"
        vals = [float(r[key].split("%")[0]) for r in rows if which(r)]
        return f"{min(vals):.0f}-{max(vals):.0f} %" if vals else "-"

    summary = ["| model | k_β at n = 2 | all runs | without neighbour | with neighbour |", "|---|---|---|---|---|"]
    from mlsys_nb.comm.cost import cost_coefficients

    summary.append(
        f"| δ's share of the pure all-gather model's shortfall | - | {spread(None, 'share', lambda r: True)} | "
        f"{spread(None, 'share', lambda r: r['neighbour'] == 'none')} | "
        f"{spread(None, 'share', lambda r: r['neighbour'] != 'none')} |"
    )
    for op, m in MODELS:
        kb = cost_coefficients(op, "ring" if m == "ring + copy" else m, 2)[1]
        summary.append(
            f"| {op} {m} | {kb:g} | {spread(op, m, lambda r: True)} | "
            f"{spread(op, m, lambda r: r['neighbour'] == 'none')} | {spread(op, m, lambda r: r['neighbour'] != 'none')} |"
        )
    cols = list(rows[0])
    table = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    table += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    text = (
        "\n".join(summary) + "\n\nPer run: median |relative error| over the 3 held-out sizes (median signed error).\n\n"
    )
    text += "\n".join(table)
    print(text)
    if a.out and a.append:
        section = [
            "",
            f"## {a.append}",
            "",
            f"Regenerate: `.venv/bin/python benchmarks/comm_prediction.py --runs {a.runs} --neighbour-runs "
            f"{a.neighbour_runs} --repeats {a.repeats} --out {a.out} --append '{a.append}'`",
            "",
            "Machine: " + "; ".join(f"{k}: {v}" for k, v in head.items()) + ".",
            "",
            text,
            "",
        ]
        with a.out.open("a") as f:
            f.write("\n".join(section))
        print("appended to", a.out)
    elif a.out:
        a.out.write_text(
            "\n".join(
                [
                    "# Predicting gloo's collectives from 2-rank point-to-point fits (notebook 04, section 4)",
                    "",
                    f"Regenerate: `.venv/bin/python benchmarks/comm_prediction.py --runs {a.runs} "
                    f"--neighbour-runs {a.neighbour_runs} --repeats {a.repeats} --out {a.out}`",
                    "",
                    "Machine: " + "; ".join(f"{k}: {v}" for k, v in head.items()) + ".",
                    "The machine was shared with other jobs (the load column); runs with a neighbour had, on top, a "
                    "busy loop pinned to core 1.",
                    "",
                    "Fit: α, β of `T = α + S/β` on 2-rank exchanges (both ranks `isend` + `irecv` at once) of "
                    f"{FIT_SIZES[0]} B - {FIT_SIZES[-1]} B; γ (local `a += b`) and δ (a fresh flat buffer written and "
                    "copied out) timed inside a rank. Held out: gloo's `all_reduce` and `all_gather_into_tensor` "
                    f"of {', '.join(str(s) for s in PREDICT_SIZES)} B. Every time is the lower quartile of "
                    f"{a.repeats} interleaved rounds (`mlsys_nb.comm.pingpong.measure`). Relative error = "
                    "|predicted - measured| / measured; signed: negative = the model is too fast.",
                    "",
                    "At 2 ranks ring, recursive doubling and Rabenseifner all move S per rank (k_β = 1) and differ "
                    "only by one α; the binomial and the pipelined tree move 2S (k_β = 2).",
                    "",
                    "## Ranges (median relative error per run)",
                    "",
                    text,
                    "",
                ]
            )
        )
        print("wrote", a.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
