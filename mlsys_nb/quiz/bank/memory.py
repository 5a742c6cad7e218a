"""Families of the topic ``memory``: training memory (model states, bytes per parameter,
activations, recomputation, whether it fits, which knob fixes an OOM, the largest micro-batch).

Answer keys: ``mlsys_nb.memory`` (``model_state_bytes``, ``estimate``).
"""

from __future__ import annotations

from ... import hardware, memory
from ...config import TrainConfig
from ..core import family
from ._util import gb, gb_over_under, numeric_family, pick, picks, ratio_family

REF_MEM = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §3), #mixed-precision"
SEC_MEM = "notebooks/10_training_memory.ipynb"
N_PARAMS = [125e6, 350e6, 1.3e9, 2.7e9, 7e9, 13e9, 34e9, 70e9, 175e9]


SEC_STATES = SEC_MEM + ", §1 Model states: parameters, gradients, optimizer, master weights"
SEC_WHOLE_GPU = SEC_MEM + ", §4 The whole GPU: one rank of a real model, §8 Sweeps"
SEC_DIVIDED = SEC_MEM + ", §5 How each parallelism divides each term, §8 Sweeps"
SEC_ACTIVATIONS = SEC_MEM + ", §2 Activations, measured on a real transformer"
REF_SP = "docs/references.md#megatron-sp (Korthikanti et al. 2022, arXiv:2205.05198, §4)"
SEC_RECOMPUTE = SEC_MEM + ", §3 Recomputation: memory against extra FLOPs"
REF_RECOMPUTE = "docs/references.md#activation-checkpointing (Chen et al. 2016), #megatron-sp"


def _states_diagnostics(p, s) -> list:
    n, dp, z = p["n_params"], p["dp"], p["zero"]
    wrong12 = memory.model_state_bytes(n, dp=dp, zero=z, precision="bf16-nomaster").total
    diag = [(wrong12 / s.total, "did you forget the fp32 master copy (4 B/param)? mixed-precision Adam is 2+2+12")]
    if z and dp > 1:
        diag.append(
            (
                memory.model_state_bytes(n, dp=1, zero=0).total / s.total,
                f"ZeRO-{z} shards part of the states over dp = {dp}",
            )
        )
    return diag


numeric_family(
    family("memory.model_states", section=SEC_STATES, reference=REF_MEM),
    draw=lambda rng: picks(rng, n_params=N_PARAMS, dp=[1, 2, 4, 8, 16, 64], zero=[0, 1, 2, 3]),
    calc=lambda p: memory.model_state_bytes(p["n_params"], dp=p["dp"], zero=p["zero"]),
    key=lambda s: s.total,
    unit="bytes",
    fields=lambda p, result: {
        "params_gb": gb(result.params),
        "grads": gb(result.grads),
        "optimizer": gb(result.optimizer),
        "master": gb(result.master),
        "total": gb(result.total),
    },
    text=(
        "Mixed-precision Adam (bf16 params and grads, fp32 master + 2 fp32 moments), {n_params:.3g} "
        "parameters, data parallel over {dp} GPUs with ZeRO stage {zero}: bytes of model states per GPU?"
    ),
    hints=[
        "2 B params + 2 B grads + 12 B (master 4 + m 4 + v 4) per parameter.",
        "Stage 1 shards the 12 B, stage 2 also the grads, stage 3 also the params.",
    ],
    solution=[
        "params {params_gb}, grads {grads}, optimizer {optimizer}, master {master}.",
        "Total {total} per GPU (memory.model_state_bytes).",
    ],
    diagnostics=_states_diagnostics,
)

RECIPES = [("bf16-mixed", "adam"), ("fp32", "adam"), ("bf16-mixed", "sgd-momentum"), ("fp32", "sgd"),
           ("bf16-mixed", "adam-8bit")]  # fmt: skip

numeric_family(
    family("memory.bytes_per_param", section=SEC_STATES, reference=REF_MEM),
    draw=lambda rng: dict(zip(("precision", "optimizer"), pick(rng, RECIPES))),
    calc=lambda p: memory.model_state_bytes(1, precision=p["precision"], optimizer=p["optimizer"]).total,
    unit="count",
    text=("Bytes of model states per parameter for precision {precision} with optimizer {optimizer} (no sharding)?"),
    hints=[
        "params + grads + optimizer states + (mixed precision) an fp32 master copy.",
        "Adam keeps 2 states (m, v); SGD with momentum 1; plain SGD 0.",
    ],
    solution=["memory.model_state_bytes(1, precision={precision!r}, optimizer={optimizer!r}).total = {result:g} B."],
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


def _acts_case(rng) -> dict:
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "gpt-2-small"])
    mb, seq = pick(rng, [1, 2, 4]), pick(rng, [1024, 2048, 4096])
    return {"model": model, "micro_batch": mb, "seq_len": seq, "recompute": pick(rng, ["none", "selective", "full"])}


numeric_family(
    family("memory.activations_per_layer", difficulty=2, section=SEC_ACTIVATIONS, reference=REF_SP),
    draw=_acts_case,
    calc=lambda p: memory.estimate(
        memory.preset(p["model"]),
        TrainConfig(micro_batch=p["micro_batch"], seq_len=p["seq_len"], recompute=p["recompute"]),
    ),
    key=lambda b: b.activations_per_layer,
    unit="bytes",
    tolerance=0.05,
    text=lambda p: (
        f"Training {p['model']} (flash attention, fused kernels, bf16 activations), micro-batch "
        f"{p['micro_batch']} × {p['seq_len']} tokens, recompute={p['recompute']}: activation bytes stored per layer?"
    ),
    hints=[
        "Add the tensors each op saves for backward, per token, then × b·s.",
        "recompute=full stores only the block input (2·h bytes per token).",
    ],
    solution=lambda p, b: (
        [f"{name}: {v / 1e6:.4g} MB" for name, v in b.terms]
        + [f"Sum = {gb(b.activations_per_layer)} (memory.estimate(...).activations_per_layer)."]
    ),
)


@family("memory.fits", kind="choice", section=SEC_WHOLE_GPU, reference=REF_MEM)
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


@family("memory.oom_knob", kind="choice", difficulty=3, section=SEC_DIVIDED, reference=REF_MEM)
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


ratio_family(
    family("memory.recompute_saving", difficulty=2, section=SEC_RECOMPUTE, reference=REF_RECOMPUTE),
    draw=lambda rng: picks(
        rng, model=["llama-2-7b", "llama-3-8b", "gpt-2-small"], recompute=["selective", "full"], seq_len=[2048, 4096]
    ),
    calc=lambda p, recompute: (
        memory.estimate(
            memory.preset(p["model"]), TrainConfig(recompute=recompute, seq_len=p["seq_len"], flash_attention=False)
        ).activations_layers
    ),
    over=dict(recompute="none"),
    under=lambda p: dict(recompute=p["recompute"]),
    fields=gb_over_under,
    text=(
        "{model}, micro-batch 1 × {seq_len}, WITHOUT flash attention (scores stored): by what factor does "
        "{recompute} recomputation divide the activations stored by the transformer layers?"
    ),
    hints=[
        "Selective drops the s²-sized attention tensors; full keeps only each block's input.",
        "Full: 2·h bytes per token per layer remain.",
    ],
    solution=[
        "none {over_gb}, {recompute} {under_gb} (memory.estimate(...).activations_layers).",
        "Factor {ratio:.4g}.",
    ],
)


@family("memory.max_micro_batch", difficulty=2, section=SEC_WHOLE_GPU, reference=REF_MEM)
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
