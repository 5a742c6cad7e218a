"""Families of the topic ``compute``: FLOPs (6·N·D and the exact count per token), MFU, training
time, GPU-hours and cost. Their names keep the ``flops.`` prefix of the module they quiz.

Answer keys: ``mlsys_nb.flops`` (``training_flops``, ``training_time``, ``mfu``, ``implied_mfu``,
``flops_per_token``).
"""

from __future__ import annotations

from ... import flops, hardware, memory
from ..core import family
from ._util import numeric_family, pick, picks

REF_FLOPS = "docs/references.md#kaplan (Kaplan et al. 2020, arXiv:2001.08361, §2.1), #palm (MFU, Appendix B)"
SEC_FLOPS = "notebooks/11_compute_and_scaling_laws.ipynb"
SEC_TIME = SEC_FLOPS + ", §4 Training time and cost"
SEC_MFU = SEC_FLOPS + ", §3 MFU: how much of the peak a training step uses"
SEC_PER_TOKEN = SEC_FLOPS + ", §1 FLOPs per token from first principles"
SEC_COUNTER = SEC_FLOPS + ", §2 Counting FLOPs with FlopCounterMode"
BF16_GPUS = [n for n, g in sorted(hardware.gpus().items()) if "bf16" in g.peak_flops]
RUN = ("n_params", "tokens", "gpu", "n_gpus", "mfu")


def _run(rng) -> dict:
    """A training run: N, D, the GPU, how many, the MFU (the keys of ``RUN``)."""
    n = pick(rng, [1.3e9, 7e9, 13e9, 70e9, 175e9, 405e9])
    d = pick(rng, [20, 50, 100, 300]) * n if rng.random() < 0.5 else pick(rng, [300e9, 1e12, 2e12, 15e12])
    g, ng, u = pick(rng, BF16_GPUS), pick(rng, [64, 256, 1024, 2048, 8192]), pick(rng, [0.3, 0.35, 0.4, 0.45, 0.5])
    return dict(zip(RUN, (n, d, g, ng, u)))


def _time(p, **price):
    """``flops.training_time`` of the run ``p``."""
    return flops.training_time(p["n_params"], p["tokens"], gpu=p["gpu"], n_gpus=p["n_gpus"], mfu=p["mfu"], **price)


def _peak(p) -> float:
    return hardware.gpu(p["gpu"]).peak("bf16")


def _training_time_family(name: str, key, **words):
    """A question on ``flops.training_time`` of a drawn run; ``key`` reads the answer off its estimate."""
    numeric_family(family(name, section=SEC_TIME, reference=REF_FLOPS), draw=_run, calc=_time, key=key, **words)


_training_time_family(
    "flops.training_days",
    lambda est: est.days,
    unit="days",
    fields=lambda p, result: {"peak_tflops": _peak(p) / 1e12, "peak": _peak(p)},
    text=(
        "Training a {n_params:.3g}-parameter dense model on {tokens:.3g} tokens with {n_gpus} × {gpu} (bf16 "
        "dense peak {peak_tflops:.4g} TFLOP/s) at {mfu:.0%} MFU: how many days (6·N·D FLOPs)?"
    ),
    hints=["C = 6·N·D FLOPs.", "T = C / (n_gpus × peak × MFU) seconds; / 86400 for days."],
    solution=[
        "C = 6 × {n_params:.4g} × {tokens:.4g} = {result.flops:.4g} FLOPs.",
        "Cluster rate = {n_gpus} × {peak:.4g} × {mfu} = {result.achieved_flops_per_s:.4g} FLOP/s.",
        "T = {result.seconds:.4g} s = {result.days:.4g} days (flops.training_time).",
    ],
    diagnostics=lambda p, est: [
        (2 / 6, "that is 2·N·D (forward only): training is 6·N·D"),
        (3.0, "6ND, not 2ND... you are 3x high: did you count 6ND and a 3x backward too?"),
        (p["mfu"], "you divided by MFU twice or not at all"),
        (1 / p["mfu"], "you forgot the MFU"),
    ],
)


numeric_family(
    family("flops.training_flops", section=SEC_PER_TOKEN, reference=REF_FLOPS),
    draw=_run,
    calc=lambda p: flops.training_flops(p["n_params"], p["tokens"]),
    params=RUN[:2],
    unit="FLOPs",
    text=("Training compute for N = {n_params:.3g} parameters on D = {tokens:.3g} tokens (the 6·N·D approximation)?"),
    hints=["Forward 2 FLOPs per parameter per token, backward 4."],
    solution=["6 × {n_params:.4g} × {tokens:.4g} = {result:.4g} FLOPs (flops.training_flops)."],
    diagnostics=[(1 / 3, "2ND is the forward only")],
)

_training_time_family(
    "flops.gpu_hours",
    lambda est: est.gpu_hours,
    unit="GPU-hours",
    text="GPU-hours to train {n_params:.3g} parameters on {tokens:.3g} tokens on {gpu} at {mfu:.0%} MFU (6ND)?",
    hints=["GPU-hours do not depend on the number of GPUs (perfect scaling).", "6ND / (peak × MFU) / 3600."],
    solution=[
        (
            "{result.flops:.4g} FLOPs / ({result.peak_flops_per_s:.4g} × {mfu}) / 3600 = {result.gpu_hours:.4g} "
            "GPU-hours (flops.training_time)."
        )
    ],
)

