"""Families of the topic ``compute``: FLOPs (6·N·D and the exact count per token), MFU, training
time, GPU-hours and cost. Their names keep the ``flops.`` prefix of the module they quiz.

Answer keys: ``mlsys_nb.flops`` (``training_flops``, ``training_time``, ``mfu``, ``implied_mfu``,
``flops_per_token``).
"""

from __future__ import annotations

from ... import flops, hardware, memory
from ..core import family
from ._util import pick

REF_FLOPS = "docs/references.md#kaplan (Kaplan et al. 2020, arXiv:2001.08361, §2.1), #palm (MFU, Appendix B)"
SEC_FLOPS = "notebooks/11_compute_and_scaling_laws.ipynb"
BF16_GPUS = [n for n, g in sorted(hardware.gpus().items()) if "bf16" in g.peak_flops]


def _run(rng):
    n = pick(rng, [1.3e9, 7e9, 13e9, 70e9, 175e9, 405e9])
    d = pick(rng, [20, 50, 100, 300]) * n if rng.random() < 0.5 else pick(rng, [300e9, 1e12, 2e12, 15e12])
    return n, d, pick(rng, BF16_GPUS), pick(rng, [64, 256, 1024, 2048, 8192]), pick(rng, [0.3, 0.35, 0.4, 0.45, 0.5])


@family("flops.training_days", "compute", section=SEC_FLOPS + ", §4 Training time and cost", reference=REF_FLOPS)
def _days(rng):
    n, d, g, ng, u = _run(rng)
    est = flops.training_time(n, d, gpu=g, n_gpus=ng, mfu=u)
    peak = hardware.gpu(g).peak("bf16")
    return dict(
        text=f"Training a {n:.3g}-parameter dense model on {d:.3g} tokens with {ng} × {g} (bf16 dense peak "
        f"{peak / 1e12:.4g} TFLOP/s) at {u:.0%} MFU: how many days (6·N·D FLOPs)?",
        params={"n_params": n, "tokens": d, "gpu": g, "n_gpus": ng, "mfu": u},
        answer=est.days,
        unit="days",
        hints=["C = 6·N·D FLOPs.", "T = C / (n_gpus × peak × MFU) seconds; / 86400 for days."],
        solution=[
            f"C = 6 × {n:.4g} × {d:.4g} = {est.flops:.4g} FLOPs.",
            f"Cluster rate = {ng} × {peak:.4g} × {u} = {est.achieved_flops_per_s:.4g} FLOP/s.",
            f"T = {est.seconds:.4g} s = {est.days:.4g} days (flops.training_time).",
        ],
        diagnostics=[
            (2 / 6, "that is 2·N·D (forward only): training is 6·N·D"),
            (3.0, "6ND, not 2ND... you are 3x high: did you count 6ND and a 3x backward too?"),
            (u, "you divided by MFU twice or not at all"),
            (1 / u, "you forgot the MFU"),
        ],
    )


@family(
    "flops.training_flops",
    "compute",
    section=SEC_FLOPS + ", §1 FLOPs per token from first principles",
    reference=REF_FLOPS,
)
def _c(rng):
    n, d, *_ = _run(rng)
    c = flops.training_flops(n, d)
    return dict(
        text=f"Training compute for N = {n:.3g} parameters on D = {d:.3g} tokens (the 6·N·D approximation)?",
        params={"n_params": n, "tokens": d},
        answer=c,
        unit="FLOPs",
        hints=["Forward 2 FLOPs per parameter per token, backward 4."],
        solution=[f"6 × {n:.4g} × {d:.4g} = {c:.4g} FLOPs (flops.training_flops)."],
        diagnostics=[(1 / 3, "2ND is the forward only")],
    )


@family("flops.gpu_hours", "compute", section=SEC_FLOPS + ", §4 Training time and cost", reference=REF_FLOPS)
def _gpuh(rng):
    n, d, g, ng, u = _run(rng)
    est = flops.training_time(n, d, gpu=g, n_gpus=ng, mfu=u)
    return dict(
        text=f"GPU-hours to train {n:.3g} parameters on {d:.3g} tokens on {g} at {u:.0%} MFU (6ND)?",
        params={"n_params": n, "tokens": d, "gpu": g, "n_gpus": ng, "mfu": u},
        answer=est.gpu_hours,
        unit="GPU-hours",
        hints=["GPU-hours do not depend on the number of GPUs (perfect scaling).", "6ND / (peak × MFU) / 3600."],
        solution=[
            f"{est.flops:.4g} FLOPs / ({est.peak_flops_per_s:.4g} × {u}) / 3600 = {est.gpu_hours:.4g} "
            "GPU-hours (flops.training_time)."
        ],
    )


