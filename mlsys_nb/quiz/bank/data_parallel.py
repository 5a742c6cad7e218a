"""Families of the topic ``data_parallel``: DDP and ZeRO traffic per step, the gradient all-reduce,
bucketing.

Answer keys: ``parallel.zero.zero_bytes_per_step`` (from ``comm.bytes_sent_per_rank``),
``comm.collective_time``, and ``parallel.data``'s sampler shards, batch recipe and critical-batch model.
"""

from __future__ import annotations

from ... import comm
from ...parallel import data as pdata
from ..core import family
from ._util import MB, gbps, numeric_family, pick, picks, ratio_family, us, zero
from .comm import REF_COMM, draw_link


REF_ZERO = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §7), #pytorch-ddp"
SEC_ZERO = "notebooks/06_zero_and_fsdp.ipynb, §5 ZeRO-3 (FSDP): shard the parameters too"
SEC_DDP = "notebooks/05_data_parallelism.ipynb, §2 Naive DDP: one all-reduce per parameter"
SEC_BUCKETS = "notebooks/05_data_parallelism.ipynb, §3 Bucketing: fewer, larger messages"


def _one_phase(p) -> float:
    """Bytes one rank sends in one ring phase (reduce-scatter or all-gather) of the bf16 parameters."""
    return comm.bytes_sent_per_rank("all_gather", 2 * p["n_params"], p["n"])


def _zero3_diagnostic(p, b) -> tuple[float, str]:
    if p["zero"] == 3:
        return 2 / 3, "stage 3 adds the backward all-gather: 3 collectives"
    three = zero.zero_bytes_per_step(p["n_params"], p["n"], 3)
    return three / b, "ZeRO-1/2 move the same bytes as DDP; only stage 3 adds a parameter all-gather"


numeric_family(
    family("data_parallel.ddp_bytes_per_step", section=SEC_DDP, reference=REF_ZERO),
    draw=lambda rng: picks(rng, n_params=[125e6, 350e6, 1.3e9, 7e9], n=[2, 4, 8, 16, 64]),
    calc=lambda p: zero.zero_bytes_per_step(p["n_params"], p["n"], 0),
    unit="bytes",
    fields=lambda p, result: {"grad_bytes": 2 * p["n_params"]},
    text=(
        "DDP over {n} ranks, {n_params:.3g} parameters, bf16 gradients, ring all-reduce: bytes each rank "
        "sends per step?"
    ),
    hints=["Gradient bytes S = 2·N.", "Ring all-reduce sends 2(n−1)/n·S per rank."],
    solution=[
        "S = 2 × {n_params:.4g} = {grad_bytes:.4g} B.",
        "2(n−1)/n·S = {result:.4g} B (comm.bytes_sent_per_rank).",
    ],
    diagnostics=[
        (0.5, "did you count only the reduce-scatter half of the all-reduce?"),
        (2.0, "gradients are bf16 (2 B), not fp32"),
    ],
)

numeric_family(
    family("data_parallel.zero_bytes_per_step", difficulty=2, section=SEC_ZERO, reference=REF_ZERO),
    draw=lambda rng: picks(rng, n_params=[1.3e9, 7e9, 13e9, 70e9], n=[8, 16, 64, 256], zero=[1, 2, 3]),
    calc=lambda p: zero.zero_bytes_per_step(p["n_params"], p["n"], p["zero"]),
    unit="bytes",
    fields=lambda p, result: {"phase": _one_phase(p), "collectives": 2 if p["zero"] < 3 else 3},
    text=(
        "ZeRO stage {zero} over {n} ranks, {n_params:.3g} bf16 parameters and gradients, ring collectives: "
        "bytes each rank sends per training step?"
    ),
    hints=[
        "Stages 1-2: reduce-scatter the gradients, all-gather the updated parameters.",
        "Stage 3 gathers the parameters twice (forward and backward): 3 × (n−1)/n × 2N.",
    ],
    solution=[
        "Each collective sends (n−1)/n × 2N = {phase:.4g} B.",
        "Stage {zero}: {collectives} collectives = {result:.4g} B.",
    ],
    diagnostics=lambda p, b: [_zero3_diagnostic(p, b)],
)


