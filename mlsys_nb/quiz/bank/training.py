"""Families on training memory, FLOPs/MFU/time/cost, scaling laws, layouts and RL/RLHF.

Answer keys: ``mlsys_nb.memory`` (``model_state_bytes``, ``estimate``, ``rlhf_estimate``),
``mlsys_nb.flops`` (``training_flops``, ``training_time``, ``mfu``, ``implied_mfu``),
``mlsys_nb.scaling`` (``law``, ``twenty_tokens_per_param``), ``mlsys_nb.rl.gae``, ``mlsys_nb.comm``.
"""

from __future__ import annotations

from ... import comm, flops, hardware, memory, scaling
from ...config import TrainConfig
from ..core import family
from ._util import gb, gbps, pick

REF_MEM = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §3), #mixed-precision"
SEC_MEM = "notebooks/10_training_memory.ipynb"
REF_FLOPS = "docs/references.md#kaplan (Kaplan et al. 2020, arXiv:2001.08361, §2.1), #palm (MFU, Appendix B)"
SEC_FLOPS = "notebooks/11_compute_and_scaling_laws.ipynb"
REF_CHIN = "docs/references.md#chinchilla (Hoffmann et al. 2022, arXiv:2203.15556), #epoch-chinchilla"
BF16_GPUS = [n for n, g in sorted(hardware.gpus().items()) if "bf16" in g.peak_flops]
N_PARAMS = [125e6, 350e6, 1.3e9, 2.7e9, 7e9, 13e9, 34e9, 70e9, 175e9]


@family(
    "memory.model_states",
    "memory",
    section=SEC_MEM + ", §1 Model states: parameters, gradients, optimizer, master weights",
    reference=REF_MEM,
)
def _model_states(rng):
    n = pick(rng, N_PARAMS)
    dp = pick(rng, [1, 2, 4, 8, 16, 64])
    z = pick(rng, [0, 1, 2, 3])
    s = memory.model_state_bytes(n, dp=dp, zero=z)
    wrong12 = memory.model_state_bytes(n, dp=dp, zero=z, precision="bf16-nomaster").total
    unsharded = memory.model_state_bytes(n, dp=1, zero=0).total
    diag = [(wrong12 / s.total, "did you forget the fp32 master copy (4 B/param)? mixed-precision Adam is 2+2+12")]
    if z and dp > 1:
        diag.append((unsharded / s.total, f"ZeRO-{z} shards part of the states over dp = {dp}"))
    return dict(
        text=f"Mixed-precision Adam (bf16 params and grads, fp32 master + 2 fp32 moments), {n:.3g} parameters, "
        f"data parallel over {dp} GPUs with ZeRO stage {z}: bytes of model states per GPU?",
        params={"n_params": n, "dp": dp, "zero": z},
        answer=s.total,
        unit="bytes",
        hints=[
            "2 B params + 2 B grads + 12 B (master 4 + m 4 + v 4) per parameter.",
            "Stage 1 shards the 12 B, stage 2 also the grads, stage 3 also the params.",
        ],
        solution=[
            f"params {gb(s.params)}, grads {gb(s.grads)}, optimizer {gb(s.optimizer)}, master {gb(s.master)}.",
            f"Total {gb(s.total)} per GPU (memory.model_state_bytes).",
        ],
        diagnostics=diag,
    )


@family(
    "memory.bytes_per_param",
    "memory",
    section=SEC_MEM + ", §1 Model states: parameters, gradients, optimizer, master weights",
    reference=REF_MEM,
)
def _bpp(rng):
    prec, opt = pick(
        rng,
        [
            ("bf16-mixed", "adam"),
            ("fp32", "adam"),
            ("bf16-mixed", "sgd-momentum"),
            ("fp32", "sgd"),
            ("bf16-mixed", "adam-8bit"),
        ],
    )
    b = memory.model_state_bytes(1, precision=prec, optimizer=opt).total
    return dict(
        text=f"Bytes of model states per parameter for precision {prec} with optimizer {opt} (no sharding)?",
        params={"precision": prec, "optimizer": opt},
        answer=b,
        unit="count",
        hints=[
            "params + grads + optimizer states + (mixed precision) an fp32 master copy.",
            "Adam keeps 2 states (m, v); SGD with momentum 1; plain SGD 0.",
        ],
        solution=[f"memory.model_state_bytes(1, precision={prec!r}, optimizer={opt!r}).total = {b:g} B."],
    )


def _train_case(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-3.2-3b"])
    t = TrainConfig(
        micro_batch=pick(rng, [1, 2, 4]),
        seq_len=pick(rng, [2048, 4096]),
        dp=pick(rng, [8, 16]),
        zero=pick(rng, [1, 2, 3]),
        recompute=pick(rng, ["none", "selective"]),
        gpu=pick(rng, ["H100-SXM", "A100-80GB-SXM", "A100-40GB-SXM"]),
    )
    return model, t


@family(
    "memory.activations_per_layer",
    "memory",
    difficulty=2,
    section=SEC_MEM + ", §2 Activations, measured on a real transformer",
    reference="docs/references.md#megatron-sp (Korthikanti et al. 2022, arXiv:2205.05198, §4)",
)
def _acts(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "gpt-2-small"])
    t = TrainConfig(
        micro_batch=pick(rng, [1, 2, 4]),
        seq_len=pick(rng, [1024, 2048, 4096]),
        recompute=pick(rng, ["none", "selective", "full"]),
    )
    b = memory.estimate(memory.preset(model), t)
    return dict(
        text=f"Training {model} (flash attention, fused kernels, bf16 activations), micro-batch "
        f"{t.micro_batch} × {t.seq_len} tokens, recompute={t.recompute}: "
        f"activation bytes stored per layer?",
        params={"model": model, "micro_batch": t.micro_batch, "seq_len": t.seq_len, "recompute": t.recompute},
        answer=b.activations_per_layer,
        unit="bytes",
        tolerance=0.05,
        hints=[
            "Add the tensors each op saves for backward, per token, then × b·s.",
            "recompute=full stores only the block input (2·h bytes per token).",
        ],
        solution=[f"{name}: {v / 1e6:.4g} MB" for name, v in b.terms]
        + [f"Sum = {gb(b.activations_per_layer)} (memory.estimate(...).activations_per_layer)."],
    )


