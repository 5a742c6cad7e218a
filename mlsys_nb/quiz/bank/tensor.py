"""Families of the topic ``tensor``: tensor and sequence parallelism (bytes and time per layer,
parameters per rank, the activation saving of SP).

Answer keys: ``tp_bytes_per_layer`` (from ``comm.bytes_sent_per_rank``), ``comm.collective_time``,
``memory.estimate``.
"""

from __future__ import annotations

from ... import comm, memory
from ...config import TrainConfig
from ..core import family
from ._util import gb, gbps, pick, ratio_family, us

REF_TP = "docs/references.md#megatron (Shoeybi et al. 2019, arXiv:1909.08053), #megatron-sp (Korthikanti et al. 2022)"
SEC_TP = "notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node"


def tp_bytes_per_layer(b: int, s: int, h: int, tp: int, sp: bool, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per transformer layer in the forward: Megatron TP has two all-reduces
    of b·s·h activations (after attention and after the MLP); SP replaces each by a reduce-scatter
    and an all-gather (same bytes, from ``comm.bytes_sent_per_rank``)."""
    x = b * s * h * dtype_bytes
    if sp:
        return 2 * (comm.bytes_sent_per_rank("reduce_scatter", x, tp) + comm.bytes_sent_per_rank("all_gather", x, tp))
    return 2 * comm.bytes_sent_per_rank("all_reduce", x, tp)


def _tp_params(rng):
    return (pick(rng, [1, 2, 4, 8]), pick(rng, [2048, 4096, 8192]), pick(rng, [4096, 5120, 8192]), pick(rng, [2, 4, 8]))


@family("tensor.tp_bytes_per_layer", "tensor", section=SEC_TP, reference=REF_TP)
def _tp_bytes(rng):
    b, s, h, tp = _tp_params(rng)
    v = tp_bytes_per_layer(b, s, h, tp, False)
    return dict(
        text=f"Megatron tensor parallelism, tp = {tp}, micro-batch {b} × {s} tokens, hidden {h}, bf16: bytes "
        f"one rank sends per layer in the FORWARD pass (ring all-reduce)?",
        params={"b": b, "s": s, "h": h, "tp": tp},
        answer=v,
        unit="bytes",
        hints=[
            "Two all-reduces per layer in the forward: after attention and after the MLP.",
            "Each all-reduce of b·s·h·2 B sends 2(tp−1)/tp of it.",
        ],
        solution=[f"Activation X = b·s·h·2 = {b * s * h * 2:.4g} B.", f"2 all-reduces × 2(tp−1)/tp × X = {v:.4g} B."],
        diagnostics=[(0.5, "there are TWO all-reduces per layer (attention and MLP)")],
    )


@family("tensor.sp_bytes_per_layer", "tensor", difficulty=2, section=SEC_TP, reference=REF_TP)
def _sp_bytes(rng):
    b, s, h, tp = _tp_params(rng)
    v = tp_bytes_per_layer(b, s, h, tp, True)
    return dict(
        text=f"Sequence parallelism on top of TP = {tp} (micro-batch {b} × {s} tokens, hidden {h}, bf16): "
        f"bytes one rank sends per layer in the forward pass?",
        params={"b": b, "s": s, "h": h, "tp": tp},
        answer=v,
        unit="bytes",
        hints=[
            "Each all-reduce becomes a reduce-scatter + an all-gather.",
            "A ring all-reduce IS a reduce-scatter + an all-gather: same bytes.",
        ],
        solution=[
            f"2 × (reduce-scatter + all-gather) of {b * s * h * 2:.4g} B = {v:.4g} B,",
            "exactly what TP's two all-reduces send (SP saves activation memory, not traffic).",
        ],
    )


@family("tensor.tp_allreduce_time_per_layer", "tensor", difficulty=2, section=SEC_TP, reference=REF_TP)
def _tp_time(rng):
    b, s, h, tp = _tp_params(rng)
    beta = pick(rng, [300e9, 450e9])
    alpha = 5e-6
    x = b * s * h * 2
    t = 2 * comm.collective_time("all_reduce", x, tp, alpha, beta, "ring")
    return dict(
        text=f"TP = {tp} over NVLink (assumed α = {us(alpha)}, β = {gbps(beta)}), micro-batch {b} × {s} tokens, "
        f"hidden {h}, bf16: time of one layer's forward all-reduces (two ring all-reduces)?",
        params={"b": b, "s": s, "h": h, "tp": tp, "alpha": alpha, "beta": beta},
        answer=t,
        unit="seconds",
        hints=["S = b·s·h·2 bytes per all-reduce.", "T = 2(tp−1)α + 2(tp−1)/tp·S/β, twice."],
        solution=[
            f"S = {x:.4g} B; one all-reduce {t / 2 * 1e3:.4g} ms (comm.collective_time).",
            f"Two per layer: {t * 1e3:.4g} ms.",
        ],
        diagnostics=[(0.5, "two all-reduces per layer in the forward")],
    )


@family(
    "tensor.params_per_rank",
    "tensor",
    section="notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node",
    reference="docs/references.md#megatron (arXiv:1909.08053)",
)
def _params_per_rank(rng):
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


ratio_family(
    "tensor.sp_activation_saving",
    "tensor",
    difficulty=2,
    section="notebooks/07_tensor_parallelism.ipynb, §5 Sequence parallelism",
    reference="docs/references.md#megatron-sp (arXiv:2205.05198, Table 2)",
    draw=lambda rng: {
        "model": pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"]),
        "tp": pick(rng, [2, 4, 8]),
        "seq_len": pick(rng, [2048, 4096]),
    },
    calc=lambda p, sp: (
        memory.estimate(memory.preset(p["model"]), TrainConfig(tp=p["tp"], sp=sp, seq_len=p["seq_len"])).activations
    ),
    over=dict(sp=False),
    under=dict(sp=True),
    text=lambda p: (
        f"{p['model']}, tp = {p['tp']}, micro-batch 1 × {p['seq_len']}, flash attention: by what factor "
        f"does turning on sequence parallelism divide the stored activations?"
    ),
    hints=[
        "Without SP the norm and dropout inputs (h-wide) are replicated on every TP rank.",
        "SP splits them along the sequence: everything is then divided by tp.",
    ],
    solution=lambda p, a, b, r: [f"Without SP {gb(a)}, with SP {gb(b)} (memory.estimate).", f"Factor {r:.4g}."],
)