@family("flops.cost_usd", "compute", section=SEC_FLOPS + ", §4 Training time and cost", reference=REF_FLOPS)
def _cost(rng):
    n, d, g, ng, u = _run(rng)
    price = pick(rng, [1.5, 2.0, 2.5, 3.0, 4.0])
    est = flops.training_time(n, d, gpu=g, n_gpus=ng, mfu=u, price_per_gpu_hour=price)
    return dict(
        text=f"At ${price}/GPU-hour, what does training {n:.3g} parameters on {d:.3g} tokens on {g} at "
        f"{u:.0%} MFU cost (6ND)?",
        params={"n_params": n, "tokens": d, "gpu": g, "mfu": u, "price": price},
        answer=est.cost_usd,
        unit="USD",
        hints=["Cost = GPU-hours × price.", "GPU-hours = 6ND / (peak × MFU) / 3600."],
        solution=[f"{est.gpu_hours:.4g} GPU-hours × ${price} = ${est.cost_usd:.4g} (flops.training_time)."],
    )


@family(
    "flops.mfu",
    "compute",
    section=SEC_FLOPS + ", §3 MFU: how much of the peak a training step uses",
    reference=REF_FLOPS,
)
def _mfu(rng):
    n = pick(rng, [1.3e9, 7e9, 13e9, 70e9])
    g = pick(rng, BF16_GPUS)
    ng = pick(rng, [8, 64, 256])
    peak = hardware.gpu(g).peak("bf16")
    tps = round(pick(rng, [0.3, 0.4, 0.5]) * ng * peak / (6 * n), -2)
    u = flops.mfu(n, tps, gpu=g, n_gpus=ng)
    return dict(
        text=f"A {n:.3g}-parameter model trains at {tps:.4g} tokens/s on {ng} × {g} (bf16 peak "
        f"{peak / 1e12:.4g} TFLOP/s). MFU (6N FLOPs per token)?",
        params={"n_params": n, "tokens_per_s": tps, "gpu": g, "n_gpus": ng},
        answer=u,
        unit="fraction",
        hints=["Achieved FLOP/s = tokens/s × 6N.", "MFU = achieved / (n_gpus × peak)."],
        solution=[
            f"{tps:.4g} × 6 × {n:.4g} = {tps * 6 * n:.4g} FLOP/s.",
            f"/ ({ng} × {peak:.4g}) = {u:.4g} (flops.mfu).",
        ],
    )


@family(
    "flops.implied_mfu",
    "compute",
    difficulty=2,
    section=SEC_FLOPS + ", §3 MFU: how much of the peak a training step uses",
    reference=REF_FLOPS,
)
def _implied(rng):
    n, d, g, _, u0 = _run(rng)
    gpuh = round(6 * n * d / (hardware.gpu(g).peak("bf16") * u0) / 3600, -3) or 1000.0
    u = flops.implied_mfu(n, d, gpuh, gpu=g)
    return dict(
        text=f"A report says {n:.3g} parameters were trained on {d:.3g} tokens in {gpuh:.4g} {g} GPU-hours. "
        f"What MFU does that imply (6ND)?",
        params={"n_params": n, "tokens": d, "gpu_hours": gpuh, "gpu": g},
        answer=u,
        unit="fraction",
        hints=["MFU = 6ND / (GPU-hours × 3600 × peak)."],
        solution=[
            f"6ND = {6 * n * d:.4g}; GPU-seconds × peak = {gpuh * 3600 * hardware.gpu(g).peak('bf16'):.4g}.",
            f"MFU = {u:.4g} (flops.implied_mfu).",
        ],
    )


@family(
    "flops.flops_per_token",
    "compute",
    difficulty=2,
    section=SEC_FLOPS + ", §2 Counting FLOPs with FlopCounterMode",
    reference=REF_FLOPS,
)
def _fpt(rng):
    model = pick(rng, ["gpt-2-small", "llama-2-7b", "llama-3-8b", "llama-3.2-1b"])
    s = pick(rng, [1024, 2048, 4096, 8192])
    f = flops.flops_per_token(memory.preset(model), s)
    six_n = flops.six_n(memory.preset(model))
    return dict(
        text=f"Exact training FLOPs per token (forward + backward, causal attention counted) of {model} at "
        f"sequence length {s}?",
        params={"model": model, "seq_len": s},
        answer=f,
        unit="FLOPs",
        tolerance=0.02,
        hints=[
            "6 × (matmul parameters) + the attention score/value FLOPs.",
            "Attention adds ~ 6·L·s·d_model (causal: half of 12·L·s·d_model).",
        ],
        solution=[f"6N = {six_n:.4g}; exact count {f:.4g} FLOPs/token (flops.flops_per_token)."],
        diagnostics=[(six_n / f, "6N ignores the attention FLOPs (and counts the embedding)")],
    )
