"""Families of the topic ``serving``: decode throughput and batching, paging, prefix sharing,
speculative decoding, static batching, overlap scheduling, GPUs for a throughput target.

Answer keys: ``mlsys_nb.inference`` (``decode_cost``, ``kv_cache_bytes``, ``paged.fragmentation``,
``speculative``, ``metrics.overlap_speedup``); premises drawn through ``bank.inference.fits_on_gpus``.
"""

from __future__ import annotations

from ..core import family
from ._util import gb, inference, inference_metrics, numeric_family, paged, pick, picks, ratio_family, speculative
from .inference import MODELS, REF_ROOF, SEC13, SEC_ROOF, fits_on_gpus, roof_case, times_ms


SEC14 = "notebooks/14_kv_cache_management.ipynb"
SEC_MEASURED = SEC13 + ", §5 Measured on this machine"
REF_ORCA = "docs/references.md#orca (Yu et al. 2022)"
REF_ORCA_VLLM = REF_ORCA + ", #vllm"
SEC_BLOCKS = SEC14 + ", §1 Why blocks: what a contiguous reservation wastes"
REF_VLLM = "docs/references.md#vllm (Kwon et al. 2023, arXiv:2309.06180, §4)"
SEC_PREFIX = SEC14 + ", §4 Prefix caching by hash-chained blocks"
REF_PREFIX = "docs/references.md#sglang (Zheng et al. 2023, arXiv:2312.07104), #vllm"
SEC_STATIC = "notebooks/15_batching_and_scheduling.ipynb, §1 Static vs continuous batching"
REF_STATIC = "docs/references.md#orca (Yu et al. 2022, OSDI, §2.2)"
SEC_OVERLAP = (
    "notebooks/15_batching_and_scheduling.ipynb, §6 Overlap scheduling (a model, fed with the measured phases)"
)
REF_OVERLAP = "docs/references.md#nano-vllm, #sglang"


def _throughput_case(rng) -> dict:
    model, g, batch, ctx = roof_case(rng, batches=(1, 8, 32, 64, 128), contexts=(1024, 4096))
    return {"preset": model, "gpu": g, "batch": batch, "context": ctx}


numeric_family(
    family("serving.decode_throughput", difficulty=2, section=SEC_MEASURED, reference=REF_ORCA_VLLM),
    draw=_throughput_case,
    calc=lambda p: inference.decode_cost(p["preset"], p["gpu"], p["context"], batch=p["batch"]),
    key=lambda c: c.tokens_per_s,
    unit="tokens/s",
    fields=times_ms,
    text=(
        "Continuous batching keeps {batch} sequences decoding on {preset} (bf16), one {gpu}, context ≈ "
        "{context}. Roofline decode throughput (tokens/s, all sequences)?"
    ),
    hints=["One step emits `batch` tokens.", "Step time = max(compute, memory) on the roofline."],
    solution=[
        (
            "Step {step_ms:.4g} ms for {batch} tokens → {result.tokens_per_s:.4g} tokens/s "
            "(inference.decode_cost(...).tokens_per_s)."
        )
    ],
)


def _batching_case(rng):
    model, g, batch, _ = roof_case(rng, batches=(8, 32, 64, 256), contexts=(1024,))
    return {"preset": model, "gpu": g, "batch": batch}


ratio_family(
    family("serving.batching_speedup", difficulty=2, section=SEC_ROOF, reference=REF_ORCA),
    draw=_batching_case,
    calc=lambda p, batch: inference.decode_cost(p["preset"], p["gpu"], 1024, batch=batch).tokens_per_s,
    over=lambda p: dict(batch=p["batch"]),
    under=dict(batch=1),
    text=(
        "{preset} on {gpu}, context 1024: how many times more decode tokens/s at batch {batch} than at batch "
        "1 (roofline)?"
    ),
    hints=[
        "Memory-bound decode reads the weights once per step whatever the batch.",
        "But each sequence adds its own KV-cache reads.",
    ],
    solution=[
        "batch 1: {under:.4g} tok/s; batch {batch}: {over:.4g} tok/s.",
        "Ratio {ratio:.4g} (below {batch} because of the KV reads).",
    ],
    diagnostics=lambda p, many, one, r: [(p["batch"] / r, "not ×batch: the KV-cache reads grow with the batch")],
)


def _paged_case(rng) -> dict:
    bs = pick(rng, [8, 16, 32])
    return {"lengths": [rng.randint(20, 500) for _ in range(pick(rng, [3, 4, 5]))], "block_size": bs}


