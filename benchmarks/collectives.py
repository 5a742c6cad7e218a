"""Benchmark: all-reduce at the speed of memory? gloo vs the kit's ring vs shared memory vs memcpy, as busbw.

    .venv/bin/python benchmarks/collectives.py [--ranks 2,4] [--repeats 7] [--out data/measured/collectives.md]

On each world size of ``--ranks`` (gloo CPU ranks of this machine) it times, interleaved round-robin in one
launch (``comm.sweep``: a barrier before each timed call, the slowest rank's time), at 4 KiB .. 64 MiB:
``dist.all_reduce`` (gloo: loopback TCP), the kit's ``ring_all_reduce`` (send/recv), and
``comm.shm.ShmAllReduce`` with sequence-number flags (``shm``) and with a barrier per wait (``shm_barrier``);
and ``dst.copy_(src)`` of the same sizes in this process (memcpy, the ceiling). Prints medians with
interquartile ranges, busbw (nccl-tests: algbw x 2(n-1)/n), the α-β fit of each (``comm.fit_alpha_beta``,
ring coefficients, so β reads as a busbw), and where the shared-memory all-reduce spends its time at the
largest sizes (``ShmAllReduce.phase_s``: the three copies and the two waits).
Goals (issue 51): shm >= 30 % of memcpy's bandwidth and >= 5x gloo's busbw at >= 16 MiB, shm's 4 KiB latency
below gloo's; the ring stays >= 0.5x gloo at >= 16 MiB. With ``--out`` it writes the markdown record and a
.csv beside it (every row), keeping the record's "Earlier runs" section.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402

from mlsys_nb import comm  # noqa: E402
from mlsys_nb.runtime.machine import info as machine  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
SIZES = tuple(4 * KiB * 4**k for k in range(8))  # 4 KiB .. 64 MiB
IMPLS = ("torch", "ring", "shm", "shm_barrier")
HISTORY = "## Earlier runs"
GOAL_MEMCPY, GOAL_GLOO, RING_TARGET, BIG = 0.30, 5.0, 0.5, 16 * MiB


def phases(nbytes: int, repeats: int) -> dict:
    """On every rank: seconds per call in each phase of ``ShmAllReduce`` (flags) at ``nbytes`` of float32."""
    import torch

    from mlsys_nb.comm.shm import ShmAllReduce

    x = torch.ones(nbytes // 4)
    with ShmAllReduce(sync="flags") as shm:
        shm(x), shm(x)  # warm: every page of every buffer mapped
        shm.phase_s = dict.fromkeys(shm.phase_s, 0.0)
        for _ in range(repeats):
            shm(x)
        return {k: v / repeats for k, v in shm.phase_s.items()}


def steps(repeats: int) -> dict:
    """On every rank: seconds per training step with ``dist.all_reduce`` (gloo) and with the shared-memory one
    (interleaved): a DDP step of a 2-layer MLP (hidden 1024: 8 MiB of gradients, one bucket) and a forward +
    backward of a tensor-parallel SwiGLU MLP (hidden 512, 2 x 128 tokens: a 512 KiB all-reduce each way)."""
    import time

    import torch
    from torch import nn

    from mlsys_nb.comm.shm import ShmAllReduce
    from mlsys_nb.config import tiny_config
    from mlsys_nb.parallel import functional as pf
    from mlsys_nb.parallel import tensor as tp
    from mlsys_nb.parallel.ddp import DataParallel

    torch.manual_seed(0)
    nets = {impl: DataParallel(nn.Sequential(nn.Linear(1024, 1024), nn.ReLU(), nn.Linear(1024, 1024)), all_reduce=impl)
            for impl in (None, "shm")}  # fmt: skip
    x = torch.randn(8, 1024)
    mlp = tp.TPMLP(tiny_config(hidden=512, ffn_hidden=2048, n_heads=8, n_kv_heads=8))
    h = torch.randn(2, 128, 512, requires_grad=True)
    shm = ShmAllReduce()

    def ddp(impl):
        nets[impl](x).square().mean().backward()

    def tp_mlp(impl):
        previous = pf.set_all_reduce(shm if impl else None)
        mlp(h).square().mean().backward()
        pf.set_all_reduce(previous)

    out = {(name, impl): [] for name in ("DDP step", "TP MLP fwd+bwd") for impl in (None, "shm")}
    for i in range(repeats + 1):  # the first round warms up
        for name, fn in (("DDP step", ddp), ("TP MLP fwd+bwd", tp_mlp)):
            for impl in (None, "shm"):
                torch.distributed.barrier()
                t = time.perf_counter()
                fn(impl)
                if i:
                    out[(name, impl)].append(time.perf_counter() - t)
    for net in nets.values():
        net.close()
    shm.close()
    return out


def run(world_sizes, repeats: int, sizes=SIZES, memcpy_repeats: int = 9, warmup: int = 1):
    """The sweep (a DataFrame, memcpy rows included as impl ``memcpy``), memcpy's 64 MiB bandwidth (mean of
    before and after), the α-β fits and the phase breakdown {world size: {size: mean over ranks}}."""
    import pandas as pd
    import torch

    import mlsys_nb

    torch.set_num_threads(1)  # memcpy as one rank does it (each rank runs one thread); parallel copies under load
    # wait for the slowest of their threads (measured: ~32 ms for any copy >= 256 KiB at load 11 on 2 cores)
    big = min(64 * MiB, max(sizes))
    before = comm.memcpy_bandwidth(nbytes=big, repeats=memcpy_repeats)
    df = comm.sweep(
        ops=("all_reduce",), sizes=sizes, world_sizes=world_sizes, impls=IMPLS, backend="gloo",
        warmup=warmup, repeats=repeats, timeout=900, progress=False,
    )  # fmt: skip
    per_size = [comm.memcpy_bandwidth(nbytes=s, repeats=max(memcpy_repeats, 3)) for s in sizes]
    after = comm.memcpy_bandwidth(nbytes=big, repeats=memcpy_repeats)
    memcpy = (before.median_bytes_per_s + after.median_bytes_per_s) / 2
    mem_rows = [
        dict(op="memcpy", impl="memcpy", backend="", world_size=1, bytes=m.nbytes, median_s=m.nbytes / m.median_bytes_per_s,
             q25_s=m.nbytes / m.q75_bytes_per_s, q75_s=m.nbytes / m.q25_bytes_per_s, min_s=np.nan,
             algbw_Bps=m.median_bytes_per_s, busbw_Bps=m.median_bytes_per_s, repeats=m.repeats)
        for m in per_size
    ]  # fmt: skip
    df = pd.concat([df, pd.DataFrame(mem_rows)], ignore_index=True)
    fits = []
    for (ws, impl), g in df[df.impl != "memcpy"].groupby(["world_size", "impl"]):
        f = comm.fit_alpha_beta(g.bytes.values, g.median_s.values, "all_reduce", int(ws), "ring")
        fits.append(dict(world_size=int(ws), impl=impl, alpha_us=f.alpha_s * 1e6, beta_GBps=f.beta_bytes_per_s / 1e9,
                         median_rel_error=f.median_rel_error))  # fmt: skip
    m = df[df.impl == "memcpy"]
    f = comm.fit_alpha_beta(m.bytes.values, m.median_s.values, "broadcast", 2, "binomial_tree")  # T = α + S/β
    fits.append(dict(world_size=1, impl="memcpy", alpha_us=f.alpha_s * 1e6, beta_GBps=f.beta_bytes_per_s / 1e9,
                     median_rel_error=f.median_rel_error))  # fmt: skip
    breakdown, step_rows = {}, []
    for ws in world_sizes:
        at = [s for s in sizes if s >= BIG] or [max(sizes)]
        per_rank = mlsys_nb.launch(phases, ws, args=(max(at), max(repeats, 3)), backend="gloo", output="quiet")
        breakdown[ws] = {k: float(np.mean([r[k] for r in per_rank])) for k in per_rank[0]}
        per_rank = mlsys_nb.launch(steps, ws, args=(repeats,), backend="gloo", output="quiet", timeout=300)
        for name in ("DDP step", "TP MLP fwd+bwd"):
            t = {impl: np.max([r[(name, impl)] for r in per_rank], axis=0) for impl in (None, "shm")}
            step_rows.append({"ranks": ws, "step": name, "gloo ms": np.median(t[None]) * 1e3,
                              "shm ms": np.median(t["shm"]) * 1e3, "gloo / shm": np.median(t[None] / t["shm"])})  # fmt: skip
    return df, memcpy, (before, after), pd.DataFrame(fits), breakdown, pd.DataFrame(step_rows)


def table(df, ws: int, memcpy: float):
    """One world size: a row per size with every implementation's median, IQR and busbw, and the ratios."""
    import pandas as pd

    rows = []
    for size, g in df[(df.world_size == ws)].groupby("bytes"):
        r = {k: v for k, v in g.set_index("impl").iterrows()}
        mem = df[(df.impl == "memcpy") & (df.bytes == size)].iloc[0]
        row = {"size": _size(size)}
        for impl in IMPLS:
            row[f"{_name(impl)} ms"] = (
                f"{r[impl].median_s * 1e3:.3g} ({r[impl].q25_s * 1e3:.3g}-{r[impl].q75_s * 1e3:.3g})"
            )
        row["memcpy ms"] = f"{mem.median_s * 1e3:.3g}"
        for impl in IMPLS:
            row[f"{_name(impl)} busbw GB/s"] = r[impl].busbw_Bps / 1e9
        row["shm / memcpy"] = r["shm"].busbw_Bps / memcpy
        row["shm / gloo"] = r["shm"].busbw_Bps / r["torch"].busbw_Bps
        row["flags / barrier (time)"] = r["shm"].median_s / r["shm_barrier"].median_s
        row["ring / gloo"] = r["ring"].busbw_Bps / r["torch"].busbw_Bps
        rows.append(row)
    return pd.DataFrame(rows)


