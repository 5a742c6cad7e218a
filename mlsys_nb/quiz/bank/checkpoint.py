"""Families of the topic ``checkpoint``: checkpoint bytes and write time, Young's interval, the share of time
lost, a job's MTBF from its GPUs', GPU-hours lost to failures, ZeRO-Offload's traffic and when it hides.

Answer keys: ``mlsys_nb.checkpoint`` (``optimal_interval``, ``expected_lost_fraction``, ``job_mtbf``,
``lost_gpu_hours_per_day``, ``offload_bytes_per_step``, ``offload_break_even_tokens``) and
``memory.bytes_per_param``, the functions notebook 24 runs.
"""

from __future__ import annotations

from ... import memory
from ...checkpoint import (
    expected_lost_fraction,
    job_mtbf,
    lost_gpu_hours_per_day,
    offload_break_even_tokens,
    offload_bytes_per_step,
    optimal_interval,
)
from ..core import family
from ._util import pick

NB = "notebooks/24_checkpoints_and_failures.ipynb"
SEC_INTERVAL = f"{NB}, §1 How often to checkpoint"
SEC_SHARDED = f"{NB}, §2 Sharded checkpoints, and loading them on another number of ranks"
SEC_FAILURE = f"{NB}, §3 A failure, and what the resume needs"
SEC_OFFLOAD = f"{NB}, §5 Offload: the optimizer on the host"
REF_YOUNG = "docs/references.md#young1974 (Young 1974; Daly 2006)"
REF_LLAMA3 = "docs/references.md#llama3 (arXiv:2407.21783, Table 5)"
REF_ZERO = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §3)"
REF_OFFLOAD = "docs/references.md#zero-offload (Ren et al. 2021, arXiv:2101.06840)"
HOUR = 3600.0


@family("checkpoint.write_time", "checkpoint", section=SEC_SHARDED, reference=REF_ZERO)
def _write_time(rng):
    n = pick(rng, [7e9, 13e9, 70e9, 405e9])
    bw = pick(rng, [10e9, 50e9, 200e9])
    per = memory.bytes_per_param("bf16-mixed", "adamw", False, None)
    b = per["param"] + per["master"] + per["optimizer"]
    return dict(
        text=f"A {n / 1e9:g}B-parameter model trains in bf16 mixed precision with AdamW. Its checkpoint holds the bf16 "
        f"weights, the fp32 master weights and AdamW's two fp32 moments. The ranks write it in parallel at "
        f"{bw / 1e9:g} GB/s in total. How many seconds does one synchronous save take?",
        params={"n": n, "bw": bw},
        answer=n * b / bw,
        unit="seconds",
        hints=["Bytes per parameter: 2 (bf16) + 4 (master) + 4 + 4 (moments).", "Gradients are not saved."],
        solution=[
            f"{b:g} bytes per parameter × {n:g} = {n * b / 1e9:g} GB (memory.bytes_per_param).",
            f"At {bw / 1e9:g} GB/s: {n * b / bw:.4g} s.",
        ],
        diagnostics=[(16 / 14, "the gradients are recomputed, not saved"), (2 / 14, "weights alone cannot resume")],
    )


@family("checkpoint.optimal_interval", "checkpoint", section=SEC_INTERVAL, reference=REF_YOUNG)
def _interval(rng):
    c = pick(rng, [10.0, 30.0, 60.0, 120.0])
    m_h = pick(rng, [1.5, 3.0, 6.0, 24.0])
    t = optimal_interval(c, m_h * HOUR)
    return dict(
        text=f"A save stalls training for {c:g} s; the job fails on average every {m_h:g} h. How many seconds of work "
        "should pass between checkpoints to lose the least time (to first order)?",
        params={"c": c, "m": m_h * HOUR},
        answer=t,
        unit="seconds",
        hints=["Waste ≈ C/T + T/(2M); set its derivative to zero."],
        solution=[f"T* = sqrt(2·C·M) = sqrt(2·{c:g}·{m_h * HOUR:g}) = {t:.4g} s (checkpoint.optimal_interval)."],
        diagnostics=[(2**-0.5, "the factor 2 under the root")],
    )


@family("checkpoint.lost_fraction", "checkpoint", difficulty=2, section=SEC_INTERVAL, reference=REF_YOUNG)
def _lost(rng):
    c = pick(rng, [20.0, 60.0, 90.0])
    t_min = pick(rng, [10.0, 20.0, 30.0, 60.0])
    m_h = pick(rng, [2.0, 3.0, 8.0])
    r_min = pick(rng, [0.0, 5.0, 10.0])
    f = expected_lost_fraction(t_min * 60, c, m_h * HOUR, r_min * 60)
    return dict(
        text=f"A job checkpoints every {t_min:g} min of work, each save stalls it {c:g} s, it fails every {m_h:g} h on "
        f"average and a restart takes {r_min:g} min. To first order, what share of wall time is lost to saving, "
        "recomputation and restarts?",
        params={"c": c, "t": t_min * 60, "m": m_h * HOUR, "r": r_min * 60},
        answer=f,
        unit="fraction",
        hints=["Saving: C/T. Each failure loses half an interval on average, plus the restart: (T/2 + R)/M."],
        solution=[f"C/T + (T/2 + R)/M = {f:.4g} (checkpoint.expected_lost_fraction)."],
        diagnostics=[
            (
                (c / (t_min * 60) + (t_min * 60 + r_min * 60) / (m_h * HOUR)) / f,
                "a failure loses half an interval on average, not a whole one",
            )
        ],
    )


