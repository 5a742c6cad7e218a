"""Families of the topic ``inference``: the KV cache, weight bytes, how many sequences fit and at what
TP, prefill and decode on the roofline.

Answer keys: ``mlsys_nb.inference`` (``kv_cache_bytes``, ``kv_bytes_per_token``, ``weight_bytes``,
``max_concurrent_sequences``, ``kv_cache.min_tp_that_fits``, ``prefill_cost``/``decode_cost``). ``fits_on_gpus``
is the one physical check every inference and serving family draws its premise through.
"""

from __future__ import annotations

from ... import hardware
from ...config import DTYPE_BYTES
from ..core import family
from ._util import gb, inference, numeric_family, pick, picks, ratio_family


SEC13 = "notebooks/13_inference_anatomy.ipynb"
REF_KV = "docs/references.md#gqa (Ainslie et al. 2023, arXiv:2305.13245), #vllm"
REF_ROOF = "docs/references.md#roofline (Williams et al. 2009), #scaling-book"
SEC_ROOF = SEC13 + ", §4 Prefill and decode on the roofline"
SEC_KV = SEC13 + ", §2 Why a KV cache, and why it is exact"
SEC_SIZING = SEC13 + ", §3 Sizing the cache of real models"
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


def _kv_diagnostics(p, b) -> list:
    c = _shape(p["preset"])[0]
    gqa = [(c.n_heads / c.n_kv_heads, "you used the query heads: GQA caches only n_kv_heads")]
    return [(0.5, "off by a factor 2: did you count K and V?")] + (gqa if c.n_heads != c.n_kv_heads else [])


numeric_family(
    family("inference.kv_cache_bytes", section=SEC_KV, reference=REF_KV),
    draw=lambda rng: picks(
        rng, preset=MODELS, tokens=[1024, 4096, 8192, 32768, 128000, 1_000_000], dtype=["bf16", "fp8", "fp32", "int8"]
    ),
    calc=lambda p: inference.kv_cache_bytes(p["preset"], p["tokens"], p["dtype"]),
    unit="bytes",
    fields=lambda p, result: {
        "shape": _shape(p["preset"])[1],
        "dtype_bytes": DTYPE_BYTES[p["dtype"]],
        "n_layers": _shape(p["preset"])[0].n_layers,
        "n_kv_heads": _shape(p["preset"])[0].n_kv_heads,
        "head_dim": _shape(p["preset"])[0].head_dim,
        "per_token": inference.kv_bytes_per_token(p["preset"], p["dtype"]),
        "result_gb": gb(result),
    },
    text="{preset} ({shape}) caches {tokens} tokens in {dtype}. KV-cache bytes?",
    hints=[
        "Per token per layer: K and V, each n_kv_heads × head_dim elements.",
        "2 × L × n_kv × d × {dtype_bytes} B × tokens.",
    ],
    solution=[
        "Per token: 2 × {n_layers} × {n_kv_heads} × {head_dim} × {dtype_bytes} = {per_token:.6g} B.",
        "× {tokens} tokens = {result_gb} (inference.kv_cache_bytes).",
    ],
    diagnostics=_kv_diagnostics,
)


def _kv_shape_text(model) -> str:
    c = _shape(model)[0]
    if c.kv_lora_rank:
        return f" (MLA: latent {c.kv_lora_rank} + RoPE key {c.rope_head_dim} per layer, {c.n_layers} layers)?"
    return f" ({_shape(model)[1]})?"


numeric_family(
    family("inference.kv_bytes_per_token", section=SEC_KV, reference=REF_KV),
    draw=lambda rng: picks(rng, preset=MODELS + ["deepseek-v3"], dtype="bf16"),
    calc=lambda p: inference.kv_bytes_per_token(p["preset"], "bf16"),
    unit="bytes",
    fields=lambda p, result: {"shape": _kv_shape_text(p["preset"])},
    text="KV-cache bytes per token (all layers, bf16) of {preset}{shape}",
    hints=["MHA/GQA: 2·L·n_kv·d·bytes.", "MLA (DeepSeek): (kv_lora_rank + rope_head_dim)·L·bytes."],
    solution=["{result:.6g} B per token (inference.kv_bytes_per_token)."],
    diagnostics=lambda p, b: (
        [] if _shape(p["preset"])[0].kv_lora_rank else [(0.5, "off by a factor 2: did you count K and V?")]
    ),
)


def _n_params(model) -> int:
    from ...memory import param_count, preset

    return int(param_count(preset(model)))


numeric_family(
    family("inference.weight_bytes", section=SEC_SIZING, reference=REF_KV),
    draw=lambda rng: picks(rng, preset=MODELS, dtype=["bf16", "fp8", "int4"]),
    calc=lambda p: inference.weight_bytes(p["preset"], p["dtype"]),
    unit="bytes",
    fields=lambda p, result: {
        "n_params": _n_params(p["preset"]),
        "dtype_bytes": DTYPE_BYTES[p["dtype"]],
        "result_gb": gb(result),
    },
    text="{preset} has {n_params:,} parameters. Bytes of weights in {dtype}?",
    hints=["{dtype} is {dtype_bytes} B per parameter."],
    solution=["{n_params:,} × {dtype_bytes} = {result_gb} (inference.weight_bytes)."],
)


