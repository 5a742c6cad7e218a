"""Families on inference and serving: KV cache, concurrency, roofline prefill/decode, paging,
prefix sharing, batching throughput, speculative decoding.

Answer keys: ``mlsys_nb.inference`` (``kv_cache_bytes``, ``kv_bytes_per_token``, ``weight_bytes``,
``max_concurrent_sequences``, ``prefill_cost``/``decode_cost``, ``paged.fragmentation``). The
speculative-decoding family uses the textbook closed form (the serving engine's calculator had not
landed): expected tokens per verification = (1 − α^(k+1)) / (1 − α), Leviathan et al. 2023, eq. 1.
"""

from __future__ import annotations

from ... import hardware, inference
from ...config import DTYPE_BYTES
from ..core import family
from ._util import gb, pick

SEC13 = "notebooks/13_inference_anatomy.ipynb"
SEC14 = "notebooks/14_kv_cache_management.ipynb"
REF_KV = "docs/references.md#gqa (Ainslie et al. 2023, arXiv:2305.13245), #vllm"
REF_ROOF = "docs/references.md#roofline (Williams et al. 2009), #scaling-book"
MODELS = [
    "llama-2-7b",
    "llama-2-13b",
    "llama-2-70b",
    "llama-3-8b",
    "llama-3-70b",
    "llama-3.1-405b",
    "mixtral-8x7b",
    "llama-3.2-1b",
    "llama-3.2-3b",
]
GPUS = ["H100-SXM", "A100-80GB-SXM", "H200-SXM", "L4"]


def _shape(model):
    from ...memory import preset

    c = preset(model)
    return c, f"{c.n_layers} layers, {c.n_heads} query heads, {c.n_kv_heads} KV heads of dim {c.head_dim}"


@family(
    "inference.kv_cache_bytes",
    "inference",
    section=SEC13 + ", §2 Why a KV cache, and why it is exact",
    reference=REF_KV,
)
def _kv(rng):
    model = pick(rng, MODELS)
    tokens = pick(rng, [1024, 4096, 8192, 32768, 128000, 1_000_000])
    dtype = pick(rng, ["bf16", "fp8", "fp32", "int8"])
    b = inference.kv_cache_bytes(model, tokens, dtype)
    c, shape = _shape(model)
    return dict(
        text=f"{model} ({shape}) caches {tokens} tokens in {dtype}. KV-cache bytes?",
        params={"preset": model, "tokens": tokens, "dtype": dtype},
        answer=b,
        unit="bytes",
        hints=[
            "Per token per layer: K and V, each n_kv_heads × head_dim elements.",
            f"2 × L × n_kv × d × {DTYPE_BYTES[dtype]} B × tokens.",
        ],
        solution=[
            f"Per token: 2 × {c.n_layers} × {c.n_kv_heads} × {c.head_dim} × {DTYPE_BYTES[dtype]} = "
            f"{inference.kv_bytes_per_token(model, dtype):.6g} B.",
            f"× {tokens} tokens = {gb(b)} (inference.kv_cache_bytes).",
        ],
        diagnostics=[(0.5, "off by a factor 2: did you count K and V?")]
        + (
            [(c.n_heads / c.n_kv_heads, "you used the query heads: GQA caches only n_kv_heads")]
            if c.n_heads != c.n_kv_heads
            else []
        ),
    )


@family(
    "inference.kv_bytes_per_token",
    "inference",
    section=SEC13 + ", §2 Why a KV cache, and why it is exact",
    reference=REF_KV,
)
def _kvt(rng):
    model = pick(rng, MODELS + ["deepseek-v3"])
    b = inference.kv_bytes_per_token(model, "bf16")
    from ...memory import preset

    c = preset(model)
    mla = bool(c.kv_lora_rank)
    return dict(
        text=f"KV-cache bytes per token (all layers, bf16) of {model}"
        + (
            f" (MLA: latent {c.kv_lora_rank} + RoPE key {c.rope_head_dim} per layer, {c.n_layers} layers)?"
            if mla
            else f" ({_shape(model)[1]})?"
        ),
        params={"preset": model, "dtype": "bf16"},
        answer=b,
        unit="bytes",
        hints=["MHA/GQA: 2·L·n_kv·d·bytes.", "MLA (DeepSeek): (kv_lora_rank + rope_head_dim)·L·bytes."],
        solution=[f"{b:.6g} B per token (inference.kv_bytes_per_token)."],
        diagnostics=[(0.5, "off by a factor 2: did you count K and V?")] if not mla else [],
    )