numeric_family(
    family("flops.cost_usd", section=SEC_TIME, reference=REF_FLOPS),
    draw=lambda rng: {**_run(rng), "price": pick(rng, [1.5, 2.0, 2.5, 3.0, 4.0])},
    calc=lambda p: _time(p, price_per_gpu_hour=p["price"]),
    key=lambda est: est.cost_usd,
    params=("n_params", "tokens", "gpu", "mfu", "price"),
    unit="USD",
    text=(
        "At ${price}/GPU-hour, what does training {n_params:.3g} parameters on {tokens:.3g} tokens on {gpu} "
        "at {mfu:.0%} MFU cost (6ND)?"
    ),
    hints=["Cost = GPU-hours × price.", "GPU-hours = 6ND / (peak × MFU) / 3600."],
    solution=["{result.gpu_hours:.4g} GPU-hours × ${price} = ${result.cost_usd:.4g} (flops.training_time)."],
)


def _mfu_case(rng) -> dict:
    """A model, a cluster and a measured tokens/s at 30-50 % of the peak (rounded as a log would be)."""
    n, g, ng = pick(rng, [1.3e9, 7e9, 13e9, 70e9]), pick(rng, BF16_GPUS), pick(rng, [8, 64, 256])
    tps = round(pick(rng, [0.3, 0.4, 0.5]) * ng * hardware.gpu(g).peak("bf16") / (6 * n), -2)
    return {"n_params": n, "tokens_per_s": tps, "gpu": g, "n_gpus": ng}


numeric_family(
    family("flops.mfu", section=SEC_MFU, reference=REF_FLOPS),
    draw=_mfu_case,
    calc=lambda p: flops.mfu(p["n_params"], p["tokens_per_s"], gpu=p["gpu"], n_gpus=p["n_gpus"]),
    unit="fraction",
    fields=lambda p, result: {
        "peak_tflops": _peak(p) / 1e12,
        "achieved": p["tokens_per_s"] * 6 * p["n_params"],
        "peak": _peak(p),
    },
    text=(
        "A {n_params:.3g}-parameter model trains at {tokens_per_s:.4g} tokens/s on {n_gpus} × {gpu} (bf16 "
        "peak {peak_tflops:.4g} TFLOP/s). MFU (6N FLOPs per token)?"
    ),
    hints=["Achieved FLOP/s = tokens/s × 6N.", "MFU = achieved / (n_gpus × peak)."],
    solution=[
        "{tokens_per_s:.4g} × 6 × {n_params:.4g} = {achieved:.4g} FLOP/s.",
        "/ ({n_gpus} × {peak:.4g}) = {result:.4g} (flops.mfu).",
    ],
)


def _report_case(rng) -> dict:
    """A run reported in GPU-hours (rounded to thousands, as a report would)."""
    n, d, g, _, u0 = _run(rng).values()
    gpuh = round(6 * n * d / (hardware.gpu(g).peak("bf16") * u0) / 3600, -3) or 1000.0
    return {"n_params": n, "tokens": d, "gpu_hours": gpuh, "gpu": g}


numeric_family(
    family("flops.implied_mfu", difficulty=2, section=SEC_MFU, reference=REF_FLOPS),
    draw=_report_case,
    calc=lambda p: flops.implied_mfu(p["n_params"], p["tokens"], p["gpu_hours"], gpu=p["gpu"]),
    unit="fraction",
    fields=lambda p, result: {"c": 6 * p["n_params"] * p["tokens"], "gpu_flop": p["gpu_hours"] * 3600 * _peak(p)},
    text=(
        "A report says {n_params:.3g} parameters were trained on {tokens:.3g} tokens in {gpu_hours:.4g} {gpu} "
        "GPU-hours. What MFU does that imply (6ND)?"
    ),
    hints=["MFU = 6ND / (GPU-hours × 3600 × peak)."],
    solution=["6ND = {c:.4g}; GPU-seconds × peak = {gpu_flop:.4g}.", "MFU = {result:.4g} (flops.implied_mfu)."],
)


numeric_family(
    family("flops.flops_per_token", difficulty=2, section=SEC_COUNTER, reference=REF_FLOPS),
    draw=lambda rng: picks(
        rng, model=["gpt-2-small", "llama-2-7b", "llama-3-8b", "llama-3.2-1b"], seq_len=[1024, 2048, 4096, 8192]
    ),
    calc=lambda p: flops.flops_per_token(memory.preset(p["model"]), p["seq_len"]),
    unit="FLOPs",
    tolerance=0.02,
    fields=lambda p, result: {"six_n": flops.six_n(memory.preset(p["model"]))},
    text=(
        "Exact training FLOPs per token (forward + backward, causal attention counted) of {model} at sequence "
        "length {seq_len}?"
    ),
    hints=[
        "6 × (matmul parameters) + the attention score/value FLOPs.",
        "Attention adds ~ 6·L·s·d_model (causal: half of 12·L·s·d_model).",
    ],
    solution=["6N = {six_n:.4g}; exact count {result:.4g} FLOPs/token (flops.flops_per_token)."],
    diagnostics=lambda p, f: [
        (flops.six_n(memory.preset(p["model"])) / f, "6N ignores the attention FLOPs (and counts the embedding)")
    ],
)