ratio_family(
    family("data_parallel.zero3_vs_ddp_traffic", section=SEC_ZERO, reference=REF_ZERO),
    draw=lambda rng: picks(rng, n=[4, 8, 16, 64, 512], n_params=[1e9, 7e9, 70e9]),
    calc=lambda p, stage: zero.zero_bytes_per_step(p["n_params"], p["n"], stage),
    over=dict(stage=3),
    under=dict(stage=0),
    text=(
        "By what factor does ZeRO-3 multiply the bytes per rank per step compared with DDP (n = {n} ranks, "
        "ring collectives)?"
    ),
    hints=["DDP: reduce-scatter + all-gather of the gradients.", "ZeRO-3: one more all-gather."],
    solution=["DDP: 2 × (n−1)/n × S; ZeRO-3: 3 × (n−1)/n × S.", "Ratio = {ratio:.3g}."],
    diagnostics=[(2.0, "3× is the common misconception: DDP's all-reduce is already two phases")],
)


def _ddp_link_case(rng) -> dict:
    p = {"n_params": pick(rng, [125e6, 1.3e9, 7e9, 13e9]), "n": pick(rng, [8, 16, 64, 256])}
    p["alpha"], p["beta"] = draw_link(rng)
    return p


numeric_family(
    family("data_parallel.grad_allreduce_time", section=SEC_DDP, reference=REF_ZERO + ", " + REF_COMM),
    draw=_ddp_link_case,
    calc=lambda p: comm.collective_time("all_reduce", 2 * p["n_params"], p["n"], p["alpha"], p["beta"], "ring"),
    unit="seconds",
    fields=lambda p, result: {
        "alpha_us": us(p["alpha"]),
        "beta_gbps": gbps(p["beta"]),
        "grad_bytes": 2 * p["n_params"],
    },
    text=(
        "DDP over {n} ranks: one ring all-reduce of the bf16 gradients of {n_params:.3g} parameters, α = "
        "{alpha_us}, β = {beta_gbps}. Seconds (nothing overlapped)?"
    ),
    hints=["S = 2N bytes.", "T = 2(n−1)α + 2(n−1)/n·S/β."],
    solution=["S = {grad_bytes:.4g} B; T = {result:.4g} s (comm.collective_time)."],
    diagnostics=[(0.5, "a ring all-reduce moves 2(n−1)/n·S, not (n−1)/n·S")],
)


def _bucket_case(rng):
    return {
        "tensors": pick(rng, [100, 300, 1000]),
        "bytes": pick(rng, [100, 500, 1000]) * MB,
        "bucket": pick(rng, [25, 50]) * MB,
        "n": pick(rng, [8, 32, 128]),
        "alpha": pick(rng, [10e-6, 20e-6, 50e-6]),
        "beta": pick(rng, [12.5e9, 25e9, 50e9]),
    }


def _all_reduce_in_pieces(p, pieces: int) -> float:
    """Seconds of ``pieces`` ring all-reduces of S / pieces bytes each (``comm.collective_time``)."""
    return pieces * comm.collective_time("all_reduce", p["bytes"] / pieces, p["n"], p["alpha"], p["beta"])


