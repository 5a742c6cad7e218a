"""Spot-the-error cards: a statement, true or false, drawn (by the seed) either as a common
misconception or as its correction, with the kit's measurement or calculator that settles it.
"""

from __future__ import annotations

from ... import comm, flops, hardware, memory, scaling
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


def card_family(name: str, topic: str, section: str, reference: str):
    """Register a spot-the-error card (``family(..., kind="card")``): ``section`` is the notebook section
    that teaches the correct statement, ``reference`` its entry in docs/references.md."""
    return family(name, topic, kind="card", section=section, reference=reference)


@card_family(
    "cards.zero3_traffic",
    "data_parallel",
    "notebooks/06_zero_and_fsdp.ipynb, §5 ZeRO-3 (FSDP): shard the parameters too",
    "docs/references.md#zero (arXiv:1910.02054, §7.2.2)",
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


@card_family(
    "cards.one_f_one_b_bubble",
    "pipeline",
    "notebooks/08_pipeline_parallelism.ipynb, §4 1F1B and activation memory",
    "docs/references.md#pipedream-flush (arXiv:2006.09503)",
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


@card_family(
    "cards.adam_bytes_per_param",
    "memory",
    "notebooks/10_training_memory.ipynb, §1 Model states: parameters, gradients, optimizer, master weights",
    "docs/references.md#zero (arXiv:1910.02054, §3.1), #mixed-precision",
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


@card_family(
    "cards.twenty_tokens_per_param",
    "scaling",
    "notebooks/11_compute_and_scaling_laws.ipynb, §5 Scaling laws and compute-optimal allocation",
    "docs/references.md#chinchilla, #epoch-chinchilla",
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


@card_family(
    "cards.sp_traffic",
    "tensor",
    "notebooks/07_tensor_parallelism.ipynb, §5 Sequence parallelism",
    "docs/references.md#megatron-sp (arXiv:2205.05198, §4.2.2)",
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


@card_family(
    "cards.decode_bound",
    "inference",
    "notebooks/13_inference_anatomy.ipynb, §4 Prefill and decode on the roofline",
    "docs/references.md#roofline, #scaling-book",
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


@card_family(
    "cards.ring_bytes_grow",
    "comm",
    "notebooks/03_collectives.ipynb, §4 Count the bytes, compare with the closed forms",
    "docs/references.md#patarasuk2009",
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


@card_family(
    "cards.mfu_recompute",
    "compute",
    "notebooks/11_compute_and_scaling_laws.ipynb, §3 MFU: how much of the peak a training step uses",
    "docs/references.md#palm (Chowdhery et al. 2022, Appendix B)",
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


@card_family(
    "cards.gqa_kv",
    "inference",
    "notebooks/13_inference_anatomy.ipynb, §2 Why a KV cache, and why it is exact",
    "docs/references.md#gqa (arXiv:2305.13245)",
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


@card_family(
    "cards.magnitude_pruning",
    "training",
    "notebooks/25_data_evaluation_and_compression.ipynb, §6 Compression: pruning and distillation",
    "docs/references.md#han2015 (Han et al. 2015, arXiv:1506.02626)",
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


@card_family(
    "cards.optimizer_state_units",
    "memory",
    "notebooks/10_training_memory.ipynb, §1 Model states: parameters, gradients, optimizer, master weights",
    "docs/references.md#playbook, #zero (arXiv:1910.02054, §3.1)",
)
def _c_opt_units(rng):
    h = pick(rng, [4096, 8192])
    s = memory.model_state_bytes(h * h)
    return card(
        rng,
        f"For one {h}×{h} weight matrix, Adam's momentum and variance (2·h²) plus the fp32 master weights (h²) "
        f"take 6·h² = {6 * h * h / 1e6:.4g} MB.",
        f"For one {h}×{h} weight matrix, Adam's momentum and variance plus the fp32 master weights are 3·h² fp32 "
        f"values: 12·h² = {(s.optimizer + s.master) / 1e6:.4g} MB.",
        [
            f"memory.model_state_bytes({h}²): moments {s.optimizer:,.0f} B + master {s.master:,.0f} B "
            f"= {(s.optimizer + s.master) / (h * h):g} B per element.",
            "2·h² and h² count values; each fp32 value is 4 bytes: the 6 mixes values with bytes.",
        ],
        "How many bytes is one fp32 value?",
        params={"h": h},
    )


@card_family(
    "cards.zero_stage_named",
    "data_parallel",
    "notebooks/06_zero_and_fsdp.ipynb, §3 ZeRO-1: shard the optimizer states",
    "docs/references.md#zero (arXiv:1910.02054, §5)",
)
def _c_zero_named(rng):
    dp = pick(rng, [8, 16, 32])
    z1, z3 = (memory.model_state_bytes(70e9, dp=dp, zero=z).total / 1e9 for z in (1, 3))
    return card(
        rng,
        f"A memory calculator that divides only the optimizer states by the DP degree ({dp}) models ZeRO-3: "
        f"{z1:.4g} GB per GPU for a 70B model.",
        f"A memory calculator that divides only the optimizer states by the DP degree ({dp}) models ZeRO-1: "
        f"{z1:.4g} GB per GPU for a 70B model; ZeRO-3 divides the parameters and gradients too: {z3:.4g} GB.",
        [
            f"memory.model_state_bytes(70e9, dp={dp}, zero=1) = {z1:.4g} GB, zero=3: {z3:.4g} GB "
            "(16 B per parameter, mixed-precision Adam).",
            "ZeRO-1 shards optimizer states, ZeRO-2 adds gradients, ZeRO-3 adds parameters.",
        ],
        "Which copies does each ZeRO stage shard?",
        params={"dp": dp},
    )


@card_family(
    "cards.network_vs_nvme",
    "comm",
    "notebooks/04_communication_cost.ipynb, §6 What changes on NVLink and InfiniBand",
    "docs/references.md#nvidia-datasheets, #interconnects",
)
def _c_network_nvme(rng):
    nic = hardware.link(pick(rng, ["infiniband-ndr", "infiniband-hdr"]))
    x4 = {g: hardware.link(f"pcie{g}-x16").per_direction_bytes_per_s / 4 / 1e9 for g in (4, 5)}
    gbit = nic.per_direction_bytes_per_s * 8 / 1e9
    return card(
        rng,
        f"Bandwidth only falls down the memory hierarchy: the network (one {gbit:g} Gb/s NIC) is the slowest "
        "level, below a local NVMe SSD.",
        f"One {gbit:g} Gb/s NIC moves {nic.per_direction_bytes_per_s / 1e9:g} GB/s, more than an NVMe SSD on a "
        f"PCIe x4 link can ({x4[4]:g} GB/s on PCIe 4.0, {x4[5]:g} on 5.0): by bandwidth the network is not the "
        "slowest level.",
        [
            f"hardware.link('{nic.name}'): {nic.per_direction_bytes_per_s / 1e9:g} GB/s per direction; an NVMe "
            f"drive has 4 PCIe lanes: hardware.link('pcie4-x16') ÷ 4 = {x4[4]:g} GB/s.",
            "Order the levels by bandwidth, or call the network the slowest in latency; not both at once.",
        ],
        "Gb/s ÷ 8; how many lanes does an NVMe drive use?",
        params={"nic": nic.name},
    )


@card_family(
    "cards.moe_tokens_rule",
    "expert_context",
    "notebooks/09_experts_and_context.ipynb, §7 What EP and CP divide in memory",
    "docs/references.md#chinchilla, #mixtral (arXiv:2401.04088)",
)
def _c_moe_tokens(rng):
    model = "mixtral-8x7b"
    pc = memory.param_count(memory.preset(model))
    return card(
        rng,
        f"A compute-optimal {model} trains on 20 tokens per active parameter ({20 * pc.active / 1e12:.3g}T "
        "tokens): Chinchilla's rule carries over to MoE.",
        f"Chinchilla's ~20 tokens per parameter was fitted on dense models: for {model} it gives "
        f"{20 * pc.active / 1e12:.3g}T tokens on the active and {20 * pc.total / 1e12:.3g}T on the total "
        f"parameters, {pc.total / pc.active:.3g}× apart, and no cited law picks one.",
        [
            f"memory.param_count(preset('{model}')): total {pc.total / 1e9:.4g}B, active {pc.active / 1e9:.4g}B.",
            "MoE scaling laws fit the loss on both the total and the active parameters; a dense rule names neither.",
        ],
        "For a dense model total = active. And here?",
    )
