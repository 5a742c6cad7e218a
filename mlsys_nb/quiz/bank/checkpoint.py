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
from ._util import numeric_family, pick, picks

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


def _saved_bytes_per_param() -> float:
    """bf16 weights + fp32 master + AdamW's two moments (``memory.bytes_per_param``); gradients are not saved."""
    per = memory.bytes_per_param("bf16-mixed", "adamw", False, None)
    return per["param"] + per["master"] + per["optimizer"]


numeric_family(
    family("checkpoint.write_time", section=SEC_SHARDED, reference=REF_ZERO),
    draw=lambda rng: picks(rng, n=[7e9, 13e9, 70e9, 405e9], bw=[10e9, 50e9, 200e9]),
    calc=lambda p: p["n"] * _saved_bytes_per_param() / p["bw"],
    unit="seconds",
    fields=lambda p, result: {
        "n_b": p["n"] / 1e9,
        "bw_gbs": p["bw"] / 1e9,
        "saved_per_param": _saved_bytes_per_param(),
        "checkpoint_gb": p["n"] * _saved_bytes_per_param() / 1e9,
    },
    text=(
        "A {n_b:g}B-parameter model trains in bf16 mixed precision with AdamW. Its checkpoint holds the bf16 "
        "weights, the fp32 master weights and AdamW's two fp32 moments. The ranks write it in parallel at "
        "{bw_gbs:g} GB/s in total. How many seconds does one synchronous save take?"
    ),
    hints=["Bytes per parameter: 2 (bf16) + 4 (master) + 4 + 4 (moments).", "Gradients are not saved."],
    solution=[
        "{saved_per_param:g} bytes per parameter × {n:g} = {checkpoint_gb:g} GB (memory.bytes_per_param).",
        "At {bw_gbs:g} GB/s: {result:.4g} s.",
    ],
    diagnostics=[(16 / 14, "the gradients are recomputed, not saved"), (2 / 14, "weights alone cannot resume")],
)


def _stall_case(rng) -> dict:
    c = pick(rng, [10.0, 30.0, 60.0, 120.0])
    return {"c": c, "m": pick(rng, [1.5, 3.0, 6.0, 24.0]) * HOUR}


numeric_family(
    family("checkpoint.optimal_interval", section=SEC_INTERVAL, reference=REF_YOUNG),
    draw=_stall_case,
    calc=lambda p: optimal_interval(p["c"], p["m"]),
    unit="seconds",
    fields=lambda p, result: {"m_h": p["m"] / HOUR},
    text=(
        "A save stalls training for {c:g} s; the job fails on average every {m_h:g} h. How many seconds of "
        "work should pass between checkpoints to lose the least time (to first order)?"
    ),
    hints=["Waste ≈ C/T + T/(2M); set its derivative to zero."],
    solution=["T* = sqrt(2·C·M) = sqrt(2·{c:g}·{m:g}) = {result:.4g} s (checkpoint.optimal_interval)."],
    diagnostics=[(2**-0.5, "the factor 2 under the root")],
)


def _in_minutes_and_hours(p) -> dict:
    """The interval T and restart R in minutes, the MTBF M in hours, as the words give them."""
    return {"t_min": p["t"] / 60, "m_h": p["m"] / HOUR, "r_min": p["r"] / 60}


def _failure_case(rng) -> dict:
    c, t_min = pick(rng, [20.0, 60.0, 90.0]), pick(rng, [10.0, 20.0, 30.0, 60.0])
    m_h, r_min = pick(rng, [2.0, 3.0, 8.0]), pick(rng, [0.0, 5.0, 10.0])
    return {"c": c, "t": t_min * 60, "m": m_h * HOUR, "r": r_min * 60}


numeric_family(
    family("checkpoint.lost_fraction", difficulty=2, section=SEC_INTERVAL, reference=REF_YOUNG),
    draw=_failure_case,
    calc=lambda p: expected_lost_fraction(p["t"], p["c"], p["m"], p["r"]),
    unit="fraction",
    fields=lambda p, result: _in_minutes_and_hours(p),
    text=(
        "A job checkpoints every {t_min:g} min of work, each save stalls it {c:g} s, it fails every {m_h:g} h "
        "on average and a restart takes {r_min:g} min. To first order, what share of wall time is lost to "
        "saving, recomputation and restarts?"
    ),
    hints=["Saving: C/T. Each failure loses half an interval on average, plus the restart: (T/2 + R)/M."],
    solution=["C/T + (T/2 + R)/M = {result:.4g} (checkpoint.expected_lost_fraction)."],
    diagnostics=lambda p, f: [
        (
            (p["c"] / p["t"] + (p["t"] + p["r"]) / p["m"]) / f,
            "a failure loses half an interval on average, not a whole one",
        )
    ],
)