@family("inference.weight_bytes", "inference", section=SEC13 + ", §3 Sizing the cache of real models", reference=REF_KV)
def _wb(rng):
    model = pick(rng, MODELS)
    dtype = pick(rng, ["bf16", "fp8", "int4"])
    b = inference.weight_bytes(model, dtype)
    from ...memory import param_count, preset

    n = int(param_count(preset(model)))
    return dict(
        text=f"{model} has {n:,} parameters. Bytes of weights in {dtype}?",
        params={"preset": model, "dtype": dtype},
        answer=b,
        unit="bytes",
        hints=[f"{dtype} is {DTYPE_BYTES[dtype]} B per parameter."],
        solution=[f"{n:,} × {DTYPE_BYTES[dtype]} = {gb(b)} (inference.weight_bytes)."],
    )


@family(
    "inference.max_concurrent_sequences",
    "inference",
    difficulty=2,
    section=SEC13 + ", §3 Sizing the cache of real models",
    reference=REF_KV,
)
def _conc(rng):
    for _ in range(100):
        model = pick(rng, MODELS[:6])
        g = pick(rng, GPUS[:3])
        tp = pick(rng, [1, 2, 4, 8])
        seq = pick(rng, [2048, 4096, 8192, 32768])
        if fits_on_gpus(model, g, batch=1, context=seq, tp=tp):  # the shared physical check
            break
    n = inference.max_concurrent_sequences(model, g, seq, tp=tp, gpu_memory_utilization=USABLE)
    gpu = hardware.gpu(g)
    return dict(
        text=f"Serving {model} (bf16 weights and KV) with TP = {tp} on {g} ({gb(gpu.memory_bytes)}), 90 % of "
        f"memory usable: how many full {seq}-token sequences fit?",
        params={"preset": model, "gpu": g, "tp": tp, "seq_len": seq},
        answer=n,
        unit="count",
        tolerance=0.0,
        hints=[
            "Budget per GPU = 0.9 × memory − weights / tp.",
            "Each sequence needs kv_cache_bytes(seq) / tp (TP splits the KV heads). Round down.",
        ],
        solution=[
            f"Weights per GPU {gb(inference.weight_bytes(model) / tp)}; KV per sequence per GPU "
            f"{gb(inference.kv_cache_bytes(model, seq) / min(tp, _shape(model)[0].n_kv_heads))}.",
            f"{n} sequences (inference.max_concurrent_sequences).",
        ],
    )


USABLE = 0.9  # share of GPU memory given to weights + KV cache (vLLM's default gpu_memory_utilization)


def fits_on_gpus(model, gpu, *, batch: int, context: int, tp: int = 1) -> bool:
    """The one physical check of every inference family: do the bf16 weights (split over ``tp``
    GPUs) and the bf16 KV cache of ``batch`` sequences of ``context`` tokens fit in ``USABLE`` of
    each GPU's memory? (``inference.max_concurrent_sequences`` >= batch; a model, no activations.)"""
    return inference.max_concurrent_sequences(model, gpu, context, tp=tp, gpu_memory_utilization=USABLE) >= batch


TPS = (1, 2, 4, 8)


def min_tp(model, gpu, *, batch: int, context: int) -> int | None:
    """Smallest tensor-parallel degree in ``TPS`` (one node) at which ``fits_on_gpus``; None if none."""
    return next((tp for tp in TPS if fits_on_gpus(model, gpu, batch=batch, context=context, tp=tp)), None)


def _roof_case(rng, batches=(1, 8, 32, 128), contexts=(2048,)):
    """(model, gpu, batch, context) drawn until the premise is physical: it fits on ONE GPU."""
    for _ in range(1000):
        model, g, batch, ctx = pick(rng, MODELS[:6]), pick(rng, GPUS), pick(rng, batches), pick(rng, contexts)
        if fits_on_gpus(model, g, batch=batch, context=ctx):
            return model, g, batch, ctx
    raise RuntimeError("no premise fits on one GPU")  # pragma: no cover