@family(
    "memory.fits",
    "memory",
    kind="choice",
    section=SEC_MEM + ", §4 The whole GPU: one rank of a real model, §8 Sweeps",
    reference=REF_MEM,
)
def _fits(rng):
    model, t = _train_case(rng)
    b = memory.estimate(memory.preset(model), t)
    ans = "yes" if b.fits else "no"
    return dict(
        text=f"{model}, micro-batch {t.micro_batch} × {t.seq_len}, dp = {t.dp} with ZeRO-{t.zero}, "
        f"recompute={t.recompute}, bf16-mixed Adam, on {t.gpu}: does training fit in GPU memory?",
        params={
            "model": model,
            **{k: getattr(t, k) for k in ("micro_batch", "seq_len", "dp", "zero", "recompute", "gpu")},
        },
        answer=ans,
        choices=["yes", "no"],
        hints=[
            "Model states (16 B/param sharded by the stage) + activations + temporaries.",
            f"The GPU holds {gb(hardware.gpu(t.gpu).memory_bytes)}.",
        ],
        solution=[
            f"states {gb(b.model_states)}, activations {gb(b.activations)}, temporary {gb(b.temporary)}.",
            f"Total {gb(b.total)} vs {gb(b.gpu_memory)}: {ans} (memory.estimate).",
        ],
    )


_KNOBS = {
    "ZeRO-3": dict(zero=3),
    "full recompute": dict(recompute="full"),
    "TP = 8 with SP": dict(tp=8, sp=True),
    "halve the micro-batch": None,
    "double dp (more GPUs)": None,
}