def _serving_case(rng) -> dict:
    """A model, GPU, TP and length drawn until one sequence fits (``fits_on_gpus``)."""
    for _ in range(100):
        model = pick(rng, MODELS[:6])
        g = pick(rng, GPUS[:3])
        tp = pick(rng, [1, 2, 4, 8])
        seq = pick(rng, [2048, 4096, 8192, 32768])
        if fits_on_gpus(model, g, batch=1, context=seq, tp=tp):  # the shared physical check
            break
    return {"preset": model, "gpu": g, "tp": tp, "seq_len": seq}


numeric_family(
    family("inference.max_concurrent_sequences", difficulty=2, section=SEC_SIZING, reference=REF_KV),
    draw=_serving_case,
    calc=lambda p: inference.max_concurrent_sequences(p["preset"], p["gpu"], p["seq_len"], tp=p["tp"]),
    unit="count",
    tolerance=0.0,
    fields=lambda p, result: {
        "gpu_memory": gb(hardware.gpu(p["gpu"]).memory_bytes),
        "weights_per_gpu": gb(inference.weight_bytes(p["preset"]) / p["tp"]),
        "kv_per_gpu": gb(
            inference.kv_cache_bytes(p["preset"], p["seq_len"]) / min(p["tp"], _shape(p["preset"])[0].n_kv_heads)
        ),
    },
    text=(
        "Serving {preset} (bf16 weights and KV) with TP = {tp} on {gpu} ({gpu_memory}), 90 % of memory "
        "usable: how many full {seq_len}-token sequences fit?"
    ),
    hints=[
        "Budget per GPU = 0.9 × memory − weights / tp.",
        "Each sequence needs kv_cache_bytes(seq) / tp (TP splits the KV heads). Round down.",
    ],
    solution=[
        "Weights per GPU {weights_per_gpu}; KV per sequence per GPU {kv_per_gpu}.",
        "{result} sequences (inference.max_concurrent_sequences).",
    ],
)


def fits_on_gpus(model, gpu, *, batch: int, context: int, tp: int = 1) -> bool:
    """The one physical check of every inference family: do the bf16 weights (split over ``tp``
    GPUs) and the bf16 KV cache of ``batch`` sequences of ``context`` tokens fit in
    ``inference.kv_cache.GPU_MEMORY_UTILIZATION`` (90 %, vLLM's default) of
    each GPU's memory? (``inference.max_concurrent_sequences`` >= batch; a model, no activations.)"""
    return inference.max_concurrent_sequences(model, gpu, context, tp=tp) >= batch


TPS = (1, 2, 4, 8)


def roof_case(rng, batches=(1, 8, 32, 128), contexts=(2048,)):
    """(model, gpu, batch, context) drawn until the premise is physical: it fits on ONE GPU."""
    for _ in range(1000):
        model, g, batch, ctx = pick(rng, MODELS[:6]), pick(rng, GPUS), pick(rng, batches), pick(rng, contexts)
        if fits_on_gpus(model, g, batch=batch, context=ctx):
            return model, g, batch, ctx
    raise RuntimeError("no premise fits on one GPU")  # pragma: no cover


def times_ms(p, cost) -> dict:
    """A roofline cost's compute, memory and step time in ms, for the words of a question."""
    return {
        "compute_ms": cost.compute_time_s * 1e3,
        "memory_ms": cost.memory_time_s * 1e3,
        "step_ms": cost.time_s * 1e3,
    }


def _roof_params(rng, length: str) -> dict:
    """A one-GPU premise (``roof_case``) at context or prompt length 512, 2048 or 8192."""
    model, g, batch, n = roof_case(rng, contexts=(512, 2048, 8192))
    return {"preset": model, "gpu": g, "batch": batch, length: n}


def _roofline_time_family(name: str, cost: str, length: str, **words):
    """The roofline time of a decode step or a prefill (``inference.decode_cost`` / ``prefill_cost``) on one GPU,
    at a drawn context or prompt ``length``."""
    numeric_family(
        family(name, difficulty=2, section=SEC_ROOF, reference=REF_ROOF),
        draw=lambda rng: _roof_params(rng, length),
        calc=lambda p: getattr(inference, cost)(p["preset"], p["gpu"], p[length], batch=p["batch"]),
        key=lambda c: c.time_s,
        unit="seconds",
        fields=times_ms,
        **words,
    )