@family("checkpoint.job_mtbf", "checkpoint", section=SEC_FAILURE, reference=REF_LLAMA3)
def _mtbf(rng):
    years = pick(rng, [3.0, 5.0, 10.0])
    n = pick(rng, [1024, 4096, 16384, 100000])
    m = job_mtbf(years * 365 * 86400, n)
    return dict(
        text=f"Each GPU fails on average once every {years:g} years (365-day years), independently. How many hours "
        f"pass on average between failures of a job on {n} GPUs?",
        params={"years": years, "n": n},
        answer=m,
        unit="seconds",
        hints=["Independent failures add their rates: the job's MTBF is the GPU's divided by the count."],
        solution=[f"{years:g}·365·86400 s / {n} = {m:.4g} s = {m / HOUR:.3g} h (checkpoint.job_mtbf)."],
    )


@family("checkpoint.restart_cost", "checkpoint", difficulty=2, section=SEC_FAILURE, reference=REF_LLAMA3)
def _restart(rng):
    n = pick(rng, [2048, 8192, 16384])
    m_h = pick(rng, [2.0, 3.0, 6.0])
    t_min = pick(rng, [15.0, 30.0, 60.0])
    r_min = pick(rng, [5.0, 10.0, 20.0])
    lost = lost_gpu_hours_per_day(n, m_h * HOUR, t_min * 60, r_min * 60)
    return dict(
        text=f"A job on {n} GPUs fails every {m_h:g} h on average, checkpoints every {t_min:g} min of work and needs "
        f"{r_min:g} min to restart. How many GPU-hours does it lose per day to failures (recomputation and restarts, "
        "not saving)?",
        params={"n": n, "m": m_h * HOUR, "t": t_min * 60, "r": r_min * 60},
        answer=lost,
        unit="GPU-hours",
        hints=["Failures per day: 24 h / MTBF. Each costs T/2 + R on every GPU."],
        solution=[
            f"(24/{m_h:g}) · ({t_min / 2:g} + {r_min:g}) min · {n} GPUs = {lost:.4g} GPU-hours "
            "(checkpoint.lost_gpu_hours_per_day)."
        ],
        diagnostics=[((t_min + r_min) / (t_min / 2 + r_min), "half an interval is lost on average, not a whole one")],
    )


@family("checkpoint.offload_traffic", "checkpoint", section=SEC_OFFLOAD, reference=REF_OFFLOAD)
def _offload(rng):
    n = pick(rng, [1.3e9, 7e9, 13e9, 30e9])
    b = offload_bytes_per_step(int(n))["total"]
    return dict(
        text=f"ZeRO-Offload trains a {n / 1e9:g}B-parameter model: bf16 gradients go to the host, the host runs AdamW, "
        "bf16 parameters come back. How many bytes cross PCIe per step (both directions together)?",
        params={"n": n},
        answer=b,
        unit="bytes",
        hints=["2 bytes per parameter each way."],
        solution=[f"2Ψ + 2Ψ = 4 × {n:g} = {b:.4g} bytes (checkpoint.offload_bytes_per_step)."],
        diagnostics=[(0.5, "count both directions"), (4.0, "the optimizer states stay on the host: they never cross")],
    )


@family("checkpoint.offload_break_even", "checkpoint", difficulty=3, section=SEC_OFFLOAD, reference=REF_OFFLOAD)
def _break_even(rng):
    gpu, link = pick(rng, [("H100-SXM", "pcie5-x16"), ("A100-80GB-SXM", "pcie4-x16"), ("H100-SXM", "pcie4-x16")])
    mfu = pick(rng, [0.3, 0.4, 0.5])
    tokens = offload_break_even_tokens(gpu, link, mfu)
    return dict(
        text=f"With ZeRO-Offload on {gpu} over {link} (bf16 peak and per-direction bandwidth from data/hardware.yaml) "
        f"at MFU {mfu:g}, above how many tokens per GPU per step does the 4Ψ bytes of PCIe traffic take no longer "
        "than the step's 6Ψ FLOPs per token (a model)?",
        params={"gpu": gpu, "link": link, "mfu": mfu},
        answer=tokens,
        unit="tokens",
        hints=["Compute 6Ψ·tokens/(peak·MFU) = transfer 4Ψ/bandwidth: Ψ cancels."],
        solution=[f"tokens = 4·peak·MFU/(6·bandwidth) = {tokens:.4g} (checkpoint.offload_break_even_tokens)."],
    )
