"""Spot-the-error cards: a statement, true or false, drawn (by the seed) either as a common
misconception or as its correction, with the kit's measurement or calculator that settles it.
"""

from __future__ import annotations

from ... import comm, flops, memory, scaling
from ... import pipeline as pl
from ..core import family
from ._util import inference, pick, tensor_parallel, zero


CHOICES = ["true", "false"]


def card(rng, wrong: str, right: str, evidence: list[str], hint: str, params: dict | None = None) -> dict:
    """Show ``wrong`` (answer false) or ``right`` (answer true) with equal odds; ``params``: the drawn
    inputs a second route needs (kept beside ``shown``)."""
    shown_wrong = rng.random() < 0.5
    return dict(
        text=f"True or false? \u201c{wrong if shown_wrong else right}\u201d",
        params={**(params or {}), "shown": "misconception" if shown_wrong else "correction"},
        answer="false" if shown_wrong else "true",
        choices=CHOICES,
        hints=[hint],
        solution=evidence
        + (
            [f"So the statement is false; the correct version: {right}"]
            if shown_wrong
            else ["So the statement is true."]
        ),
    )


@family(
    "cards.zero3_traffic",
    "data_parallel",
    kind="card",
    section="notebooks/06_zero_and_fsdp.ipynb, §5 ZeRO-3 (FSDP): shard the parameters too",
    reference="docs/references.md#zero (arXiv:1910.02054, §7.2.2)",
)
def _c_zero3(rng):
    n = pick(rng, [8, 64, 1024])
    r = zero.zero_bytes_per_step(7e9, n, 3) / zero.zero_bytes_per_step(7e9, n, 0)
    return card(
        rng,
        "ZeRO-3 sends 3× the bytes of DDP per step.",
        "ZeRO-3 sends 1.5× the bytes of DDP per step.",
        [
            f"At n = {n}: DDP all-reduce = reduce-scatter + all-gather; ZeRO-3 adds one all-gather.",
            f"Ratio of bytes per rank (comm.bytes_sent_per_rank): {r:.3g}; tests/test_zero.py counts it on ranks.",
        ],
        "A ring all-reduce is already two phases.",
    )


@family(
    "cards.one_f_one_b_bubble",
    "pipeline",
    kind="card",
    section="notebooks/08_pipeline_parallelism.ipynb, §4 1F1B and activation memory",
    reference="docs/references.md#pipedream-flush (arXiv:2006.09503)",
)
def _c_1f1b(rng):
    p, m = pick(rng, [4, 8]), pick(rng, [8, 16, 32])
    g = pl.simulate(pl.schedule("gpipe", p, m), F=1, B=2)
    o = pl.simulate(pl.schedule("1f1b", p, m), F=1, B=2)
    return card(
        rng,
        "1F1B halves the pipeline bubble of GPipe.",
        "1F1B has the same bubble as GPipe but holds at most p micro-batches of activations instead of m.",
        [
            f"p = {p}, m = {m}: bubble fraction GPipe {g.bubble_fraction:.4g}, 1F1B {o.bubble_fraction:.4g} "
            "(pipeline.simulate).",
            f"Peak activations on rank 0: GPipe {g.peak_activations[0]:g}, 1F1B {o.peak_activations[0]:g}.",
        ],
        "Simulate both and compare the idle time.",
    )


@family(
    "cards.adam_bytes_per_param",
    "memory",
    kind="card",
    section="notebooks/10_training_memory.ipynb, §1 Model states: parameters, gradients, optimizer, master weights",
    reference="docs/references.md#zero (arXiv:1910.02054, §3.1), #mixed-precision",
)
def _c_adam(rng):
    b = memory.model_state_bytes(1).total
    b12 = memory.model_state_bytes(1, precision="bf16-nomaster").total
    return card(
        rng,
        "Mixed-precision training with Adam needs 12 bytes per parameter of model states.",
        "Mixed-precision training with Adam needs 16 bytes per parameter of model states.",
        [
            f"bf16 params 2 + bf16 grads 2 + fp32 master 4 + Adam m 4 + v 4 = {b:g} B (memory.model_state_bytes).",
            f"12 B ({b12:g}) forgets the fp32 master copy.",
        ],
        "List every copy: params, grads, master, two moments.",
    )


