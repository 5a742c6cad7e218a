"""Overhead of the live cluster (mlsys_nb.Cluster + %%ranks) against ipyparallel in the same run.

Targets (issue 3): a trivial cell on 4 warm ranks <= 20 ms median; a 1-element all_reduce cell
<= 30 ms median. Baselines measured in the same run: the same all_reduce timed inside a rank (the
part no cell machinery can remove) and ipyparallel 9 (4 engines, ``DirectView.execute``), the
alternative the cluster was designed against.

    .venv/bin/python benchmarks/cluster.py [--world-size 4] [--repeats 200] [--no-ipyparallel]
        [--out data/measured/cluster.md]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlsys_nb.runtime.machine import summary as machine  # noqa: E402
from mlsys_nb.runtime.timing import Timer, median, quantile, repeat  # noqa: E402

TRIVIAL = "pass"
IN_RANK_ROW = "1-element all_reduce (median over ranks' medians)"
RESTART_ROW = "restart (kill + start + init group)"
IPP_RESTART_ROW = "restart engines + import torch"
ALL_REDUCE = "t = torch.ones(1)\ndist.all_reduce(t)"
IN_RANK = """
import time, statistics
t = torch.ones(1)
for _ in range(20):
    dist.all_reduce(t)
samples = []
for _ in range({n}):
    s = time.perf_counter(); dist.all_reduce(t); samples.append(time.perf_counter() - s)
statistics.median(samples)
"""


def _median_ms(fn, repeats, warmup=10):
    samples = repeat(fn, repeats, warmup)
    return (
        median(samples) * 1e3,
        quantile(samples, 0.1, method="nearest") * 1e3,
        quantile(samples, 0.9, method="nearest") * 1e3,
    )


def measure_cluster(world_size, repeats, warmup=10):
    from IPython.core.interactiveshell import InteractiveShell

    import mlsys_nb

    rows = []
    with Timer() as t:
        cluster = mlsys_nb.Cluster(world_size=world_size, timeout=60)
    rows.append(("mlsys_nb.Cluster", "start (first, forkserver cold)", t.seconds * 1e3, None, None))
    with t:
        cluster.restart()
    rows.append(("mlsys_nb.Cluster", RESTART_ROW, t.seconds * 1e3, None, None))
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "mlsys_nb")
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        for name, cell in (("%%ranks trivial cell", TRIVIAL), ("%%ranks 1-element all_reduce cell", ALL_REDUCE)):
            rows.append(
                (
                    "mlsys_nb.Cluster",
                    name,
                    *_median_ms(lambda cell=cell: ip.run_cell_magic("ranks", "", cell), repeats, warmup),
                )
            )
        inside = cluster.execute(IN_RANK.format(n=repeats), show=False)
    rows.append(("baseline: inside a rank", IN_RANK_ROW, median(float(v) for v in inside) * 1e3, None, None))
    cluster.shutdown()
    return rows


def measure_ipyparallel(world_size, repeats):
    import ipyparallel as ipp

    rows = []
    with Timer() as t:
        cluster = ipp.Cluster(n=world_size, controller_ip="127.0.0.1", log_level=40)
        rc = cluster.start_and_connect_sync()
        view = rc[:]
        view.execute("import torch", block=True)
    rows.append(("ipyparallel 9", "start + import torch", t.seconds * 1e3, None, None))
    rows.append(("ipyparallel 9", "trivial execute", *_median_ms(lambda: view.execute(TRIVIAL, block=True), repeats)))
    with t:
        cluster.restart_engines_sync()
        rc.wait_for_engines(world_size, timeout=120)
        rc[:].execute("import torch", block=True)
    rows.append(("ipyparallel 9", IPP_RESTART_ROW, t.seconds * 1e3, None, None))
    cluster.stop_cluster_sync()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-size", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=200)
    ap.add_argument("--no-ipyparallel", action="store_true")
    ap.add_argument("--out", default=None, help="also write the table as markdown to this file")
    ap.add_argument("--quick", action="store_true", help="seconds: 2 ranks, 1 repeat, no ipyparallel, no record")
    args = ap.parse_args()
    if args.quick:
        args.world_size, args.repeats, args.no_ipyparallel, args.out = 2, 1, True, None
    info = machine()
    rows = measure_cluster(args.world_size, args.repeats, warmup=1 if args.quick else 10)
    if not args.no_ipyparallel:
        rows += measure_ipyparallel(args.world_size, min(args.repeats, 100))
    by = {(who, what): med for who, what, med, *_ in rows}
    trivial = by[("mlsys_nb.Cluster", "%%ranks trivial cell")]
    reduce_cell = by[("mlsys_nb.Cluster", "%%ranks 1-element all_reduce cell")]
    lines = [
        f"| system | measurement ({args.world_size} ranks) | median (ms) | p10 (ms) | p90 (ms) |",
        "|---|---|---|---|---|",
    ]
    for who, what, med, p10, p90 in rows:
        fmt = lambda v: "" if v is None else f"{v:.2f}"
        lines.append(f"| {who} | {what} | {med:.2f} | {fmt(p10)} | {fmt(p90)} |")
    ratios = [
        f"- trivial cell: {trivial:.2f} ms (target <= 20 ms: {'met' if trivial <= 20 else 'NOT met'})",
        f"- all_reduce cell: {reduce_cell:.2f} ms (target <= 30 ms: "
        f"{'met' if reduce_cell <= 30 else 'NOT met'}); cell overhead above the in-rank "
        f"all_reduce: {reduce_cell - by[('baseline: inside a rank', IN_RANK_ROW)]:.2f} ms",
    ]
    if not args.no_ipyparallel:
        ipp_trivial = by[("ipyparallel 9", "trivial execute")]
        ratios.append(f"- ipyparallel trivial execute / %%ranks trivial cell: {ipp_trivial / trivial:.1f}x")
        ratios.append(
            f"- ipyparallel restart / Cluster restart: "
            f"{by[('ipyparallel 9', IPP_RESTART_ROW)] / by[('mlsys_nb.Cluster', RESTART_ROW)]:.1f}x"
        )
    text = "\n".join([info, "", *lines, "", *ratios])
    print(text)
    if args.out:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip()
        Path(args.out).write_text(
            "# Live-cluster overhead (`benchmarks/cluster.py`)\n\n"
            f"Regenerate: `.venv/bin/python benchmarks/cluster.py --out {args.out}` (commit {rev}).\n"
            "The machine was shared with other jobs while this ran: absolute times are noisy, the "
            "ratios within one run are the comparison.\n\n" + text + "\n"
        )


if __name__ == "__main__":
    main()