def _size(b: int) -> str:
    return f"{b // MiB} MiB" if b >= MiB else f"{b // KiB} KiB"


def _name(impl: str) -> str:
    return {"torch": "gloo", "shm": "shm flags", "shm_barrier": "shm barrier"}.get(impl, impl)


def verdicts(df, world_sizes, memcpy: float) -> list[tuple[str, bool]]:
    """The goals, per world size: (sentence, met)."""
    out = []
    for ws in world_sizes:
        g = df[df.world_size == ws].pivot(index="bytes", columns="impl", values="busbw_Bps")
        t = df[df.world_size == ws].pivot(index="bytes", columns="impl", values="median_s")
        big = g[g.index >= BIG] if (g.index >= BIG).any() else g.tail(1)
        out += [
            (f"{ws} ranks: shm >= {GOAL_MEMCPY:.0%} of memcpy at >= 16 MiB (got {(big.shm / memcpy).min():.1%})",
             bool((big.shm >= GOAL_MEMCPY * memcpy).all())),
            (f"{ws} ranks: shm >= {GOAL_GLOO:g}x gloo busbw at >= 16 MiB (got {(big.shm / big.torch).min():.2f}x)",
             bool((big.shm >= GOAL_GLOO * big.torch).all())),
            (f"{ws} ranks: shm latency below gloo's at {_size(t.index.min())} "
             f"({t.shm.iloc[0] * 1e6:.0f} vs {t.torch.iloc[0] * 1e6:.0f} µs)", bool(t.shm.iloc[0] < t.torch.iloc[0])),
            (f"{ws} ranks: ring >= {RING_TARGET}x gloo busbw at >= 16 MiB (got {(big.ring / big.torch).min():.2f}x)",
             bool((big.ring >= RING_TARGET * big.torch).all())),
        ]  # fmt: skip
    return out