def _n_buckets(p) -> int:
    return -(-int(p["bytes"]) // int(p["bucket"]))


ratio_family(
    family("data_parallel.bucketing_speedup", difficulty=2, section=SEC_BUCKETS, reference=REF_ZERO),
    draw=_bucket_case,
    calc=_all_reduce_in_pieces,
    over=lambda p: dict(pieces=p["tensors"]),
    under=lambda p: dict(pieces=_n_buckets(p)),
    fields=lambda p, over, under, ratio: {
        "mb": p["bytes"] / MB,
        "alpha_us": us(p["alpha"]),
        "beta_gbps": gbps(p["beta"]),
        "bucket_mb": p["bucket"] / MB,
        "over_ms": over * 1e3,
        "n_buckets": _n_buckets(p),
        "under_ms": under * 1e3,
    },
    text=(
        "{mb:g} MB of gradients in {tensors} equal tensors, {n} ranks, α = {alpha_us}, β = {beta_gbps}: how "
        "many times faster is all-reducing them in ⌈S/{bucket_mb:g} MB⌉ equal buckets than one ring "
        "all-reduce per tensor?"
    ),
    hints=[
        "The bandwidth term is the same: only the number of messages changes.",
        "Each all-reduce costs 2(n−1)α in latency.",
    ],
    solution=[
        (
            "per tensor: {tensors} × ... = {over_ms:.4g} ms; {n_buckets} buckets: {under_ms:.4g} ms "
            "(comm.collective_time)."
        ),
        "Speed-up {ratio:.4g}×.",
    ],
)


# ---- notebook 05 §8-9: per-rank data and the batch-size recipe (answer keys: parallel.data) ----------
SEC_SAMPLER = "notebooks/05_data_parallelism.ipynb, §8 Per-rank data loading: DistributedSampler"
SEC_RECIPE = "notebooks/05_data_parallelism.ipynb, §9 The batch-size recipe"
REF_SAMPLER = "docs/references.md#pytorch-ddp, #pytorch-distributed (torch.utils.data.DistributedSampler)"
REF_RECIPE = "docs/references.md#megatron-ptdp (global batch = DP × accumulation × micro-batch), #llama3"
REF_CRITICAL = "docs/references.md#critical-batch (McCandlish et al. 2018, arXiv:1812.06162)"
DATASETS = [999, 4_097, 10_007, 50_001]  # odd sizes; per rank < 10^4, so the printed 4-digit key is exact


def _sampler_case(rng) -> dict:
    return picks(rng, n=DATASETS, world=[6, 8, 16, 24, 64], drop_last=[False, True])


def _per_rank(p) -> int:
    """Samples each rank reads per epoch (``parallel.data.samples_per_rank``)."""
    return pdata.samples_per_rank(p["n"], p["world"], p["drop_last"])


def _drop_words(p) -> dict:
    """How the words name the drop_last setting, and the rule it gives the per-rank count by."""
    if p["drop_last"]:
        return {"drop": "drop_last=True", "rule": "⌊N/W⌋"}
    return {"drop": "drop_last=False (the default)", "rule": "⌈N/W⌉"}


numeric_family(
    family("data_parallel.samples_per_rank", section=SEC_SAMPLER, reference=REF_SAMPLER),
    draw=_sampler_case,
    calc=_per_rank,
    unit="count",
    tolerance=0.0,
    fields=lambda p, result: _drop_words(p),
    text=(
        "DistributedSampler over a dataset of {n} samples on W = {world} ranks, {drop}: how many samples "
        "does each rank read per epoch?"
    ),
    hints=["Every rank reads the same number of samples.", "Without drop_last the tail is padded up; with it, cut."],
    solution=["{rule} = {result} samples per rank (parallel.data.samples_per_rank)."],
)

numeric_family(
    family("data_parallel.sampler_padding", section=SEC_SAMPLER, reference=REF_SAMPLER),
    draw=_sampler_case,
    calc=lambda p: abs(p["world"] * _per_rank(p) - p["n"]),
    unit="count",
    tolerance=0.0,
    fields=lambda p, result: {
        **_drop_words(p),
        "what": "read by no rank (dropped)" if p["drop_last"] else "read twice (the padding repeats)",
        "per_rank": _per_rank(p),
        "covered": p["world"] * _per_rank(p),
    },
    text=("DistributedSampler over {n} samples on W = {world} ranks, {drop}: how many samples per epoch are {what}?"),
    hints=[
        "Each rank reads ⌈N/W⌉ samples (⌊N/W⌋ with drop_last).",
        "Compare W × samples per rank with N.",
    ],
    solution=["W × {rule} = {world} × {per_rank} = {covered} vs N = {n}: {result} sample(s) {what}."],
)


def _recipe_case(rng) -> dict:
    p = picks(rng, dp=[8, 16, 32, 64, 128], micro_batch=[1, 2, 4], accumulation=[1, 2, 4, 8, 16])
    p["seq_len"] = pick(rng, [2048, 4096, 8192])
    p["tokens"] = p["dp"] * p["micro_batch"] * p["accumulation"] * p["seq_len"]
    return p


numeric_family(
    family("data_parallel.accumulation_steps", section=SEC_RECIPE, reference=REF_RECIPE),
    draw=_recipe_case,
    calc=lambda p: pdata.decompose_batch(p["tokens"] // p["seq_len"], p["dp"], p["micro_batch"], p["seq_len"]),
    key=lambda recipe: recipe.accumulation,
    params=("tokens", "seq_len", "dp", "micro_batch"),
    unit="micro-batches",
    tolerance=0.0,
    fields=lambda p, result: {"sequences": result.global_batch},
    text=(
        "A global batch of {tokens:,} tokens per optimizer step in sequences of {seq_len} tokens, on {dp} "
        "data-parallel ranks with micro-batches of {micro_batch} sequences: how many micro-batches does each "
        "rank accumulate per step?"
    ),
    hints=["Global batch (sequences) = tokens / seq_len.", "global batch = DP × accumulation × micro-batch."],
    solution=[
        "{tokens:,} / {seq_len} = {sequences} sequences.",
        "accumulation = {sequences} / ({dp} × {micro_batch}) = {result.accumulation} (parallel.data.decompose_batch).",
    ],
    diagnostics=lambda p, r: [(p["seq_len"], "the global batch was given in tokens: divide by seq_len first")],
)

numeric_family(
    family("data_parallel.tokens_per_step", section=SEC_RECIPE, reference=REF_RECIPE),
    draw=_recipe_case,
    calc=lambda p: pdata.BatchRecipe(p["dp"], p["accumulation"], p["micro_batch"], p["seq_len"]),
    key=lambda recipe: recipe.tokens,
    params=("dp", "accumulation", "micro_batch", "seq_len"),
    unit="tokens",
    text=(
        "{dp} data-parallel ranks, each accumulating {accumulation} micro-batches of {micro_batch} sequence(s) of "
        "{seq_len} tokens per optimizer step: tokens per step?"
    ),
    hints=["Sequences per step = DP × accumulation × micro-batch.", "Times the sequence length."],
    solution=[
        "{dp} × {accumulation} × {micro_batch} = {result.global_batch} sequences.",
        "× {seq_len} = {result.tokens:,} tokens (parallel.data.BatchRecipe.tokens).",
    ],
    diagnostics=lambda p, r: [(1 / p["dp"], "that is one rank's share: all DP replicas add to the step")],
)


def _critical_case(rng) -> dict:
    p = picks(rng, noise_scale=[0.25e6, 1e6, 4e6], factor=[0.25, 0.5, 1, 2, 4, 8], ask=["steps", "tokens"])
    p["batch"] = p["factor"] * p["noise_scale"]
    return p


numeric_family(
    family("data_parallel.critical_batch_cost", difficulty=2, section=SEC_RECIPE, reference=REF_CRITICAL),
    draw=_critical_case,
    calc=lambda p: pdata.critical_batch_tradeoff(p["batch"], p["noise_scale"])[p["ask"] == "tokens"],
    params=("batch", "noise_scale", "ask"),
    unit="ratio",
    diagnostics=lambda p, r: [(1 / (r - 1), "that is the other cost: steps and tokens trade off")] * (r != 2),
    fields=lambda p, r: dict(
        zip(("steps", "tokens"), pdata.critical_batch_tradeoff(p["batch"], p["noise_scale"])),
        mins="S_min" if p["ask"] == "steps" else "E_min",
    ),
    text=(
        "McCandlish et al.'s model, gradient noise scale B_noise = {noise_scale:.3g} tokens, batch B = "
        "{batch:.3g} tokens: how many times the fewest possible {ask} ({mins}) does training to a given loss "
        "take?"
    ),
    hints=[
        "Steps: S/S_min = 1 + B_noise/B.",
        "Data: E/E_min = 1 + B/B_noise (E in tokens here); both are 2 at B = B_noise.",
    ],
    solution=[
        "S/S_min = {steps:.4g}, E/E_min = {tokens:.4g} (parallel.data.critical_batch_tradeoff).",
        "Asked: {ask}, {result:.4g}× the fewest.",
    ],
)