_roofline_time_family(
    "inference.decode_step_time",
    "decode_cost",
    "context",
    text=(
        "Roofline model: one decode step of {preset} (bf16) on one {gpu} (weights and cache fit), batch "
        "{batch}, each sequence at context {context}: time of the step (max of compute and memory time, 100 % "
        "of peak)?"
    ),
    hints=[
        "Bytes: all weights once + every sequence's KV cache.",
        "FLOPs: 2 × matmul params × batch + attention. Take the slower of FLOPs/peak and bytes/bandwidth.",
    ],
    solution=[
        "FLOPs {result.flops:.4g} → {compute_ms:.4g} ms; bytes {result.bytes:.4g} → {memory_ms:.4g} ms.",
        "{result.bound}-bound: {step_ms:.4g} ms (inference.decode_cost).",
    ],
)

_roofline_time_family(
    "inference.prefill_time",
    "prefill_cost",
    "prompt_len",
    text=(
        "Roofline model: prefill of {batch} prompt(s) of {prompt_len} tokens on {preset} (bf16), one {gpu} "
        "(weights and cache fit): time?"
    ),
    hints=[
        "Prefill is usually compute-bound: ≈ 2·N_matmul·tokens / peak (+ attention).",
        "Check against the memory time (weights + KV written).",
    ],
    solution=[
        (
            "compute {compute_ms:.4g} ms, memory {memory_ms:.4g} ms → {result.bound}-bound, {step_ms:.4g} ms "
            "(inference.prefill_cost)."
        )
    ],
)


@family("inference.decode_bound", kind="choice", section=SEC_ROOF, reference=REF_ROOF)
def _bound(rng):
    model, g, batch, _ = roof_case(rng, batches=(1, 4, 64, 256, 1024), contexts=(1024,))
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


def _peaks(g) -> str:
    gpu = hardware.gpu(g)
    return f"bf16 peak {gpu.peak('bf16') / 1e12:.4g} TFLOP/s, HBM {gpu.hbm_bandwidth_bytes_per_s / 1e12:.4g} TB/s"


numeric_family(
    family("inference.ridge_point", section=SEC_ROOF, reference=REF_ROOF),
    draw=lambda rng: picks(rng, gpu=GPUS),
    calc=lambda p: inference.decode_cost("llama-2-7b", p["gpu"], 16).ridge_flop_per_byte,
    unit="ratio",
    fields=lambda p, result: {"peaks": _peaks(p["gpu"])},
    text="{gpu}: {peaks}. Ridge point (FLOP per byte)?",
    hints=["Ridge = peak FLOP/s / bandwidth B/s."],
    solution=["{result:.4g} FLOP/B (StepCost.ridge_flop_per_byte)."],
)


def _kv_per_token(p, mha: bool) -> float:
    """bf16 KV bytes per token of preset ``p["preset"]``, or of the same model with one KV head per
    query head (``mha``)."""
    from ...memory import preset

    c = preset(p["preset"])
    return inference.kv_bytes_per_token(c.replace(n_kv_heads=c.n_heads) if mha else c)


def _heads(p) -> str:
    from ...memory import preset

    c = preset(p["preset"])
    return f"{c.n_heads} query heads and {c.n_kv_heads} KV heads"


ratio_family(
    family("inference.gqa_kv_saving", section=SEC_KV, reference=REF_KV),
    draw=lambda rng: picks(
        rng, preset=["llama-2-70b", "llama-3-8b", "llama-3-70b", "mixtral-8x7b", "llama-3.1-405b", "llama-3.2-1b"]
    ),
    calc=_kv_per_token,
    over=dict(mha=True),
    under=dict(mha=False),
    fields=lambda p, over, under, ratio: {"heads": _heads(p)},
    text=(
        "{preset} has {heads}. By what factor is its KV cache smaller than the same model with full "
        "multi-head attention?"
    ),
    hints=["The cache stores K and V per KV head; head_dim is unchanged."],
    solution=["{over:.6g} vs {under:.6g} B/token: {ratio:g}× (inference.kv_bytes_per_token)."],
)


FIT_CHOICES = [f"TP = {tp}" for tp in TPS] + ["does not fit on 8 GPUs"]


@family("inference.fits_tp", kind="choice", difficulty=2, section=SEC_SIZING, reference=REF_KV)
def _fits_tp(rng):
    usable = inference.kv_cache.GPU_MEMORY_UTILIZATION  # vLLM's default share for weights + KV cache
    model = pick(rng, MODELS)
    g = pick(rng, GPUS)
    batch = pick(rng, [1, 8, 32, 128])
    ctx = pick(rng, [2048, 8192, 32768])
    tp = inference.kv_cache.min_tp_that_fits(model, g, ctx, batch=batch, tp_choices=TPS)
    ans = FIT_CHOICES[-1] if tp is None else f"TP = {tp}"
    gpu = hardware.gpu(g)
    rows = [
        f"TP = {t}: weights {gb(inference.weight_bytes(model) / t)} + KV room for "
        f"{inference.max_concurrent_sequences(model, g, ctx, tp=t)} sequences"
        for t in TPS
    ]
    return dict(
        text=f"Serve {model} (bf16 weights and KV cache) on {g} ({gb(gpu.memory_bytes)} each, {usable:.0%} usable "
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