def breakdown_text(breakdown: dict, size: int) -> str:
    lines = [f"Where the shared-memory all-reduce (flags) spends one call of {_size(size)} (ms, mean over ranks):", ""]
    lines += ["| ranks | " + " | ".join(next(iter(breakdown.values()))) + " | copies / total |", "|---" * 7 + "|"]
    for ws, ph in breakdown.items():
        copies = ph["stage"] + ph["reduce"] + ph["gather"]
        lines.append(
            f"| {ws} | " + " | ".join(f"{v * 1e3:.2f}" for v in ph.values()) + f" | {copies / sum(ph.values()):.0%} |"
        )
    lines += [
        "",
        "stage, reduce and gather are the copies (my chunk in; my slice summed over every rank's buffer and written "
        "back; every reduced slice out: about 2 + 2(n-1)/n copies of S per rank); the two waits last until every "
        "peer has raised its flag, so they include the peers' own copies and, with more runnable processes than "
        "cores, the time the peers spend descheduled.",
    ]
    return "\n".join(lines)


def reading(breakdown: dict, size: int, memcpy: float, df, cores: int) -> list[str]:
    """Which copy or wait costs the time: the copy-only floor from the phases, and the ceiling any all-reduce
    that copies its data in and out reaches here (about 3 S of copies per rank, ranks sharing ``cores``)."""
    lines = ["### Reading: which copy or wait costs the time", ""]
    for ws, ph in breakdown.items():
        copies = ph["stage"] + ph["reduce"] + ph["gather"]
        waits = sum(ph.values()) - copies
        floor = comm.busbw("all_reduce", size, copies * max(1.0, ws / cores), ws)  # ranks take turns on the cores
        ceiling = 2 * (ws - 1) / ws / 3 * min(1.0, cores / ws)
        gloo = df[(df.world_size == ws) & (df.impl == "torch") & (df.bytes >= min(BIG, size))].busbw_Bps.median()
        lines.append(
            f"- {ws} ranks, {_size(size)}: the copies take {copies * 1e3:.1f} ms of a call and the waits "
            f"{waits * 1e3:.1f} ms; with free waits (and the ranks taking turns on the cores) busbw would be "
            f"{floor / 1e9:.2f} GB/s ({floor / memcpy:.0%} of memcpy). Ceiling here for any all-reduce copying about 3 S per rank with {ws} ranks on {cores} cores: "
            f"{ceiling:.0%} of memcpy = {ceiling * memcpy / 1e9:.2f} GB/s, {ceiling * memcpy / gloo:.1f}x gloo's "
            f"{gloo / 1e9:.2f} GB/s at >= 16 MiB."
        )
    return lines + [""]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", default="2,4", help="world sizes, comma-separated")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="write a markdown record here (and a .csv beside it)")
    ap.add_argument(
        "--quick", action="store_true", help="seconds: 2 ranks, 4 KiB and 1 MiB, 1 repeat; no goals, no record"
    )
    a = ap.parse_args(argv)
    world_sizes = [int(w) for w in str(a.ranks).split(",")]
    sizes = SIZES
    if a.quick:  # a smoke test of every code path
        world_sizes, sizes, a.repeats, a.out = [2], (4 * KiB, MiB), 1, None
    info = machine()
    df, memcpy, (m0, m1), fits, breakdown, step_table = run(
        world_sizes, a.repeats, sizes, memcpy_repeats=1 if a.quick else 9
    )
    tables = {ws: table(df, ws, memcpy).to_markdown(index=False, floatfmt=".3g") for ws in world_sizes}
    fit_text = fits.to_markdown(index=False, floatfmt=".3g")
    checks = verdicts(df, world_sizes, memcpy)
    big = max(s for s in sizes if s >= BIG) if max(sizes) >= BIG else max(sizes)
    lines = [
        f"memcpy bandwidth (copy into a preallocated {m0.nbytes // MiB} MiB tensor, median; before/after the run): "
        f"{m0.median_bytes_per_s / 1e9:.2f} / {m1.median_bytes_per_s / 1e9:.2f} GB/s; "
        f"1-minute load average at the start: {info['load average (1 min)']} on {info['nproc']} cores",
        "",
    ]
    for ws in world_sizes:
        lines += [f"### {ws} ranks", "", "Times: median (IQR). busbw = size / time x 2(n-1)/n.", "", tables[ws], ""]
    lines += ["### α-β fits (ring coefficients: T = 2(n-1)·α + 2(n-1)/n·S/β; memcpy T = α + S/β)", "", fit_text, ""]
    lines += [breakdown_text(breakdown, big), ""]
    lines += reading(breakdown, big, memcpy, df, int(info["nproc"] or 1))
    lines += [
        "### Training steps with each all-reduce (median over rounds of the slowest rank; interleaved)",
        "",
        "DDP: a 2-layer MLP, hidden 1024 (8 MiB of float32 gradients in one bucket), batch 8 per rank. TP: the kit's "
        "`TPMLP` (SwiGLU, hidden 512, 2048 wide), 2 x 128 tokens: one 512 KiB all-reduce forward, one backward.",
        "",
        step_table.to_markdown(index=False, floatfmt=".3g"),
        "",
    ]
    lines += [f"- {text}: {'MET' if ok else 'NOT MET'}" for text, ok in checks]
    print("\n".join(lines))
    if a.out:
        write_record(a, info, lines)
        df.to_csv(a.out.with_suffix(".csv"), index=False, float_format="%.6g")
        print("wrote", a.out, "and", a.out.with_suffix(".csv"))
    return 0 if (a.quick or all(ok for _, ok in checks)) else 1