@family(
    "memory.oom_knob",
    "memory",
    kind="choice",
    difficulty=3,
    section=SEC_MEM + ", §5 How each parallelism divides each term, §8 Sweeps",
    reference=REF_MEM,
)
def _oom(rng):
    for _ in range(200):
        model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-3-70b"])
        t = TrainConfig(
            micro_batch=pick(rng, [1, 2, 4, 8]),
            seq_len=pick(rng, [2048, 4096, 8192]),
            dp=pick(rng, [8, 16, 32]),
            zero=pick(rng, [0, 1, 2]),
            recompute="none",
            gpu=pick(rng, ["H100-SXM", "A100-80GB-SXM", "A100-40GB-SXM"]),
        )
        m = memory.preset(model)
        base = memory.estimate(m, t)
        if base.fits:
            continue
        options = {
            "ZeRO-3": t.replace(zero=3),
            "full recompute": t.replace(recompute="full"),
            "TP = 8 with SP": t.replace(tp=8, sp=True),
            "halve the micro-batch": t.replace(micro_batch=max(1, t.micro_batch // 2)) if t.micro_batch > 1 else None,
        }
        totals = {k: memory.estimate(m, v).total for k, v in options.items() if v is not None}
        fitting = [k for k, v in totals.items() if v <= base.gpu_memory]
        if len(fitting) == 1:
            ans = fitting[0]
            choices = sorted(totals)
            return dict(
                text=f"{model}, micro-batch {t.micro_batch} × {t.seq_len}, dp = {t.dp} with ZeRO-{t.zero}, no "
                f"recompute, on {t.gpu} needs {gb(base.total)} and runs out of memory. Which ONE single "
                f"change makes it fit?",
                params={
                    "model": model,
                    "micro_batch": t.micro_batch,
                    "seq_len": t.seq_len,
                    "dp": t.dp,
                    "zero": t.zero,
                    "gpu": t.gpu,
                },
                answer=ans,
                choices=choices,
                hints=[
                    f"Split the {gb(base.total)}: states {gb(base.model_states)}, activations {gb(base.activations)}.",
                    "Attack the largest part.",
                ],
                solution=[f"{k}: {gb(v)}" for k, v in totals.items()]
                + [f"Only '{ans}' fits in {gb(base.gpu_memory)} (memory.estimate)."],
            )
    raise RuntimeError("no OOM case with a single fix found")  # pragma: no cover


# ---- FLOPs, MFU, time, cost --------------------------------------------------------------------
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


# ---- scaling laws ------------------------------------------------------------------------------
def _budget(rng):
    return pick(rng, [1e21, 3e21, 1e22, 5.76e23, 1e23, 1e24, 3.8e25])


@family(
    "scaling.chinchilla_params",
    "scaling",
    difficulty=2,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _chin_n(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    law = scaling.law(law_name)
    n, d = law.compute_optimal(c)
    return dict(
        text=f"Under the '{law_name}' fit of L(N, D) = E + A/N^α + B/D^β, what model size is compute-optimal "
        f"for C = {c:.3g} FLOPs (C = 6ND)?",
        params={"law": law_name, "C": c},
        answer=n,
        unit="params",
        tolerance=0.02,
        hints=["N* = G·(C/6)^(β/(α+β)), G = (αA/(βB))^(1/(α+β)).", "D* = C/(6N*)."],
        solution=[f"N* = {n:.4g}, D* = {d:.4g}, D*/N* = {d / n:.3g} (scaling.law(...).compute_optimal)."],
    )


@family(
    "scaling.chinchilla_tokens",
    "scaling",
    difficulty=2,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _chin_d(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    n, d = scaling.law(law_name).compute_optimal(c)
    return dict(
        text=f"Under the '{law_name}' law, how many training tokens are compute-optimal for C = {c:.3g} FLOPs?",
        params={"law": law_name, "C": c},
        answer=d,
        unit="tokens",
        hints=["First N*, then D* = C / (6N*)."],
        solution=[f"N* = {n:.4g}; D* = C/(6N*) = {d:.4g} tokens."],
    )


@family(
    "scaling.tokens_per_param",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _tpp(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    r = float(scaling.law(law_name).tokens_per_parameter(c))
    return dict(
        text=f"At C = {c:.3g} FLOPs, the '{law_name}' law's compute-optimal D*/N* (tokens per parameter)?",
        params={"law": law_name, "C": c},
        answer=r,
        unit="ratio",
        hints=["It is not a constant: it drifts with C unless α = β.", "Compute N*, D*, divide."],
        solution=[f"D*/N* = {r:.4g} (scaling.law(...).tokens_per_parameter)."],
    )


@family(
    "scaling.twenty_rule_params",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _twenty(rng):
    c = _budget(rng)
    n, d = scaling.twenty_tokens_per_param(c)
    return dict(
        text=f"With the '20 tokens per parameter' heuristic and C = 6ND, what N fits C = {c:.3g} FLOPs?",
        params={"C": c},
        answer=float(n),
        unit="params",
        hints=["C = 6·N·(20N) = 120 N²."],
        solution=[f"N = sqrt(C/120) = {float(n):.4g}; D = 20N = {float(d):.4g}."],
        diagnostics=[(20.0**0.5, "N = sqrt(C/120), not sqrt(C/6)")],
    )


@family(
    "scaling.loss",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _loss(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    n, d = pick(rng, [1e9, 7e9, 70e9]), pick(rng, [1e11, 1.4e12, 1.5e13])
    law = scaling.law(law_name)
    v = float(law.loss(n, d))
    return dict(
        text=f"Predicted loss (nats/token) of N = {n:.3g} parameters trained on D = {d:.3g} tokens under the "
        f"'{law_name}' fit (E = {law.E}, A = {law.A:.4g}, B = {law.B:.4g}, "
        f"α = {law.alpha}, β = {law.beta})?",
        params={"law": law_name, "N": n, "D": d},
        answer=v,
        unit="nats/token",
        tolerance=0.005,
        hints=["L = E + A/N^α + B/D^β."],
        solution=[f"L = {v:.4f} (scaling.law(...).loss)."],
    )


# ---- layout ------------------------------------------------------------------------------------
@family(
    "layout.smallest_zero_stage",
    "layout",
    kind="choice",
    difficulty=2,
    section=SEC_MEM + ", §1 Model states, §5 How each parallelism divides each term",
    reference=REF_MEM,
)
def _zstage(rng):
    for _ in range(200):
        n = pick(rng, N_PARAMS[3:])
        dp = pick(rng, [8, 16, 64, 256])
        g = pick(rng, ["H100-SXM", "A100-80GB-SXM", "A100-40GB-SXM"])
        cap = hardware.gpu(g).memory_bytes * 0.5  # half the GPU left for activations
        stages = [z for z in range(4) if memory.model_state_bytes(n, dp=dp, zero=z).total <= cap]
        ans = f"ZeRO-{stages[0]}" if stages else "none fits"
        return dict(
            text=f"{n:.3g} parameters, bf16-mixed Adam, dp = {dp} on {g}. Keeping model states under half of "
            f"the GPU ({gb(cap)}), what is the smallest ZeRO stage that does it?",
            params={"n_params": n, "dp": dp, "gpu": g},
            answer=ans,
            choices=["ZeRO-0", "ZeRO-1", "ZeRO-2", "ZeRO-3", "none fits"],
            hints=["16 B/param unsharded; stage 1 shards 12 of them, 2 also the grads, 3 everything."],
            solution=[f"ZeRO-{z}: {gb(memory.model_state_bytes(n, dp=dp, zero=z).total)}" for z in range(4)]
            + [f"Smallest under {gb(cap)}: {ans} (memory.model_state_bytes)."],
        )


@family(
    "layout.tp_within_node",
    "layout",
    kind="choice",
    section="notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node",
    reference="docs/references.md#megatron-ptdp (Narayanan et al. 2021, arXiv:2104.04473, §3)",
)
def _tp_node(rng):
    b, s, h = 1, 4096, pick(rng, [5120, 8192])
    tp = 8
    nv, ib = hardware.link("nvlink4"), pick(rng, [25e9, 50e9])
    x = b * s * h * 2
    t_nv = comm.collective_time("all_reduce", x, tp, nv.latency_s, nv.per_direction_bytes_per_s)
    t_ib = comm.collective_time("all_reduce", x, tp, 10e-6, ib)
    r = t_ib / t_nv
    return dict(
        text=f"One TP all-reduce of {x / 1e6:.4g} MB over tp = 8: how many times slower across nodes "
        f"(β = {gbps(ib)}, α = 10 us) than inside an NVLink4 node "
        f"(β = {gbps(nv.per_direction_bytes_per_s)} from the datasheet,"
        f" α = {nv.latency_s * 1e6:g} us)? (Both α are assumed defaults, not datasheet values.)",
        params={"bytes": x, "tp": tp, "beta_inter": ib},
        answer=r,
        unit="ratio",
        hints=["Both are ring all-reduces: compare α-β times.", "Bandwidth dominates at this size."],
        solution=[
            f"NVLink: {t_nv * 1e6:.4g} us; network: {t_ib * 1e6:.4g} us (comm.collective_time).",
            f"Ratio {r:.3g}: keep TP inside a node, put PP/DP across nodes.",
        ],
    )


# ---- RL and RLHF -------------------------------------------------------------------------------
REF_RLHF = "docs/references.md#instructgpt (Ouyang et al. 2022, arXiv:2203.02155), #openrlhf"


@family(
    "rl.rlhf_memory_per_gpu",
    "rl",
    difficulty=3,
    section="notebooks/18_rlhf.ipynb, §8 The memory of RLHF at scale",
    reference=REF_RLHF,
)
def _rlhf(rng):
    actor = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"])
    ng = pick(rng, [8, 16, 32])
    batch = pick(rng, [64, 128, 256])
    r = memory.rlhf_estimate(actor, n_gpus=ng, rollout_batch=batch, prompt_len=512, response_len=512)
    return dict(
        text=f"PPO-RLHF of {actor}, colocated on {ng} GPUs: actor and critic trained with ZeRO-3 (bf16-mixed "
        f"Adam, 16 B/param), reference and reward frozen bf16 (sharded), a rollout engine holding the "
        f"actor in bf16 and the KV cache of {batch} sequences × 1024 tokens. Bytes per GPU?",
        params={"actor": actor, "n_gpus": ng, "rollout_batch": batch},
        answer=r.per_gpu,
        unit="bytes",
        tolerance=0.03,
        hints=[
            "Four models: actor + critic 16 B/param / n each; reference + reward 2 B/param / n.",
            "Rollout: full bf16 actor weights (tp=1) + KV cache / n.",
        ],
        solution=[f"{row['part']}: {row['GB per GPU']:.4g} GB" for row in r.table()]
        + [f"Total {gb(r.per_gpu)} per GPU (memory.rlhf_estimate)."],
    )


@family(
    "rl.weight_sync_time",
    "rl",
    difficulty=2,
    section="notebooks/04_communication_cost.ipynb, §1 The α-β model (applied to RLHF weight sync)",
    reference=REF_RLHF,
)
def _sync(rng):
    n = pick(rng, [7e9, 13e9, 70e9])
    ranks = pick(rng, [4, 8, 16])
    beta = pick(rng, [25e9, 50e9, 450e9])
    alpha = 10e-6
    nbytes = 2 * n
    t = comm.collective_time("broadcast", nbytes, ranks, alpha, beta, "pipelined_chain")
    return dict(
        text=f"After each PPO step the trainer broadcasts the updated bf16 actor ({n:.3g} params) to {ranks} "
        f"rollout ranks as a pipelined chain (α = 10 us, β = {gbps(beta)}). Seconds?",
        params={"n_params": n, "n": ranks, "beta": beta, "alpha": alpha},
        answer=t,
        unit="seconds",
        hints=["Bytes = 2N.", "A pipelined chain: (n−1)α + S/β."],
        solution=[f"S = {nbytes:.4g} B; T = {t:.4g} s (comm.collective_time broadcast, pipelined_chain)."],
    )


@family(
    "rl.gae_advantage",
    "rl",
    difficulty=2,
    section="notebooks/17_rl_fundamentals.ipynb, §3 Generalised advantage estimation",
    reference="docs/references.md#gae (Schulman et al. 2015, arXiv:1506.02438, eq. 16)",
)
def _gae(rng):
    import numpy as np

    from ...rl.gae import gae

    T = 3
    r = np.array([pick(rng, [0.0, 1.0, 2.0]) for _ in range(T)])
    v = np.array([pick(rng, [0.0, 0.5, 1.0]) for _ in range(T)])
    last = pick(rng, [0.0, 1.0])
    gamma, lam = pick(rng, [0.9, 0.99]), pick(rng, [0.9, 0.95, 1.0])
    adv, _ = gae(r, v, np.zeros(T), np.array(last), gamma=gamma, lam=lam)
    if abs(float(adv[0])) < 1e-3:  # a zero key cannot be checked relatively: add a reward at t = 0
        r[0] += 1.0
        adv, _ = gae(r, v, np.zeros(T), np.array(last), gamma=gamma, lam=lam)
    a0 = float(adv[0])
    return dict(
        text=f"Rewards {r.tolist()}, values {v.tolist()}, value after the last step {last}, no episode end, "
        f"γ = {gamma}, λ = {lam}: the GAE advantage at t = 0?",
        params={"rewards": r.tolist(), "values": v.tolist(), "last_value": last, "gamma": gamma, "lam": lam},
        answer=a0,
        unit="ratio",
        tolerance=0.01,
        hints=["δ_t = r_t + γ V_{t+1} − V_t.", "A_0 = δ_0 + γλ δ_1 + (γλ)² δ_2."],
        solution=[f"A = {[round(float(a), 4) for a in adv]} (rl.gae.gae); A_0 = {a0:.4g}."],
    )


# ---- layouts from the planner (a model: mlsys_nb.planner) ---------------------------------------
SEC12 = "notebooks/12_putting_parallelism_together.ipynb, §3 Searching the layout space: a planner"
REF_PLAN = "docs/references.md#megatron-ptdp (Narayanan et al. 2021, arXiv:2104.04473), #llama3"
_LAYOUTS = {
    "dp only, ZeRO-3": dict(tp=1, zero=3),
    "tp=2, ZeRO-1": dict(tp=2, zero=1),
    "tp=8, ZeRO-1": dict(tp=8, zero=1),
    "tp=4 x pp=2 (1F1B), ZeRO-1": dict(tp=4, pp=2, schedule="1f1b", zero=1),
}


def _plan_case(rng):
    return (
        pick(rng, ["llama-3-8b", "llama-2-13b", "llama-3.2-3b"]),
        pick(rng, [32, 64, 128]),
        pick(rng, ["H100-SXM", "A100-80GB-SXM"]),
        pick(rng, [2, 4, 8]) * 2**20,
    )


def _evaluate(model, lay, gpus, gpu, tokens):
    from ... import planner

    try:
        return planner.evaluate(model, gpus=gpus, gpu=gpu, global_batch_tokens=tokens, seq_len=4096, **lay)
    except ValueError:
        return None


@family("layout.fastest_layout", "layout", kind="choice", difficulty=3, section=SEC12, reference=REF_PLAN)
def _fastest(rng):
    model, gpus, gpu, tokens = _plan_case(rng)
    plans = {k: _evaluate(model, v, gpus, gpu, tokens) for k, v in _LAYOUTS.items()}
    ok = {k: p for k, p in plans.items() if p is not None and p.fits}
    ans = min(ok, key=lambda k: ok[k].step_s) if ok else "none fits"
    return dict(
        text=f"Training {model} on {gpus} × {gpu} (8 per node, InfiniBand between nodes), global batch "
        f"{tokens / 2**20:g}M tokens of 4096: which layout has the shortest modelled step among those "
        f"that fit (the kit's planner: α-β communication, 80 % of DP traffic overlapped, 100 % of peak)?",
        params={"model": model, "gpus": gpus, "gpu": gpu, "global_batch_tokens": tokens},
        answer=ans,
        choices=[*_LAYOUTS, "none fits"],
        hints=[
            "TP traffic is per layer and per micro-batch; DP traffic once per step (and mostly hidden).",
            "ZeRO-3 adds parameter all-gathers every micro-batch.",
        ],
        solution=[
            f"{k}: "
            + (
                f"step {p.step_s:.3g} s, {gb(p.memory_bytes)}, fits={p.fits}; {p.bottleneck}"
                if p is not None
                else "not allowed"
            )
            for k, p in plans.items()
        ]
        + [f"Fastest that fits: {ans} (planner.evaluate)."],
    )


@family("layout.modelled_mfu", "layout", difficulty=3, section=SEC12, reference=REF_PLAN)
def _plan_mfu(rng):
    for _ in range(50):
        model, gpus, gpu, tokens = _plan_case(rng)
        name = pick(rng, list(_LAYOUTS))
        p = _evaluate(model, _LAYOUTS[name], gpus, gpu, tokens)
        if p is not None:
            break
    return dict(
        text=f"The planner's modelled step for {model} on {gpus} × {gpu} with '{name}', global batch "
        f"{tokens / 2**20:g}M tokens of 4096, takes {p.step_s:.4g} s. What MFU is that (model FLOPs "
        f"per step / (GPUs × bf16 peak × step time))?",
        params={
            "model": model,
            "gpus": gpus,
            "gpu": gpu,
            "layout": name,
            "global_batch_tokens": tokens,
            "step_s": p.step_s,
        },
        answer=p.mfu,
        unit="fraction",
        hints=[
            "Model FLOPs per step = exact FLOPs per token × tokens per step.",
            "Divide by GPUs × peak × step seconds.",
        ],
        solution=[
            "Time by component: " + ", ".join(f"{k} {v:.3g} s" for k, v in p.time.items()),
            f"MFU = {p.mfu:.4g} (planner.evaluate(...).mfu).",
        ],
    )


# ---- more memory knobs ---------------------------------------------------------------------------
@family(
    "tensor.params_per_rank",
    "tensor",
    section="notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node",
    reference="docs/references.md#megatron (arXiv:1909.08053)",
)
def _tp_params(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-3-70b"])
    tp = pick(rng, [2, 4, 8])
    b = memory.estimate(memory.preset(model), TrainConfig(tp=tp))
    return dict(
        text=f"{model} under tensor parallelism tp = {tp} (vocab-parallel embedding and head, norms "
        f"replicated): parameters held per rank?",
        params={"model": model, "tp": tp},
        answer=b.n_params_rank,
        unit="params",
        hints=[
            "Attention and MLP weight matrices and the vocabulary are split tp ways.",
            "Norm weights are replicated on every rank.",
        ],
        solution=[
            f"Total {b.n_params_total:.4g}; per rank {b.n_params_rank:.4g} (memory.estimate(...).n_params_rank)."
        ],
        diagnostics=[(b.n_params_total / tp / b.n_params_rank, "close: the norms are not split")],
    )


@family(
    "tensor.sp_activation_saving",
    "tensor",
    difficulty=2,
    section="notebooks/07_tensor_parallelism.ipynb, §5 Sequence parallelism",
    reference="docs/references.md#megatron-sp (arXiv:2205.05198, Table 2)",
)
def _sp_save(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"])
    tp = pick(rng, [2, 4, 8])
    s = pick(rng, [2048, 4096])
    m = memory.preset(model)
    a = memory.estimate(m, TrainConfig(tp=tp, seq_len=s)).activations
    b = memory.estimate(m, TrainConfig(tp=tp, sp=True, seq_len=s)).activations
    return dict(
        text=f"{model}, tp = {tp}, micro-batch 1 × {s}, flash attention: by what factor does turning on "
        f"sequence parallelism divide the stored activations?",
        params={"model": model, "tp": tp, "seq_len": s},
        answer=a / b,
        unit="ratio",
        hints=[
            "Without SP the norm and dropout inputs (h-wide) are replicated on every TP rank.",
            "SP splits them along the sequence: everything is then divided by tp.",
        ],
        solution=[f"Without SP {gb(a)}, with SP {gb(b)} (memory.estimate).", f"Factor {a / b:.4g}."],
    )


@family(
    "memory.recompute_saving",
    "memory",
    difficulty=2,
    section=SEC_MEM + ", §3 Recomputation: memory against extra FLOPs",
    reference="docs/references.md#activation-checkpointing (Chen et al. 2016), #megatron-sp",
)
def _rc(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "gpt-2-small"])
    mode = pick(rng, ["selective", "full"])
    s = pick(rng, [2048, 4096])
    m = memory.preset(model)
    kw = dict(seq_len=s, flash_attention=False)
    a = memory.estimate(m, TrainConfig(**kw)).activations_layers
    b = memory.estimate(m, TrainConfig(recompute=mode, **kw)).activations_layers
    return dict(
        text=f"{model}, micro-batch 1 × {s}, WITHOUT flash attention (scores stored): by what factor does "
        f"{mode} recomputation divide the activations stored by the transformer layers?",
        params={"model": model, "recompute": mode, "seq_len": s},
        answer=a / b,
        unit="ratio",
        hints=[
            "Selective drops the s²-sized attention tensors; full keeps only each block's input.",
            "Full: 2·h bytes per token per layer remain.",
        ],
        solution=[f"none {gb(a)}, {mode} {gb(b)} (memory.estimate(...).activations_layers).", f"Factor {a / b:.4g}."],
    )


@family(
    "memory.max_micro_batch",
    "memory",
    difficulty=2,
    section=SEC_MEM + ", §4 The whole GPU: one rank of a real model, §8 Sweeps",
    reference=REF_MEM,
)
def _max_mb(rng):
    for _ in range(100):
        model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-3.2-3b", "llama-2-13b"])
        t = TrainConfig(
            seq_len=pick(rng, [2048, 4096]),
            dp=pick(rng, [8, 16, 64]),
            zero=pick(rng, [1, 2, 3]),
            recompute=pick(rng, ["none", "selective", "full"]),
            gpu=pick(rng, ["H100-SXM", "A100-80GB-SXM"]),
        )
        m = memory.preset(model)
        best = 0
        for mb in range(1, 65):
            if memory.estimate(m, t.replace(micro_batch=mb)).fits:
                best = mb
            else:
                break
        if 1 <= best < 64:
            break
    first = memory.estimate(m, t.replace(micro_batch=1))
    return dict(
        text=f"{model}, sequences of {t.seq_len} tokens, dp = {t.dp} with ZeRO-{t.zero}, recompute="
        f"{t.recompute}, bf16-mixed Adam, on {t.gpu}: the largest micro-batch (sequences) that fits?",
        params={
            "model": model,
            "seq_len": t.seq_len,
            "dp": t.dp,
            "zero": t.zero,
            "recompute": t.recompute,
            "gpu": t.gpu,
        },
        answer=best,
        unit="count",
        tolerance=0.0,
        hints=[
            "Model states do not depend on the micro-batch; activations grow linearly with it.",
            f"At micro-batch 1: states {gb(first.model_states)}, activations {gb(first.activations)}.",
        ],
        solution=[
            "Free after states and temporaries: compare with the activations per sequence.",
            f"micro-batch {best} fits, {best + 1} does not (memory.estimate(...).fits).",
        ],
    )


@family(
    "scaling.inference_optimal_shrink",
    "scaling",
    difficulty=3,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference="docs/references.md#sardana2023 (Sardana et al. 2023, arXiv:2401.00448)",
)
def _inf_opt(rng):
    c = pick(rng, [1e22, 1e23, 1e24])
    mult = pick(rng, [1, 3, 10])
    law = scaling.law("chinchilla")
    n0, d0 = law.compute_optimal(c)
    r = law.inference_optimal(c, mult * d0)
    ratio = r["chinchilla_N"] / r["N"]
    return dict(
        text=f"Budget C = {c:.3g} FLOPs, Chinchilla law. The model will then serve {mult}× its "
        f"Chinchilla-optimal training tokens at inference (2N FLOPs per token). "
        f"Reaching the same loss with the least lifetime compute, by what factor is the model "
        f"smaller than Chinchilla-optimal?",
        params={"C": c, "inference_multiple": mult},
        answer=ratio,
        unit="ratio",
        tolerance=0.02,
        hints=["Lifetime = 6·N·D_train + 2·N·D_inference.", "Along the iso-loss curve, trade N for D."],
        solution=[
            f"Chinchilla N* = {n0:.4g}; inference-aware N = {r['N']:.4g} trained on {r['D']:.4g} tokens.",
            f"Factor {ratio:.4g} (scaling.law('chinchilla').inference_optimal).",
        ],
    )


@family(
    "rl.ppo_clipped_objective",
    "rl",
    difficulty=2,
    section="notebooks/17_rl_fundamentals.ipynb, §5 PPO's clipped objective",
    reference="docs/references.md#ppo (Schulman et al. 2017, arXiv:1707.06347, eq. 7)",
)
def _ppo(rng):
    import math

    import torch

    from ...rl.ppo import ppo_loss

    ratio = pick(rng, [0.5, 0.7, 0.9, 1.1, 1.3, 1.6])
    adv = pick(rng, [-2.0, -1.0, 1.0, 2.0])
    eps = pick(rng, [0.1, 0.2])
    t = lambda x: torch.tensor([x])  # noqa: E731
    _, parts = ppo_loss(t(math.log(ratio)), t(0.0), t(adv), t(0.0), t(0.0), t(0.0), clip=eps, normalize=False)
    obj = -float(parts["policy"])
    return dict(
        text=f"PPO with clip ε = {eps}: probability ratio r = {ratio}, advantage A = {adv}. The clipped "
        f"surrogate objective (to maximise) for this sample?",
        params={"ratio": ratio, "advantage": adv, "clip": eps},
        answer=obj,
        unit="ratio",
        tolerance=0.005,
        hints=["L = min(r·A, clip(r, 1−ε, 1+ε)·A).", "For A < 0 the min picks the more negative value."],
        solution=[
            f"r·A = {ratio * adv:.4g}; clip(r)·A = {min(max(ratio, 1 - eps), 1 + eps) * adv:.4g}.",
            f"min = {obj:.4g} (rl.ppo.ppo_loss, policy part negated).",
        ],
    )


# ---- RLHF objectives (mlsys_nb.rl.rlhf) ---------------------------------------------------------
SEC18 = "notebooks/18_rlhf.ipynb"


@family(
    "rl.grpo_advantage",
    "rl",
    difficulty=2,
    section=SEC18 + ", §5 GRPO: group-relative advantages, no critic",
    reference="docs/references.md#grpo (Shao et al. 2024, arXiv:2402.03300, §4.1.2)",
)
def _grpo(rng):
    import torch

    from ...rl.rlhf import grpo_advantages

    for _ in range(20):
        g = pick(rng, [3, 4, 5])
        r = [float(pick(rng, [0, 0.5, 1, 2])) for _ in range(g)]
        i = rng.randrange(g)
        if len(set(r)) > 1 and r[i] != sum(r) / g:
            break
    a = float(grpo_advantages(torch.tensor([r]))[0, i])
    return dict(
        text=f"GRPO samples a group of {g} responses to one prompt with rewards {r}. The advantage of response "
        f"{i + 1} (group-normalised, sample standard deviation with Bessel's correction)?",
        params={"rewards": r, "index": i},
        answer=a,
        unit="ratio",
        tolerance=0.01,
        hints=["A_i = (r_i − mean) / std of the group.", "std with n − 1 in the denominator."],
        solution=[f"mean = {sum(r) / g:.4g}; A = {a:.4g} (rl.rlhf.grpo_advantages)."],
        diagnostics=[((g / (g - 1)) ** 0.5, "use the sample std (n − 1), as torch.std does")],
    )


@family(
    "rl.dpo_loss",
    "rl",
    difficulty=2,
    section=SEC18 + ", §6 DPO: the same preferences, offline, no reward model",
    reference="docs/references.md#dpo (Rafailov et al. 2023, arXiv:2305.18290, eq. 7)",
)
def _dpo(rng):
    import torch

    from ...rl.rlhf import dpo_loss

    pc, pr = pick(rng, [-10.0, -12.0, -15.0]), pick(rng, [-11.0, -14.0, -18.0])
    rc, rr = pick(rng, [-12.0, -13.0]), pick(rng, [-12.0, -13.0])
    beta = pick(rng, [0.1, 0.5, 1.0])
    t = lambda x: torch.tensor([x])  # noqa: E731
    v = float(dpo_loss(t(pc), t(pr), t(rc), t(rr), beta=beta))
    return dict(
        text=f"DPO with β = {beta}: sequence log-probs under the policy, chosen {pc}, rejected {pr}; under the "
        f"reference, chosen {rc}, rejected {rr}. The loss for this pair (nats)?",
        params={"pc": pc, "pr": pr, "rc": rc, "rr": rr, "beta": beta},
        answer=v,
        unit="nats/token",
        tolerance=0.01,
        hints=["margin = β·((π_c − ref_c) − (π_r − ref_r)).", "loss = −log σ(margin) = log(1 + e^(−margin))."],
        solution=[f"margin = {beta * ((pc - rc) - (pr - rr)):.4g}; loss = {v:.4g} (rl.rlhf.dpo_loss)."],
    )


@family(
    "rl.kl_k3_estimate",
    "rl",
    section=SEC18 + ", §3 PPO with a per-token KL penalty",
    reference="docs/references.md#kl-approx (Schulman 2020)",
)
def _k3(rng):
    import torch

    from ...rl.rlhf import kl_estimate

    lp, lr = pick(rng, [-1.0, -2.0, -0.5]), pick(rng, [-1.5, -2.5, -0.2, -3.0])
    v = float(kl_estimate(torch.tensor([lp]), torch.tensor([lr]), kind="k3")[0])
    return dict(
        text=f"A sampled token has log π = {lp} under the policy and log π_ref = {lr} under the reference. "
        f"Schulman's k3 estimate of KL(π‖π_ref) for this sample?",
        params={"logp": lp, "logp_ref": lr},
        answer=v,
        unit="nats/token",
        tolerance=0.01,
        hints=["q = log π_ref − log π.", "k3 = e^q − q − 1 (never negative)."],
        solution=[f"q = {lr - lp:.4g}; k3 = {v:.4g} (rl.rlhf.kl_estimate(kind='k3'))."],
        diagnostics=[(abs(lp - lr) / v if v else 1e9, "that is |k1|; k3 = e^q − q − 1")],
    )


# ---- mixture of experts: total vs active -------------------------------------------------------------
MOE_ASKS = ("total parameters", "active parameters per token", "bf16 weight bytes to serve it")


@family(
    "expert_context.moe_params",
    "expert_context",
    difficulty=2,
    section="notebooks/09_experts_and_context.ipynb, §4 EP or TP for the experts? Bytes and memory per rank",
    reference="docs/references.md#mixtral (Jiang et al. 2024, arXiv:2401.04088), #switch",
)
def _moe(rng):
    base = memory.preset("mixtral-8x7b")
    e = pick(rng, [8, 16, 32])
    k = pick(rng, [1, 2, 4])
    cfg = base.replace(n_experts=e, top_k=k, name=f"mixtral-like-{e}x{k}")
    ask = pick(rng, MOE_ASKS)
    pc = memory.param_count(cfg)
    ans = {MOE_ASKS[0]: pc.total, MOE_ASKS[1]: pc.active, MOE_ASKS[2]: 2 * pc.total}[ask]
    return dict(
        text=f"A Mixtral-like MoE: {cfg.n_layers} layers, hidden {cfg.hidden}, attention with {cfg.n_heads} query "
        f"and {cfg.n_kv_heads} KV heads of dim {cfg.head_dim}, every layer's MLP replaced by {e} SwiGLU experts "
        f"of width {cfg.expert_ffn_hidden} with a linear router picking the top {k} per token, RMSNorms, "
        f"vocabulary {cfg.vocab_size} (untied embedding and head). Its {ask}?",
        params={"n_experts": e, "top_k": k, "ask": ask},
        answer=ans,
        unit="bytes" if ask == MOE_ASKS[2] else "params",
        hints=[
            "One expert: 3 × hidden × width (gate, up, down). The router: hidden × n_experts per layer.",
            "Active: attention, router, norms, embedding, head and only the top-k experts. Serving holds ALL.",
        ],
        solution=[
            f"Total {pc.total:,} parameters; active per token {pc.active:,} (memory.param_count).",
            f"Serving keeps every expert resident: {gb(2 * pc.total)} in bf16, while each token costs "
            f"2 × {pc.active:.4g} FLOPs.",
        ],
        diagnostics=[(pc.active / pc.total, "that is the active count: memory holds every expert")]
        if ask != MOE_ASKS[1]
        else [(pc.total / pc.active, "that is the total: a token only runs through its top-k experts")],
    )


# ---- RLHF: synchronous vs one-step-off-policy asynchronous -----------------------------------------
@family(
    "rl.async_rlhf_speedup",
    "rl",
    difficulty=2,
    section="notebooks/19_rlhf_systems.ipynb, §3 Placement on Ray: co-located, disaggregated, one step off-policy",
    reference="docs/references.md#openrlhf (Hu et al. 2024, arXiv:2405.11143; Sheng et al. 2024, arXiv:2409.19256)",
)
def _async_rlhf(rng):
    from ...rl.placement import async_step_s, sync_step_s

    g = pick(rng, [20.0, 40.0, 60.0, 90.0])
    t = pick(rng, [15.0, 30.0, 45.0, 80.0])
    s = pick(rng, [0.5, 2.0, 5.0, 10.0])
    a, b = sync_step_s(g, t, s), async_step_s(g, t, s)
    return dict(
        text=f"Disaggregated PPO-RLHF: rollout GPUs generate a batch in {g:g} s, trainer GPUs train on it in {t:g} s, "
        f"and pushing the new weights to the rollout engines takes {s:g} s (nothing else runs meanwhile). "
        f"Going from synchronous (generate, train, sync in turn) to one-step off-policy asynchronous "
        f"(generation of step t+1 overlaps training of step t): speed-up in steps per hour (model)?",
        params={"gen_s": g, "train_s": t, "sync_s": s},
        answer=a / b,
        unit="ratio",
        hints=["Synchronous step: gen + train + sync.", "Asynchronous: max(gen, train) + sync (the sync cannot hide)."],
        solution=[
            f"sync {a:g} s, async {b:g} s per step (rl.placement.sync_step_s, async_step_s).",
            f"Speed-up {a / b:.4g}×; the price is data one policy version old.",
        ],
        diagnostics=[((g + t + s) / (max(g, t)) / (a / b), "the weight sync cannot overlap: add it to both")],
    )
