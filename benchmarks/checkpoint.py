"""How long does a checkpoint stall training: synchronous ``dcp.save`` vs ``dcp.async_save`` (gloo, CPU)

    .venv/bin/python benchmarks/checkpoint.py [--world-size 2] [--hidden 512 1024] [--repeats 5] [--blocking]
        [--out data/measured/checkpoint.md]

For each width, one FSDP2 job (``mlsys_nb.checkpoint.sharded.async_stall_job``: a 3-layer MLP with AdamW)
saves synchronously and asynchronously in turn, ``repeats`` times each, interleaved, with training steps
between saves (the async write overlaps them). The stall is the seconds the training loop waits in the save
call. Prints medians and the shortest stalls (the shortest is what notebook 24 checks: on a loaded machine a
median of a few stalls moves by half, the least stall of each kind stays apart) with their ratios async / sync
measured in the same run, and the checkpoint's bytes. ``--blocking`` runs the control: an "async" save that
writes synchronously and returns a done future (``async_stall_job(blocking=True)``), whose ratio sits near 1.
"""

from __future__ import annotations

import argparse
import tempfile

import mlsys_nb
from mlsys_nb.checkpoint import Spec, async_stall_job, directory_bytes
from mlsys_nb.runtime.machine import report
from mlsys_nb.runtime.timing import median


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--hidden", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None, help="append the table (markdown) to this file")
    ap.add_argument("--blocking", action="store_true", help="the control: an 'async' save that blocks")
    ap.add_argument("--quick", action="store_true", help="seconds: hidden 64, 1 repeat, no record")
    a = ap.parse_args()
    if a.quick:
        a.hidden, a.repeats, a.out = [64], 1, None
    lines = [
        f"world_size {a.world_size}, MLP Linear(8, h), Linear(h, h), Linear(h, 4) with AdamW, {a.repeats} repeats "
        "of each save, interleaved" + (" (control: the 'async' save blocks)" if a.blocking else ""),
        "",
        "| hidden h | checkpoint bytes | sync stall median (ms) | async stall median (ms) | async / sync (medians) "
        "| sync stall shortest (ms) | async stall shortest (ms) | async / sync (shortest) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for h in a.hidden:
        with tempfile.TemporaryDirectory() as d:
            r = mlsys_nb.launch(
                async_stall_job,
                a.world_size,
                args=(Spec(hidden=h), d, a.repeats),
                kwargs={"blocking": a.blocking},
                output="quiet",
                timeout=600,
            )[0]
            size = directory_bytes(r["path"])
        s, y = median(r["sync_stall_s"]), median(r["async_stall_s"])
        s0, y0 = min(r["sync_stall_s"]), min(r["async_stall_s"])
        lines.append(
            f"| {h} | {size:,} | {1e3 * s:.1f} | {1e3 * y:.1f} | {y / s:.2f} | {1e3 * s0:.1f} | {1e3 * y0:.1f} "
            f"| {y0 / s0:.2f} |"
        )
    report("\n".join(lines), a.out)


if __name__ == "__main__":
    main()