@family(
    "cards.twenty_tokens_per_param",
    "scaling",
    kind="card",
    section="notebooks/11_compute_and_scaling_laws.ipynb, §5 Scaling laws and compute-optimal allocation",
    reference="docs/references.md#chinchilla, #epoch-chinchilla",
)
def _c_twenty(rng):
    law = scaling.law("epoch")
    lo, hi = float(law.tokens_per_parameter(1e20)), float(law.tokens_per_parameter(1e26))
    return card(
        rng,
        "Compute-optimal training uses 20 tokens per parameter at every budget (a law).",
        "20 tokens per parameter is a rough approximation; the fitted optimum drifts with the budget.",
        [
            f"Epoch's Chinchilla replication: D*/N* = {lo:.3g} at 1e20 FLOPs and {hi:.3g} at 1e26 "
            "(scaling.law('epoch').tokens_per_parameter)."
        ],
        "Compute D*/N* at two budgets far apart.",
    )


@family(
    "cards.sp_traffic",
    "tensor",
    kind="card",
    section="notebooks/07_tensor_parallelism.ipynb, §5 Sequence parallelism",
    reference="docs/references.md#megatron-sp (arXiv:2205.05198, §4.2.2)",
)
def _c_sp(rng):
    tp = pick(rng, [2, 4, 8])
    a, b = (
        tensor_parallel.tp_bytes_per_layer(1, 4096, 4096, tp, False),
        tensor_parallel.tp_bytes_per_layer(1, 4096, 4096, tp, True),
    )
    return card(
        rng,
        "Sequence parallelism adds communication on top of tensor parallelism.",
        "Sequence parallelism sends the same bytes as tensor parallelism and saves activation memory.",
        [
            f"tp = {tp}: TP {a:.4g} B per layer forward, TP+SP {b:.4g} B (comm.bytes_sent_per_rank).",
            "An all-reduce = reduce-scatter + all-gather; SP just moves the norm/dropout between them.",
        ],
        "Write the all-reduce as its two phases.",
    )


@family(
    "cards.decode_bound",
    "inference",
    kind="card",
    section="notebooks/13_inference_anatomy.ipynb, §4 Prefill and decode on the roofline",
    reference="docs/references.md#roofline, #scaling-book",
)
def _c_decode(rng):
    g = pick(rng, ["H100-SXM", "A100-80GB-SXM"])
    c = inference.decode_cost("llama-3-8b", g, 1024, batch=1)
    return card(
        rng,
        "Decoding one sequence at a time is compute-bound on a modern GPU.",
        "Decoding one sequence at a time is memory-bandwidth-bound on a modern GPU.",
        [
            f"llama-3-8b on {g}, batch 1: intensity {c.intensity_flop_per_byte:.3g} FLOP/B vs ridge "
            f"{c.ridge_flop_per_byte:.3g} → {c.bound}-bound (inference.decode_cost)."
        ],
        "Compare FLOPs per byte read with the GPU's ridge point.",
    )


@family(
    "cards.ring_bytes_grow",
    "comm",
    kind="card",
    section="notebooks/03_collectives.ipynb, §4 Count the bytes, compare with the closed forms",
    reference="docs/references.md#patarasuk2009",
)
def _c_ring(rng):
    vals = {n: comm.bytes_sent_per_rank("all_reduce", 1e9, n) for n in (2, 8, 64, 1024)}
    return card(
        rng,
        "A ring all-reduce sends more bytes per rank as you add ranks, roughly in proportion to n.",
        "A ring all-reduce sends at most 2S bytes per rank, however many ranks there are.",
        [
            "Bytes per rank for S = 1 GB: "
            + ", ".join(f"n={n}: {v / 1e9:.4g} GB" for n, v in vals.items())
            + " (comm.bytes_sent_per_rank).",
            "Latency (2(n−1)α) grows with n; bandwidth cost does not.",
        ],
        "2(n−1)/n·S.",
    )