@family(
    "inference.decode_step_time",
    "inference",
    difficulty=2,
    section=SEC13 + ", §4 Prefill and decode on the roofline",
    reference=REF_ROOF,
)
def _decode(rng):
    model, g, batch, ctx = _roof_case(rng, contexts=(512, 2048, 8192))
    c = inference.decode_cost(model, g, ctx, batch=batch)
    return dict(
        text=f"Roofline model: one decode step of {model} (bf16) on one {g} (weights and cache fit), batch {batch}, "
        f"each sequence at context {ctx}: time of the step (max of compute and memory time, 100 % of peak)?",
        params={"preset": model, "gpu": g, "batch": batch, "context": ctx},
        answer=c.time_s,
        unit="seconds",
        hints=[
            "Bytes: all weights once + every sequence's KV cache.",
            "FLOPs: 2 × matmul params × batch + attention. Take the slower of FLOPs/peak and bytes/bandwidth.",
        ],
        solution=[
            f"FLOPs {c.flops:.4g} → {c.compute_time_s * 1e3:.4g} ms; bytes {c.bytes:.4g} → "
            f"{c.memory_time_s * 1e3:.4g} ms.",
            f"{c.bound}-bound: {c.time_s * 1e3:.4g} ms (inference.decode_cost).",
        ],
    )


@family(
    "inference.prefill_time",
    "inference",
    difficulty=2,
    section=SEC13 + ", §4 Prefill and decode on the roofline",
    reference=REF_ROOF,
)
def _prefill(rng):
    model, g, batch, n = _roof_case(rng, contexts=(512, 2048, 8192))
    c = inference.prefill_cost(model, g, n, batch=batch)
    return dict(
        text=f"Roofline model: prefill of {batch} prompt(s) of {n} tokens on {model} (bf16), one {g} (weights and "
        f"cache fit): time?",
        params={"preset": model, "gpu": g, "batch": batch, "prompt_len": n},
        answer=c.time_s,
        unit="seconds",
        hints=[
            "Prefill is usually compute-bound: ≈ 2·N_matmul·tokens / peak (+ attention).",
            "Check against the memory time (weights + KV written).",
        ],
        solution=[
            f"compute {c.compute_time_s * 1e3:.4g} ms, memory {c.memory_time_s * 1e3:.4g} ms → "
            f"{c.bound}-bound, {c.time_s * 1e3:.4g} ms (inference.prefill_cost)."
        ],
    )


@family(
    "inference.decode_bound",
    "inference",
    kind="choice",
    section=SEC13 + ", §4 Prefill and decode on the roofline",
    reference=REF_ROOF,
)
def _bound(rng):
    model, g, batch, _ = _roof_case(rng, batches=(1, 4, 64, 256, 1024), contexts=(1024,))
    c = inference.decode_cost(model, g, 1024, batch=batch)
    return dict(
        text=f"Decode step of {model} on {g} at batch {batch}, context 1024: compute- or memory-bound (roofline)?",
        params={"preset": model, "gpu": g, "batch": batch},
        answer=c.bound,
        choices=["compute", "memory"],
        hints=[
            "Arithmetic intensity ≈ 2·batch FLOPs per weight (2 B) read ≈ batch FLOP/B.",
            f"Ridge of {g}: {c.ridge_flop_per_byte:.4g} FLOP/B.",
        ],
        solution=[
            f"Intensity {c.intensity_flop_per_byte:.4g} FLOP/B vs ridge {c.ridge_flop_per_byte:.4g}: "
            f"{c.bound}-bound (inference.decode_cost)."
        ],
    )


@family(
    "inference.ridge_point", "inference", section=SEC13 + ", §4 Prefill and decode on the roofline", reference=REF_ROOF
)
def _ridge(rng):
    g = pick(rng, GPUS)
    c = inference.decode_cost("llama-2-7b", g, 16)
    return dict(
        text=f"{g}: bf16 peak {hardware.gpu(g).peak('bf16') / 1e12:.4g} TFLOP/s, HBM "
        f"{hardware.gpu(g).hbm_bandwidth_bytes_per_s / 1e12:.4g} TB/s. Ridge point (FLOP per byte)?",
        params={"gpu": g},
        answer=c.ridge_flop_per_byte,
        unit="ratio",
        hints=["Ridge = peak FLOP/s / bandwidth B/s."],
        solution=[f"{c.ridge_flop_per_byte:.4g} FLOP/B (StepCost.ridge_flop_per_byte)."],
    )


