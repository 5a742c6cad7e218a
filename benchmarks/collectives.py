"""Benchmark: the from-scratch ring all-reduce vs torch.distributed.all_reduce, as busbw.

    .venv/bin/python benchmarks/collectives.py [--ranks 4] [--repeats 7] [--out data/measured/collectives.md]

On ``--ranks`` ranks (gloo on CPU; NCCL with ``--backend nccl`` on GPUs) it times, interleaved in
one launch, ``mlsys_nb.comm.collectives.ring_all_reduce`` (isend/irecv, pipelined pieces, in-place adds)
and ``dist.all_reduce`` at 1, 16 and 64 MiB, and measures memcpy bandwidth in the same run.
Prints a table of medians, busbw (nccl-tests: algbw x 2(n-1)/n), busbw as a fraction of memcpy
bandwidth and the ratio ring / torch. Target: ring >= 0.5x torch's busbw at >= 16 MiB.
With ``--out`` it also writes the table with the machine description (markdown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from mlsys_nb import comm  # noqa: E402
from mlsys_nb.runtime.machine import info as machine

MiB = 1 << 20
SIZES = (1 * MiB, 16 * MiB, 64 * MiB)
TARGET = 0.5


def run(ranks: int, repeats: int, backend: str, sizes=SIZES, memcpy_bytes=64 * MiB, memcpy_repeats=9):
    mem = comm.memcpy_bandwidth(nbytes=memcpy_bytes, repeats=memcpy_repeats)
    df = comm.sweep(
        ops=("all_reduce",),
        sizes=sizes,
        world_sizes=(ranks,),
        impls=("torch", "ring"),
        backend=backend,
        warmup=1,
        repeats=repeats,
        timeout=600,
    )
    mem_after = comm.memcpy_bandwidth(nbytes=memcpy_bytes, repeats=memcpy_repeats)
    memcpy = (mem.median_bytes_per_s + mem_after.median_bytes_per_s) / 2
    rows = []
    for size in sizes:
        t = df[(df["bytes"] == size) & (df["impl"] == "torch")].iloc[0]
        r = df[(df["bytes"] == size) & (df["impl"] == "ring")].iloc[0]
        rows.append(
            {
                "size (MiB)": size // MiB,
                f"{t['backend']} all_reduce median (ms)": t["median_s"] * 1e3,
                f"{t['backend']} IQR (ms)": f"{t['q25_s'] * 1e3:.1f}-{t['q75_s'] * 1e3:.1f}",
                "ring median (ms)": r["median_s"] * 1e3,
                "ring IQR (ms)": f"{r['q25_s'] * 1e3:.1f}-{r['q75_s'] * 1e3:.1f}",
                f"{t['backend']} busbw (GB/s)": t["busbw_Bps"] / 1e9,
                "ring busbw (GB/s)": r["busbw_Bps"] / 1e9,
                f"{t['backend']} / memcpy": t["busbw_Bps"] / memcpy,
                "ring / memcpy": r["busbw_Bps"] / memcpy,
                f"ring / {t['backend']}": r["busbw_Bps"] / t["busbw_Bps"],
            }
        )
    import pandas as pd

    return pd.DataFrame(rows), memcpy, (mem, mem_after)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--out", type=Path, default=None, help="write a markdown record here")
    ap.add_argument("--quick", action="store_true", help="seconds: 2 ranks, 1 MiB only, 1 repeat; no target, no record")
    a = ap.parse_args(argv)
    info = machine()
    if a.quick:
        a.ranks, a.repeats, a.out = 2, 1, None
    if a.quick:  # a smoke test of every code path: the smallest size, one memcpy of it before and after
        table, memcpy, (m0, m1) = run(a.ranks, a.repeats, a.backend, (1 * MiB,), memcpy_bytes=MiB, memcpy_repeats=1)
    else:
        table, memcpy, (m0, m1) = run(a.ranks, a.repeats, a.backend)
    text = table.to_markdown(index=False, floatfmt=".3g")
    ratio_col = [c for c in table.columns if c.startswith("ring / ") and c != "ring / memcpy"][0]
    ok = bool((table[table["size (MiB)"] >= 16][ratio_col] >= TARGET).all())
    verdict = f"target ring >= {TARGET}x busbw at >= 16 MiB: {'MET' if ok else 'NOT MET'}"
    print(text)
    print(
        f"memcpy bandwidth (copy into a preallocated {m0.nbytes // MiB} MiB tensor, median; before/after the run): "
        f"{m0.median_bytes_per_s / 1e9:.2f} / {m1.median_bytes_per_s / 1e9:.2f} GB/s"
    )
    print(verdict)
    if a.out:
        lines = [
            "# Collectives benchmark: from-scratch ring all-reduce vs torch.distributed",
            "",
            f"Regenerate: `.venv/bin/python benchmarks/collectives.py --ranks {a.ranks} "
            f"--repeats {a.repeats} --out {a.out}`",
            "",
            "Machine: " + "; ".join(f"{k}: {v}" for k, v in info.items()) + ".",
            "The machine was **shared with other agents' jobs** while this ran: absolute numbers are "
            "noisy; the ratios come from one launch with the two implementations interleaved.",
            "",
            f"{a.ranks} ranks, float32, {a.repeats} timed repeats after 1 warm-up, time of a call = slowest "
            "rank, median and interquartile range (IQR). busbw = size / time x 2(n-1)/n (nccl-tests). "
            f"memcpy = {memcpy / 1e9:.2f} GB/s (mean of the medians before and after the sweep).",
            "",
            text,
            "",
            verdict,
            "",
        ]
        a.out.write_text("\n".join(lines))
        print("wrote", a.out)
    return 0 if (ok or a.quick) else 1


if __name__ == "__main__":
    sys.exit(main())