@family(
    "cards.mfu_recompute",
    "compute",
    kind="card",
    section="notebooks/11_compute_and_scaling_laws.ipynb, §3 MFU: how much of the peak a training step uses",
    reference="docs/references.md#palm (Chowdhery et al. 2022, Appendix B)",
)
def _c_mfu(rng):
    cfg = memory.preset("llama-2-7b")
    m = flops.flops_per_token(cfg, 4096)
    h = flops.hardware_flops_per_token(cfg, 4096, recompute="full")
    return card(
        rng,
        "Full activation recomputation raises MFU because the GPU does more FLOPs.",
        "Full activation recomputation raises HFU, not MFU: MFU counts only the model's FLOPs.",
        [
            f"llama-2-7b at 4096: model FLOPs/token {m:.4g}, hardware FLOPs/token with full recompute {h:.4g} "
            f"({h / m:.3g}×) (flops.flops_per_token, flops.hardware_flops_per_token)."
        ],
        "Which FLOPs does the M in MFU count?",
    )


@family(
    "cards.gqa_kv",
    "inference",
    kind="card",
    section="notebooks/13_inference_anatomy.ipynb, §2 Why a KV cache, and why it is exact",
    reference="docs/references.md#gqa (arXiv:2305.13245)",
)
def _c_gqa(rng):
    a = inference.kv_bytes_per_token("llama-2-70b")
    cfg = memory.preset("llama-2-70b")
    b = inference.kv_bytes_per_token(cfg.replace(n_kv_heads=cfg.n_heads))
    return card(
        rng,
        "Grouped-query attention shrinks the KV cache by making each head smaller.",
        f"Grouped-query attention shrinks the KV cache by caching fewer KV heads ({cfg.n_kv_heads} instead of "
        f"{cfg.n_heads} for llama-2-70b).",
        [
            f"llama-2-70b: {a:.4g} B/token with GQA vs {b:.4g} B/token with one KV head per query head "
            f"({b / a:g}×, inference.kv_bytes_per_token)."
        ],
        "Compare n_kv_heads with n_heads; head_dim is unchanged.",
    )


PRUNING_CHECK = "50 % pruning: magnitude's loss increase / random's"  # notebook 25's check, as recorded


def recorded_pruning_ratios() -> list[float]:
    """Every recorded run of notebook 25's pruning check: magnitude pruning's held-out loss increase over random
    pruning's at 50 % sparsity (``data/measured/portability.csv``, written by ``benchmarks/portability.py``)."""
    import csv
    from pathlib import Path

    path = Path(__file__).resolve().parents[3] / "data" / "measured" / "portability.csv"
    with path.open(newline="") as f:
        return [float(r["value"]) for r in csv.DictReader(f) if r["notebook"] == "25" and r["check"] == PRUNING_CHECK]


@family(
    "cards.magnitude_pruning",
    "training",
    kind="card",
    section="notebooks/25_data_evaluation_and_compression.ipynb, §6 Compression: pruning and distillation",
    reference="docs/references.md#han2015 (Han et al. 2015, arXiv:1506.02626)",
)
def _c_pruning(rng):
    ratios = recorded_pruning_ratios()
    bound = next(b for b in (0.1, 0.25, 0.5, 1.0) if max(ratios) < b)
    return card(
        rng,
        "Magnitude pruning is no better than random pruning: at 50 % sparsity both remove half the weights, so "
        "the held-out loss rises about as much.",
        f"At 50 % sparsity, magnitude pruning raises the held-out loss by less than {bound:.0%} of what random "
        "pruning of as many weights does.",
        [
            f"Notebook 25, {len(ratios)} recorded runs (seeds × CPU capabilities, data/measured/portability.csv): "
            f"magnitude's loss increase / random's = {min(ratios):.3g} to {max(ratios):.3g}.",
            "Small weights add little to any product; random pruning removes large ones as often as small ones.",
        ],
        "Which weights does each method remove, and what do they contribute?",
    )