def write_record(a, info: dict, lines: list[str]) -> None:
    """The markdown record: how to regenerate, the machine and its load, the results; earlier runs kept."""
    old = a.out.read_text() if a.out.exists() else ""
    history = old[old.index(HISTORY) :] if HISTORY in old else ""
    head = [
        "# Collectives benchmark: gloo vs the kit's ring vs a shared-memory all-reduce vs memcpy",
        "",
        f"Regenerate: `.venv/bin/python benchmarks/collectives.py --ranks {a.ranks} --repeats {a.repeats} --out {a.out}`",
        "",
        "Machine: " + "; ".join(f"{k}: {v}" for k, v in info.items()) + ".",
        f"The machine was **shared with other jobs** while this ran (load average {info['load average (1 min)']} on "
        f"{info['nproc']} cores): the ranks wait for cores as well as for each other, so absolute numbers are noisy "
        "and the waits inflated; the ratios come from one launch per world size with the implementations "
        "interleaved round-robin.",
        "",
        f"float32, {a.repeats} timed repeats after 1 warm-up, time of a call = slowest rank. memcpy = `dst.copy_(src)` "
        "in the driver process with one thread, as in a rank.",
        "",
    ]
    a.out.write_text("\n".join(head + lines) + "\n\n" + history)


if __name__ == "__main__":
    sys.exit(main())
