"""Families of the topic ``tensor``: tensor and sequence parallelism (bytes and time per layer,
parameters per rank, the activation saving of SP).

Answer keys: ``parallel.tensor.tp_bytes_per_layer`` (from ``comm.bytes_sent_per_rank``),
``comm.collective_time``, ``memory.estimate``.
"""

from __future__ import annotations

from ... import comm, memory
from ...config import TrainConfig
from ..core import family
from ._util import gb_over_under, gbps, numeric_family, pick, picks, ratio_family, tensor_parallel, us


REF_TP = "docs/references.md#megatron (Shoeybi et al. 2019, arXiv:1909.08053), #megatron-sp (Korthikanti et al. 2022)"
SEC_TP = "notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node"
SEC_SP = "notebooks/07_tensor_parallelism.ipynb, §5 Sequence parallelism"
REF_SP_SAVING = "docs/references.md#megatron-sp (arXiv:2205.05198, Table 2)"


def _tp_params(rng) -> dict:
    b, s, h = pick(rng, [1, 2, 4, 8]), pick(rng, [2048, 4096, 8192]), pick(rng, [4096, 5120, 8192])
    return {"b": b, "s": s, "h": h, "tp": pick(rng, [2, 4, 8])}


def _x(p) -> float:
    """Bytes of one [b, s, h] bf16 activation."""
    return p["b"] * p["s"] * p["h"] * 2


def _layer_bytes_family(name: str, sp: bool, difficulty: int = 1, **words):
    """Bytes one rank sends per layer in the forward of a drawn layer, under TP (``sp`` False) or TP + SP
    (``parallel.tensor.tp_bytes_per_layer``)."""
    numeric_family(
        family(name, difficulty=difficulty, section=SEC_TP, reference=REF_TP),
        draw=_tp_params,
        calc=lambda p: tensor_parallel.tp_bytes_per_layer(p["b"], p["s"], p["h"], p["tp"], sp),
        unit="bytes",
        fields=lambda p, result: {"x": _x(p)},
        **words,
    )


_layer_bytes_family(
    "tensor.tp_bytes_per_layer",
    False,
    text="Megatron tensor parallelism, tp = {tp}, micro-batch {b} × {s} tokens, hidden {h}, bf16: bytes one rank sends "
    "per layer in the FORWARD pass (ring all-reduce)?",
    hints=[
        "Two all-reduces per layer in the forward: after attention and after the MLP.",
        "Each all-reduce of b·s·h·2 B sends 2(tp−1)/tp of it.",
    ],
    solution=["Activation X = b·s·h·2 = {x:.4g} B.", "2 all-reduces × 2(tp−1)/tp × X = {result:.4g} B."],
    diagnostics=[(0.5, "there are TWO all-reduces per layer (attention and MLP)")],
)

_layer_bytes_family(
    "tensor.sp_bytes_per_layer",
    True,
    difficulty=2,
    text="Sequence parallelism on top of TP = {tp} (micro-batch {b} × {s} tokens, hidden {h}, bf16): bytes one rank "
    "sends per layer in the forward pass?",
    hints=[
        "Each all-reduce becomes a reduce-scatter + an all-gather.",
        "A ring all-reduce IS a reduce-scatter + an all-gather: same bytes.",
    ],
    solution=[
        "2 × (reduce-scatter + all-gather) of {x:.4g} B = {result:.4g} B,",
        "exactly what TP's two all-reduces send (SP saves activation memory, not traffic).",
    ],
)


def _tp_time_case(rng) -> dict:
    return {**_tp_params(rng), "alpha": 5e-6, "beta": pick(rng, [300e9, 450e9])}


numeric_family(
    family("tensor.tp_allreduce_time_per_layer", difficulty=2, section=SEC_TP, reference=REF_TP),
    draw=_tp_time_case,
    calc=lambda p: 2 * comm.collective_time("all_reduce", _x(p), p["tp"], p["alpha"], p["beta"], "ring"),
    unit="seconds",
    fields=lambda p, t: {
        "link": f"α = {us(p['alpha'])}, β = {gbps(p['beta'])}",
        "x": _x(p),
        "one_ms": t / 2 * 1e3,
        "ms": t * 1e3,
    },
    text="TP = {tp} over NVLink (assumed {link}), micro-batch {b} × {s} tokens, hidden {h}, bf16: time of one layer's "
    "forward all-reduces (two ring all-reduces)?",
    hints=["S = b·s·h·2 bytes per all-reduce.", "T = 2(tp−1)α + 2(tp−1)/tp·S/β, twice."],
    solution=["S = {x:.4g} B; one all-reduce {one_ms:.4g} ms (comm.collective_time).", "Two per layer: {ms:.4g} ms."],
    diagnostics=[(0.5, "two all-reduces per layer in the forward")],
)

numeric_family(
    family("tensor.params_per_rank", section=SEC_TP, reference="docs/references.md#megatron (arXiv:1909.08053)"),
    draw=lambda rng: picks(rng, model=["llama-2-7b", "llama-3-8b", "llama-2-13b", "llama-3-70b"], tp=[2, 4, 8]),
    calc=lambda p: memory.estimate(memory.preset(p["model"]), TrainConfig(tp=p["tp"])),
    key=lambda b: b.n_params_rank,
    unit="params",
    text="{model} under tensor parallelism tp = {tp} (vocab-parallel embedding and head, norms replicated): "
    "parameters held per rank?",
    hints=[
        "Attention and MLP weight matrices and the vocabulary are split tp ways.",
        "Norm weights are replicated on every rank.",
    ],
    solution=[
        "Total {result.n_params_total:.4g}; per rank {result.n_params_rank:.4g} (memory.estimate(...).n_params_rank)."
    ],
    diagnostics=lambda p, b: [(b.n_params_total / p["tp"] / b.n_params_rank, "close: the norms are not split")],
)


ratio_family(
    family("tensor.sp_activation_saving", difficulty=2, section=SEC_SP, reference=REF_SP_SAVING),
    draw=lambda rng: picks(rng, model=["llama-2-7b", "llama-3-8b", "llama-2-13b"], tp=[2, 4, 8], seq_len=[2048, 4096]),
    calc=lambda p, sp: (
        memory.estimate(memory.preset(p["model"]), TrainConfig(tp=p["tp"], sp=sp, seq_len=p["seq_len"])).activations
    ),
    over=dict(sp=False),
    under=dict(sp=True),
    fields=gb_over_under,
    text=(
        "{model}, tp = {tp}, micro-batch 1 × {seq_len}, flash attention: by what factor does turning on "
        "sequence parallelism divide the stored activations?"
    ),
    hints=[
        "Without SP the norm and dropout inputs (h-wide) are replicated on every TP rank.",
        "SP splits them along the sequence: everything is then divided by tp.",
    ],
    solution=["Without SP {over_gb}, with SP {under_gb} (memory.estimate).", "Factor {ratio:.4g}."],
)