numeric_family(
    family("checkpoint.job_mtbf", section=SEC_FAILURE, reference=REF_LLAMA3),
    draw=lambda rng: picks(rng, years=[3.0, 5.0, 10.0], n=[1024, 4096, 16384, 100000]),
    calc=lambda p: job_mtbf(p["years"] * 365 * 86400, p["n"]),
    unit="seconds",
    fields=lambda p, result: {"result_h": result / HOUR},
    text=(
        "Each GPU fails on average once every {years:g} years (365-day years), independently. How many hours "
        "pass on average between failures of a job on {n} GPUs?"
    ),
    hints=["Independent failures add their rates: the job's MTBF is the GPU's divided by the count."],
    solution=["{years:g}·365·86400 s / {n} = {result:.4g} s = {result_h:.3g} h (checkpoint.job_mtbf)."],
)


def _restart_case(rng) -> dict:
    n, m_h = pick(rng, [2048, 8192, 16384]), pick(rng, [2.0, 3.0, 6.0])
    t_min, r_min = pick(rng, [15.0, 30.0, 60.0]), pick(rng, [5.0, 10.0, 20.0])
    return {"n": n, "m": m_h * HOUR, "t": t_min * 60, "r": r_min * 60}


numeric_family(
    family("checkpoint.restart_cost", difficulty=2, section=SEC_FAILURE, reference=REF_LLAMA3),
    draw=_restart_case,
    calc=lambda p: lost_gpu_hours_per_day(p["n"], p["m"], p["t"], p["r"]),
    unit="GPU-hours",
    fields=lambda p, result: {**_in_minutes_and_hours(p), "half_t_min": p["t"] / 120},
    text=(
        "A job on {n} GPUs fails every {m_h:g} h on average, checkpoints every {t_min:g} min of work and "
        "needs {r_min:g} min to restart. How many GPU-hours does it lose per day to failures (recomputation "
        "and restarts, not saving)?"
    ),
    hints=["Failures per day: 24 h / MTBF. Each costs T/2 + R on every GPU."],
    solution=[
        (
            "(24/{m_h:g}) · ({half_t_min:g} + {r_min:g}) min · {n} GPUs = {result:.4g} GPU-hours "
            "(checkpoint.lost_gpu_hours_per_day)."
        )
    ],
    diagnostics=lambda p, lost: [
        ((p["t"] + p["r"]) / (p["t"] / 2 + p["r"]), "half an interval is lost on average, not a whole one")
    ],
)

numeric_family(
    family("checkpoint.offload_traffic", section=SEC_OFFLOAD, reference=REF_OFFLOAD),
    draw=lambda rng: picks(rng, n=[1.3e9, 7e9, 13e9, 30e9]),
    calc=lambda p: offload_bytes_per_step(int(p["n"]))["total"],
    unit="bytes",
    fields=lambda p, result: {"n_b": p["n"] / 1e9},
    text=(
        "ZeRO-Offload trains a {n_b:g}B-parameter model: bf16 gradients go to the host, the host runs AdamW, "
        "bf16 parameters come back. How many bytes cross PCIe per step (both directions together)?"
    ),
    hints=["2 bytes per parameter each way."],
    solution=["2Ψ + 2Ψ = 4 × {n:g} = {result:.4g} bytes (checkpoint.offload_bytes_per_step)."],
    diagnostics=[(0.5, "count both directions"), (4.0, "the optimizer states stay on the host: they never cross")],
)


def _pcie_case(rng) -> dict:
    gpu, link = pick(rng, [("H100-SXM", "pcie5-x16"), ("A100-80GB-SXM", "pcie4-x16"), ("H100-SXM", "pcie4-x16")])
    return {"gpu": gpu, "link": link, "mfu": pick(rng, [0.3, 0.4, 0.5])}


numeric_family(
    family("checkpoint.offload_break_even", difficulty=3, section=SEC_OFFLOAD, reference=REF_OFFLOAD),
    draw=_pcie_case,
    calc=lambda p: offload_break_even_tokens(p["gpu"], p["link"], p["mfu"]),
    unit="tokens",
    text=(
        "With ZeRO-Offload on {gpu} over {link} (bf16 peak and per-direction bandwidth from "
        "data/hardware.yaml) at MFU {mfu:g}, above how many tokens per GPU per step does the 4Ψ bytes of PCIe "
        "traffic take no longer than the step's 6Ψ FLOPs per token (a model)?"
    ),
    hints=["Compute 6Ψ·tokens/(peak·MFU) = transfer 4Ψ/bandwidth: Ψ cancels."],
    solution=["tokens = 4·peak·MFU/(6·bandwidth) = {result:.4g} (checkpoint.offload_break_even_tokens)."],
)