@family(
    "serving.decode_throughput",
    "serving",
    difficulty=2,
    section=SEC13 + ", §5 Measured on this machine",
    reference="docs/references.md#orca (Yu et al. 2022), #vllm",
)
def _tput(rng):
    model, g, batch, ctx = _roof_case(rng, batches=(1, 8, 32, 64, 128), contexts=(1024, 4096))
    c = inference.decode_cost(model, g, ctx, batch=batch)
    return dict(
        text=f"Continuous batching keeps {batch} sequences decoding on {model} (bf16), one {g}, context ≈ "
        f"{ctx}. Roofline decode throughput (tokens/s, all sequences)?",
        params={"preset": model, "gpu": g, "batch": batch, "context": ctx},
        answer=c.tokens_per_s,
        unit="tokens/s",
        hints=["One step emits `batch` tokens.", "Step time = max(compute, memory) on the roofline."],
        solution=[
            f"Step {c.time_s * 1e3:.4g} ms for {batch} tokens → {c.tokens_per_s:.4g} tokens/s "
            "(inference.decode_cost(...).tokens_per_s)."
        ],
    )


@family(
    "serving.batching_speedup",
    "serving",
    difficulty=2,
    section=SEC13 + ", §4 Prefill and decode on the roofline",
    reference="docs/references.md#orca (Yu et al. 2022)",
)
def _bs(rng):
    model, g, batch, _ = _roof_case(rng, batches=(8, 32, 64, 256), contexts=(1024,))
    a = inference.decode_cost(model, g, 1024, batch=1)
    b = inference.decode_cost(model, g, 1024, batch=batch)
    r = b.tokens_per_s / a.tokens_per_s
    return dict(
        text=f"{model} on {g}, context 1024: how many times more decode tokens/s at batch {batch} than at "
        f"batch 1 (roofline)?",
        params={"preset": model, "gpu": g, "batch": batch},
        answer=r,
        unit="ratio",
        hints=[
            "Memory-bound decode reads the weights once per step whatever the batch.",
            "But each sequence adds its own KV-cache reads.",
        ],
        solution=[
            f"batch 1: {a.tokens_per_s:.4g} tok/s; batch {batch}: {b.tokens_per_s:.4g} tok/s.",
            f"Ratio {r:.4g} (below {batch} because of the KV reads).",
        ],
        diagnostics=[(batch / r, "not ×batch: the KV-cache reads grow with the batch")],
    )


@family(
    "serving.paged_utilization",
    "serving",
    difficulty=2,
    section=SEC14 + ", §1 Why blocks: what a contiguous reservation wastes",
    reference="docs/references.md#vllm (Kwon et al. 2023, arXiv:2309.06180, §4)",
)
def _frag(rng):
    from ...inference.paged import fragmentation

    bs = pick(rng, [8, 16, 32])
    lengths = [rng.randint(20, 500) for _ in range(pick(rng, [3, 4, 5]))]
    r = fragmentation(lengths, block_size=bs, max_seq_len=512)
    return dict(
        text=f"Sequences of {lengths} tokens in a paged KV cache with blocks of {bs} tokens: what fraction of "
        f"the reserved slots hold tokens?",
        params={"lengths": lengths, "block_size": bs},
        answer=r["paged_utilization"],
        unit="fraction",
        tolerance=0.005,
        hints=["Each sequence reserves ceil(len / block) blocks.", "Utilization = Σ len / (blocks × block)."],
        solution=[
            f"Reserved slots {r['paged_slots']}, tokens {r['tokens']} (inference.paged.fragmentation, "
            f"a real BlockManager).",
            f"Utilization {r['paged_utilization']:.4g}; a contiguous "
            f"max-length allocator: {r['contiguous_utilization']:.4g}.",
        ],
    )