numeric_family(
    family("serving.paged_utilization", difficulty=2, section=SEC_BLOCKS, reference=REF_VLLM),
    draw=_paged_case,
    calc=lambda p: paged.fragmentation(p["lengths"], block_size=p["block_size"], max_seq_len=512),
    key=lambda r: r["paged_utilization"],
    unit="fraction",
    tolerance=0.005,
    text=(
        "Sequences of {lengths} tokens in a paged KV cache with blocks of {block_size} tokens: what fraction "
        "of the reserved slots hold tokens?"
    ),
    hints=["Each sequence reserves ceil(len / block) blocks.", "Utilization = Σ len / (blocks × block)."],
    solution=[
        (
            "Reserved slots {result[paged_slots]}, tokens {result[tokens]} (inference.paged.fragmentation, a real "
            "BlockManager)."
        ),
        (
            "Utilization {result[paged_utilization]:.4g}; a contiguous max-length allocator: "
            "{result[contiguous_utilization]:.4g}."
        ),
    ],
)


def _shared_tokens(p) -> int:
    """Prefix tokens in whole blocks: only those are shared."""
    return (p["prefix"] // p["block_size"]) * p["block_size"]


numeric_family(
    family("serving.prefix_sharing_savings", difficulty=2, section=SEC_PREFIX, reference=REF_PREFIX),
    draw=lambda rng: picks(rng, preset=MODELS[:6], n=[8, 32, 100], prefix=[500, 1000, 2000], block_size=[16, 32]),
    calc=lambda p: inference.kv_cache_bytes(p["preset"], (p["n"] - 1) * _shared_tokens(p)),
    unit="bytes",
    fields=lambda p, result: {
        "shared": _shared_tokens(p),
        "reused": (p["n"] - 1) * _shared_tokens(p),
        "result_gb": gb(result),
    },
    text=(
        "{n} requests to {preset} share a {prefix}-token system prompt. With block-level prefix caching "
        "(block size {block_size}; only full blocks are shared), how many bytes of bf16 KV cache are saved vs "
        "no sharing?"
    ),
    hints=[
        "The first request computes the prefix; the other n − 1 reuse its full blocks.",
        "Shared tokens per request: floor({prefix}/{block_size}) × {block_size}.",
    ],
    solution=[
        "(n − 1) × {shared} tokens = {reused} tokens.",
        "kv_cache_bytes → {result_gb} saved (inference.kv_cache_bytes).",
    ],
    diagnostics=lambda p, saved: [(p["n"] / (p["n"] - 1), "the first request still stores the prefix once")],
)


SEC_SPEC = "speculative decoding (Leviathan et al. 2023)"
REF_SPEC = "docs/references.md#speculative-leviathan (arXiv:2211.17192"

numeric_family(
    family("serving.speculative_tokens_per_step", difficulty=2, section=SEC_SPEC, reference=REF_SPEC + ", eq. 1)"),
    draw=lambda rng: picks(rng, alpha=[0.5, 0.6, 0.7, 0.8, 0.9], k=[2, 3, 4, 5, 8]),
    calc=lambda p: speculative.expected_tokens_per_step(p["alpha"], p["k"]),
    unit="tokens",
    fields=lambda p, result: {"k1": p["k"] + 1},
    text=(
        "Speculative decoding drafts k = {k} tokens; each is accepted with probability α = {alpha} "
        "(independently). Expected tokens produced per target forward pass?"
    ),
    hints=["Accept i drafted tokens, then the target adds one more.", "(1 − α^(k+1)) / (1 − α)."],
    solution=["Σ_{{i=0..k}} α^i = (1 − {alpha}^{k1}) / (1 − {alpha}) = {result:.4g} tokens."],
    diagnostics=lambda p, e: [
        (p["k"] / e, "not all k drafts are accepted"),
        ((p["k"] + 1) / e, "k + 1 is the maximum"),
    ],
)

numeric_family(
    family("serving.speculative_speedup", difficulty=3, section=SEC_SPEC, reference=REF_SPEC + ", Theorem 3.8)"),
    draw=lambda rng: picks(rng, alpha=[0.6, 0.7, 0.8, 0.9], k=[2, 3, 4, 6], c=[0.02, 0.05, 0.1]),
    calc=lambda p: speculative.expected_speedup(p["alpha"], p["k"], p["c"]),
    unit="ratio",
    fields=lambda p, result: {"tokens": speculative.expected_tokens_per_step(p["alpha"], p["k"])},
    text=(
        "Draft model costs c = {c} of a target forward; k = {k}, α = {alpha}. Expected wall-clock speed-up "
        "over plain decoding?"
    ),
    hints=["Tokens per step (1 − α^(k+1))/(1 − α).", "Cost per step: k drafts (k·c) + 1 target pass."],
    solution=["{tokens:.4g} tokens / ({k} × {c} + 1) = {result:.4g}×."],
)


def static_batch_utilization(lengths) -> float:
    """Static batching: every sequence's slot is held until the longest output finishes; the
    fraction of decode slot-steps doing useful work is Σ len / (n · max len) (Yu et al. 2022, Orca §2)."""
    return sum(lengths) / (len(lengths) * max(lengths))


def _outputs(rng) -> dict:
    """Output lengths of a static batch, not all equal."""
    lengths = [pick(rng, [16, 32, 64, 128, 256, 512]) for _ in range(pick(rng, [4, 8]))]
    if len(set(lengths)) == 1:
        lengths[0] = lengths[0] // 2
    return {"lengths": lengths}


numeric_family(
    family("serving.static_batching_utilization", section=SEC_STATIC, reference=REF_STATIC),
    draw=_outputs,
    calc=lambda p: static_batch_utilization(p["lengths"]),
    unit="fraction",
    fields=lambda p, result: {
        "n": len(p["lengths"]),
        "useful": sum(p["lengths"]),
        "slots": len(p["lengths"]) * max(p["lengths"]),
    },
    text=(
        "Static batching of {n} requests whose outputs are {lengths} tokens long: the batch runs until the "
        "longest finishes. What fraction of the decode slot-steps produce a token? (Continuous batching "
        "refills a finished slot at once.)"
    ),
    hints=["Steps = max length; slots = batch size.", "Useful = Σ lengths."],
    solution=["Σ len = {useful}, n × max = {slots}.", "Utilization {result:.4g}."],
)

numeric_family(
    family("serving.overlap_scheduling_speedup", difficulty=2, section=SEC_OVERLAP, reference=REF_OVERLAP),
    draw=lambda rng: {
        "cpu_s": pick(rng, [0.5, 1.0, 2.0, 3.0, 5.0]) * 1e-3,
        "model_s": pick(rng, [2.0, 4.0, 8.0, 20.0]) * 1e-3,
    },
    calc=lambda p: inference_metrics.overlap_speedup(p["cpu_s"], p["model_s"]),
    unit="ratio",
    fields=lambda p, result: {"cpu_ms": p["cpu_s"] * 1e3, "model_ms": p["model_s"] * 1e3},
    text=(
        "A decode step spends {cpu_ms:g} ms on the CPU (scheduling, sampling, detokenizing) and {model_ms:g} "
        "ms in the model. Overlapping the CPU work of step N+1 with the model of step N: speed-up in steps "
        "per second?"
    ),
    hints=["Serial: cpu + model per step.", "Overlapped: the slower of the two."],
    solution=["({cpu_ms:g} + {model_ms:g}) / max = {result:.4g} (inference.metrics.overlap_speedup)."],
)


@family("serving.gpus_for_target", difficulty=3, section=SEC_ROOF, reference=REF_ROOF + ", #vllm")
def _gpus_for_target(rng):
    for _ in range(1000):
        model, g, _, ctx = roof_case(rng, batches=(1,), contexts=(1024, 4096))
        per_user = pick(rng, [10, 20, 30, 50])  # tokens/s each user must see
        target = pick(rng, [10_000, 50_000, 200_000, 1_000_000])  # tokens/s over all users
        plan = gpus_for_decode_target(model, g, ctx, target, per_user)
        if plan is not None:
            break
    n, batch, step = plan
    return dict(
        text=f"Serve {model} (bf16) on {g}s, one model replica per GPU, every sequence at context ≈ {ctx}. Each user "
        f"must receive at least {per_user} tokens/s and the service must produce {target:,} tokens/s in total "
        f"(decode only, roofline model). Using the largest power-of-two batch per GPU (up to 1024) that meets the "
        f"per-user rate and fits in memory, how many GPUs?",
        params={"preset": model, "gpu": g, "context": ctx, "per_user": per_user, "target": target},
        answer=n,
        unit="count",
        tolerance=0.0,
        hints=[
            "Per-user rate = 1 / decode step time; the step grows with the batch (its KV reads).",
            "GPUs = ceil(target / (batch / step time)).",
        ],
        solution=[
            f"Largest batch meeting {per_user} tokens/s per user and fitting: {batch} (step {step * 1e3:.4g} ms).",
            f"Per GPU {batch / step:.4g} tokens/s → ceil({target:,} / that) = {n} GPUs "
            "(inference.decode_cost, inference.max_concurrent_sequences).",
        ],
    )


def gpus_for_decode_target(model, gpu, context: int, target: float, per_user: float):
    """(GPUs, batch per GPU, step seconds) to decode ``target`` tokens/s in total with every sequence
    seeing >= ``per_user`` tokens/s: the largest power-of-two batch (<= 1024) whose roofline decode
    step is <= 1 / per_user and whose cache fits (``fits_on_gpus``); None if batch 1 is too slow."""
    import math

    best = None
    for b in (2**k for k in range(11)):
        if not fits_on_gpus(model, gpu, batch=b, context=context):
            break
        c = inference.decode_cost(model, gpu, context, batch=b)
        if c.time_s > 1 / per_user:
            break
        best = (b, c.time_s)
    if best is None:
        return None
    b, step = best
    return math.ceil(target / (b / step)), b, step