@family(
    "serving.prefix_sharing_savings",
    "serving",
    difficulty=2,
    section=SEC14 + ", §4 Prefix caching by hash-chained blocks",
    reference="docs/references.md#sglang (Zheng et al. 2023, arXiv:2312.07104), #vllm",
)
def _prefix(rng):
    model = pick(rng, MODELS[:6])
    n = pick(rng, [8, 32, 100])
    prefix = pick(rng, [500, 1000, 2000])
    bs = pick(rng, [16, 32])
    shared = (prefix // bs) * bs  # only whole blocks are shared
    saved = inference.kv_cache_bytes(model, (n - 1) * shared)
    return dict(
        text=f"{n} requests to {model} share a {prefix}-token system prompt. With block-level prefix caching "
        f"(block size {bs}; only full blocks are shared), how many bytes of bf16 KV cache are saved vs no "
        f"sharing?",
        params={"preset": model, "n": n, "prefix": prefix, "block_size": bs},
        answer=saved,
        unit="bytes",
        hints=[
            "The first request computes the prefix; the other n − 1 reuse its full blocks.",
            f"Shared tokens per request: floor({prefix}/{bs}) × {bs}.",
        ],
        solution=[
            f"(n − 1) × {shared} tokens = {(n - 1) * shared} tokens.",
            f"kv_cache_bytes → {gb(saved)} saved (inference.kv_cache_bytes).",
        ],
        diagnostics=[(n / (n - 1), "the first request still stores the prefix once")],
    )


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Speculative decoding's closed form, from the kit (``mlsys_nb.inference.speculative``)."""
    from mlsys_nb.inference.speculative import expected_tokens_per_step as closed_form

    return closed_form(alpha, k)


@family(
    "serving.speculative_tokens_per_step",
    "serving",
    difficulty=2,
    section="speculative decoding (Leviathan et al. 2023)",
    reference="docs/references.md#speculative-leviathan (arXiv:2211.17192, eq. 1)",
)
def _spec(rng):
    a = pick(rng, [0.5, 0.6, 0.7, 0.8, 0.9])
    k = pick(rng, [2, 3, 4, 5, 8])
    e = expected_tokens_per_step(a, k)
    return dict(
        text=f"Speculative decoding drafts k = {k} tokens; each is accepted with probability α = {a} "
        f"(independently). Expected tokens produced per target forward pass?",
        params={"alpha": a, "k": k},
        answer=e,
        unit="tokens",
        hints=["Accept i drafted tokens, then the target adds one more.", "(1 − α^(k+1)) / (1 − α)."],
        solution=[f"Σ_{{i=0..k}} α^i = (1 − {a}^{k + 1}) / (1 − {a}) = {e:.4g} tokens."],
        diagnostics=[(k / e, "not all k drafts are accepted"), ((k + 1) / e, "k + 1 is the maximum")],
    )


@family(
    "serving.speculative_speedup",
    "serving",
    difficulty=3,
    section="speculative decoding (Leviathan et al. 2023)",
    reference="docs/references.md#speculative-leviathan (arXiv:2211.17192, Theorem 3.8)",
)
def _spec2(rng):
    a = pick(rng, [0.6, 0.7, 0.8, 0.9])
    k = pick(rng, [2, 3, 4, 6])
    c = pick(rng, [0.02, 0.05, 0.1])
    from mlsys_nb.inference.speculative import expected_speedup

    s = expected_speedup(a, k, c)
    return dict(
        text=f"Draft model costs c = {c} of a target forward; k = {k}, α = {a}. Expected wall-clock speed-up "
        f"over plain decoding?",
        params={"alpha": a, "k": k, "c": c},
        answer=s,
        unit="ratio",
        hints=["Tokens per step (1 − α^(k+1))/(1 − α).", "Cost per step: k drafts (k·c) + 1 target pass."],
        solution=[f"{expected_tokens_per_step(a, k):.4g} tokens / ({k} × {c} + 1) = {s:.4g}×."],
    )


@family(
    "inference.gqa_kv_saving", "inference", section=SEC13 + ", §2 Why a KV cache, and why it is exact", reference=REF_KV
)
def _gqa(rng):
    from ...memory import preset

    model = pick(rng, ["llama-2-70b", "llama-3-8b", "llama-3-70b", "mixtral-8x7b", "llama-3.1-405b", "llama-3.2-1b"])
    c = preset(model)
    r = inference.kv_bytes_per_token(c.replace(n_kv_heads=c.n_heads)) / inference.kv_bytes_per_token(c)
    return dict(
        text=f"{model} has {c.n_heads} query heads and {c.n_kv_heads} KV heads. By what factor is its KV cache "
        f"smaller than the same model with full multi-head attention?",
        params={"preset": model},
        answer=r,
        unit="ratio",
        hints=["The cache stores K and V per KV head; head_dim is unchanged."],
        solution=[
            f"{inference.kv_bytes_per_token(c.replace(n_kv_heads=c.n_heads)):.6g} vs "
            f"{inference.kv_bytes_per_token(c):.6g} B/token: {r:g}× (inference.kv_bytes_per_token)."
        ],
    )


def static_batch_utilization(lengths) -> float:
    """Static batching: every sequence's slot is held until the longest output finishes; the
    fraction of decode slot-steps doing useful work is Σ len / (n · max len) (Yu et al. 2022, Orca §2)."""
    return sum(lengths) / (len(lengths) * max(lengths))


@family(
    "serving.static_batching_utilization",
    "serving",
    section="notebooks/15_batching_and_scheduling.ipynb, §1 Static vs continuous batching",
    reference="docs/references.md#orca (Yu et al. 2022, OSDI, §2.2)",
)
def _static(rng):
    lengths = [pick(rng, [16, 32, 64, 128, 256, 512]) for _ in range(pick(rng, [4, 8]))]
    if len(set(lengths)) == 1:
        lengths[0] = lengths[0] // 2
    u = static_batch_utilization(lengths)
    return dict(
        text=f"Static batching of {len(lengths)} requests whose outputs are {lengths} tokens long: the batch "
        f"runs until the longest finishes. What fraction of the decode slot-steps produce a token? "
        f"(Continuous batching refills a finished slot at once.)",
        params={"lengths": lengths},
        answer=u,
        unit="fraction",
        hints=["Steps = max length; slots = batch size.", "Useful = Σ lengths."],
        solution=[f"Σ len = {sum(lengths)}, n × max = {len(lengths) * max(lengths)}.", f"Utilization {u:.4g}."],
    )


@family(
    "serving.overlap_scheduling_speedup",
    "serving",
    difficulty=2,
    section="notebooks/15_batching_and_scheduling.ipynb, §6 Overlap scheduling (a model, fed with the measured phases)",
    reference="docs/references.md#nano-vllm, #sglang",
)
def _overlap(rng):
    from ...inference.metrics import overlap_speedup

    cpu = pick(rng, [0.5, 1.0, 2.0, 3.0, 5.0]) * 1e-3
    model = pick(rng, [2.0, 4.0, 8.0, 20.0]) * 1e-3
    s = overlap_speedup(cpu, model)
    return dict(
        text=f"A decode step spends {cpu * 1e3:g} ms on the CPU (scheduling, sampling, detokenizing) and "
        f"{model * 1e3:g} ms in the model. Overlapping the CPU work of step N+1 with the model of step N: "
        f"speed-up in steps per second?",
        params={"cpu_s": cpu, "model_s": model},
        answer=s,
        unit="ratio",
        hints=["Serial: cpu + model per step.", "Overlapped: the slower of the two."],
        solution=[f"({cpu * 1e3:g} + {model * 1e3:g}) / max = {s:.4g} (inference.metrics.overlap_speedup)."],
    )


FIT_CHOICES = [f"TP = {tp}" for tp in TPS] + ["does not fit on 8 GPUs"]


@family(
    "inference.fits_tp",
    "inference",
    kind="choice",
    difficulty=2,
    section=SEC13 + ", §3 Sizing the cache of real models",
    reference=REF_KV,
)
def _fits_tp(rng):
    model = pick(rng, MODELS)
    g = pick(rng, GPUS)
    batch = pick(rng, [1, 8, 32, 128])
    ctx = pick(rng, [2048, 8192, 32768])
    tp = min_tp(model, g, batch=batch, context=ctx)
    ans = FIT_CHOICES[-1] if tp is None else f"TP = {tp}"
    gpu = hardware.gpu(g)
    rows = [
        f"TP = {t}: weights {gb(inference.weight_bytes(model) / t)} + KV room for "
        f"{inference.max_concurrent_sequences(model, g, ctx, tp=t, gpu_memory_utilization=USABLE)} sequences"
        for t in TPS
    ]
    return dict(
        text=f"Serve {model} (bf16 weights and KV cache) on {g} ({gb(gpu.memory_bytes)} each, {USABLE:.0%} usable "
        f"for weights + cache) with {batch} sequences of {ctx} tokens in flight. Does it fit, and with what "
        f"smallest tensor-parallel degree (1, 2, 4 or 8 GPUs of one node)?",
        params={"preset": model, "gpu": g, "batch": batch, "context": ctx},
        answer=ans,
        choices=FIT_CHOICES,
        hints=[
            "Per GPU: weights / tp + the cache of every sequence / min(tp, n_kv_heads).",
            "Weights alone: 2 B per parameter; 70B parameters are 140 GB.",
        ],
        solution=rows + [f"Smallest that fits: {ans} (inference.max_concurrent_sequences >= {batch})."],
    )


@family(
    "serving.gpus_for_target",
    "serving",
    difficulty=3,
    section=SEC13 + ", §4 Prefill and decode on the roofline",
    reference=REF_ROOF + ", #vllm",
)
def _gpus_for_target(rng):
    for _ in range(1000):
        model, g, _, ctx = _roof_case(rng, batches=(1,), contexts=(1024, 4096))
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
