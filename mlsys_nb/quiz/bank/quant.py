"""Families of the topic ``quant``: stored bits per weight of group-wise formats, the share of scales, bytes of a
quantized model, an int8 KV cache, LoRA's trainable parameters and training state, QLoRA's memory, the decode
speed-up bound of weight-only quantization, how many LoRA adapters a multi-LoRA server (S-LoRA) holds beside the
base model and the KV cache, and how much of QLoRA's optimizer state its paged optimizers evict at a memory spike.

Answer keys: ``mlsys_nb.quant`` (``bits_per_weight``, ``quantized_weight_bytes``, ``lora_params``,
``finetune_bytes``, ``decode_speedup_bound``) and ``inference.kv_cache_bytes`` / ``weight_bytes``, the functions
notebook 23 runs.
"""

from __future__ import annotations

from ..core import family
from ._util import gb, inference, numeric_family, pick, picks, quant


NB = "notebooks/23_quantization_and_lora.ipynb"
SEC_FORMATS = f"{NB}, §1 Weight-only quantization from scratch"
SEC_SPEED = f"{NB}, §4 Speed and memory"
SEC_LORA = f"{NB}, §5 LoRA"
SEC_QLORA = f"{NB}, §6 QLoRA"
REF_QLORA = "docs/references.md#qlora (Dettmers et al. 2023, arXiv:2305.14314, §1 and §3)"
REF_GPTQ = "docs/references.md#gptq (Frantar et al. 2022, arXiv:2210.17323)"
REF_AWQ = "docs/references.md#awq (Lin et al. 2023, arXiv:2306.00978)"
REF_LORA = "docs/references.md#lora (Hu et al. 2021, arXiv:2106.09685, §4.1)"
REF_KIVI = "docs/references.md#kivi (Liu et al. 2024, arXiv:2402.02750)"
REF_SLORA = "docs/references.md#s-lora (Sheng et al. 2023, arXiv:2311.03285, §4)"
MODELS = ["llama-2-7b", "llama-2-13b", "llama-3-8b", "llama-2-70b", "llama-65b"]
FORMATS = [("int4", 32, False), ("int4", 64, False), ("int4", 128, False), ("int8", 128, False),
           ("nf4", 64, False), ("nf4", 64, True), ("nf4", 128, True)]  # fmt: skip
LAYOUT = {
    "int8": "absmax int8 codes with one fp32 scale per group",
    "int4": "4-bit codes packed two per byte with an fp16 scale and an fp16 zero point per group",
    "nf4": "4-bit NF4 codes packed two per byte with one fp32 absmax per block",
}


def describe(scheme, g, dq):
    d = LAYOUT[scheme] + f", groups of {g}"
    if dq:
        d += " (double quantization: the absmax values stored as 8-bit floats with one fp32 scale per 256 of them)"
    return d


def _format(rng) -> dict:
    scheme, g, dq = pick(rng, FORMATS)
    return {"scheme": scheme, "g": g, "dq": dq}


def _bits(p) -> float:
    return quant.bits_per_weight(p["scheme"], p["g"], p["dq"])


def _code_bits(p) -> int:
    return 8 if p["scheme"] == "int8" else 4


def _described(p) -> str:
    return describe(p["scheme"], p["g"], p["dq"])


numeric_family(
    family("quant.bits_per_weight", section=SEC_FORMATS, reference=REF_QLORA),
    draw=_format,
    calc=_bits,
    unit="ratio",
    fields=lambda p, result: {"layout": _described(p)},
    text=(
        "A weight matrix is stored as {layout}. How many bits does it store per weight, scales and zero "
        "points included?"
    ),
    hints=["Code bits plus the bits of one group's constants divided by the group size."],
    solution=["{layout}: {result:.4g} bits per weight (quant.bits_per_weight)."],
    diagnostics=lambda p, bits: [(_code_bits(p) / bits, "the scales and zero points are stored too")],
)

numeric_family(
    family("quant.scale_share", section=SEC_FORMATS, reference=REF_GPTQ),
    draw=_format,
    calc=lambda p: (_bits(p) - _code_bits(p)) / _bits(p),
    unit="fraction",
    fields=lambda p, result: {
        "layout": _described(p),
        "bits": _bits(p),
        "code_bits": _code_bits(p),
        "constant_bits": _bits(p) - _code_bits(p),
    },
    text=(
        "A weight matrix is stored as {layout}. What fraction of its stored bytes are the per-group constants "
        "(scales, zero points), not the codes?"
    ),
    hints=["Bits of constants per weight over all bits per weight."],
    solution=[
        (
            "{bits:.4g} bits per weight of which {code_bits} are the code: {constant_bits:.4g} / {bits:.4g} = "
            "{result:.4f}."
        )
    ],
    diagnostics=lambda p, share: [(_bits(p) / _code_bits(p), "divide by all the stored bits, not by the code bits")],
)


def _model_case(rng) -> dict:
    model = pick(rng, MODELS)
    return {"model": model, **_format(rng)}


numeric_family(
    family("quant.model_weight_bytes", difficulty=2, section=SEC_SPEED, reference=REF_AWQ),
    draw=_model_case,
    calc=lambda p: quant.quantized_weight_bytes(p["model"], p["scheme"], p["g"], p["dq"]),
    unit="bytes",
    fields=lambda p, result: {"layout": _described(p), "result_gb": gb(result)},
    text=(
        "{model}: the linear layers of every block are stored as {layout}; the embedding, the LM head and the "
        "norms stay in bf16. How many bytes do the weights take?"
    ),
    hints=[
        "Block linear weights per layer: q, k, v, o, and the three SwiGLU matrices.",
        "Everything else: total parameters minus those, at 2 bytes.",
    ],
    solution=["{result_gb} (quant.quantized_weight_bytes)."],
)

numeric_family(
    family("quant.kv_cache_int8_bytes", section=SEC_SPEED, reference=REF_KIVI),
    draw=lambda rng: picks(rng, model=MODELS, batch=[1, 8, 32, 64], ctx=[1024, 2048, 4096]),
    calc=lambda p: inference.kv_cache_bytes(p["model"], p["batch"] * p["ctx"], "int8"),
    unit="bytes",
    fields=lambda p, result: {"result_gb": gb(result)},
    text=(
        "{model} serves {batch} sequences of {ctx} tokens with the KV cache in int8 (ignore the scales). How "
        "many bytes does the cache take?"
    ),
    hints=["K and V per token and layer: n_kv_heads · head_dim values each, one byte per value in int8."],
    solution=["{result_gb} (inference.kv_cache_bytes with dtype int8)."],
    diagnostics=[(2.0, "that is the bf16 cache; int8 is one byte per value"), (0.5, "count both K and V")],
)

TARGETS = [("q_proj", "v_proj"), ("q_proj", "k_proj", "v_proj", "o_proj")]  # and every linear layer of a block

numeric_family(
    family("quant.lora_trainable_params", section=SEC_LORA, reference=REF_LORA),
    draw=lambda rng: {
        "model": pick(rng, MODELS),
        "r": pick(rng, [4, 8, 16, 64]),
        "targets": list(pick(rng, [*TARGETS, quant.sizing.LINEAR_NAMES])),
    },
    calc=lambda p: quant.lora_params(p["model"], p["r"], tuple(p["targets"])),
    unit="params",
    fields=lambda p, result: {"layers": ", ".join(p["targets"])},
    text=(
        "LoRA with rank r = {r} on the {layers} layers of every block of {model}. How many trainable "
        "parameters does it add?"
    ),
    hints=["A and B of a d_in → d_out layer hold r·d_in + r·d_out parameters.", "Mind GQA's narrower k and v."],
    solution=["{result:,} parameters (quant.lora_params)."],
)


def _finetune(p, method: str, **kw) -> dict:
    """``quant.finetune_bytes`` of ``p["model"]``."""
    return quant.finetune_bytes(p["model"], method, **kw)


def _trained(f) -> float:
    """Adapters + their gradients + the optimizer state, bytes."""
    return f["adapters"] + f["grads"] + f["optimizer"]


numeric_family(
    family("quant.lora_state_bytes", section=SEC_LORA, reference=REF_LORA),
    draw=lambda rng: picks(rng, model=MODELS, r=[8, 16, 64]),
    calc=lambda p: _trained(_finetune(p, "lora", r=p["r"])),
    unit="bytes",
    fields=lambda p, result: {"trainable": quant.lora_params(p["model"], p["r"]), "result_gb": gb(result)},
    text=(
        "LoRA with r = {r} on every linear layer of the blocks of {model}: adapters and their gradients in "
        "bf16, AdamW's two moments in fp32. How many bytes do the adapters, gradients and optimizer state "
        "take (the frozen base excluded)?"
    ),
    hints=["2 + 2 + 4 + 4 = 12 bytes per trainable parameter."],
    solution=["{trainable:,} trainable parameters × 12 bytes = {result_gb} (quant.finetune_bytes)."],
)

numeric_family(
    family("quant.qlora_bytes", difficulty=2, section=SEC_QLORA, reference=REF_QLORA),
    draw=lambda rng: picks(rng, model=MODELS, r=[16, 64]),
    calc=lambda p: _finetune(p, "qlora", r=p["r"]),
    key=lambda f: f["total"],
    unit="bytes",
    fields=lambda p, result: {
        "base": gb(result["weights"]),
        "trained": gb(_trained(result)),
        "total": gb(result["total"]),
    },
    text=(
        "QLoRA on {model}: the blocks' linear layers in NF4 (blocks of 64, double quantization: 4 + 8/64 + "
        "32/(64·256) bits), the rest in bf16, LoRA r = {r} on every linear layer of the blocks with bf16 "
        "adapters and gradients and fp32 AdamW moments. How many bytes of model state (activations excluded)?"
    ),
    hints=[
        "Frozen base at ~0.516 bytes per quantized weight plus 2 per other weight.",
        "12 bytes per adapter parameter.",
    ],
    solution=["base {base}, adapters + gradients + AdamW {trained}: {total} (quant.finetune_bytes)."],
)

numeric_family(
    family("quant.full_over_qlora", difficulty=2, section=SEC_QLORA, reference=REF_QLORA),
    draw=lambda rng: picks(rng, model=MODELS),
    calc=lambda p: (_finetune(p, "full")["total"], _finetune(p, "qlora", r=64)["total"]),
    key=lambda fq: fq[0] / fq[1],
    unit="ratio",
    fields=lambda p, result: {"full": gb(result[0]), "qlora": gb(result[1]), "ratio": result[0] / result[1]},
    text=(
        "{model}: full fine-tuning in 16 bits (bf16 weights and gradients, fp32 AdamW moments: 12 bytes per "
        "parameter) against QLoRA (NF4 base with double quantization, r = 64 adapters on every block linear "
        "layer, 12 bytes per adapter parameter). How many times more model-state memory does full fine-tuning "
        "need?"
    ),
    hints=["The QLoRA paper's LLaMA-65B: more than 780 GB against under 48 GB."],
    solution=["{full} / {qlora} = {ratio:.3g} (quant.finetune_bytes)."],
)

numeric_family(
    family("quant.decode_speedup_bound", section=SEC_SPEED, reference=REF_AWQ),
    draw=lambda rng: {**_format(rng), "dtype": pick(rng, ["bf16", "fp32"])},
    calc=lambda p: quant.decode_speedup_bound(_bits(p), p["dtype"]),
    unit="ratio",
    fields=lambda p, result: {
        "layout": _described(p),
        "dtype_bits": 8 * (2 if p["dtype"] == "bf16" else 4),
        "bits": _bits(p),
    },
    text=(
        "A memory-bound decode step reads only weights (tiny batch, short context). They move from {dtype} to "
        "{layout}. At most how many times faster can the step get?"
    ),
    hints=["Time = bytes / bandwidth: the ratio of bits per weight, constants included."],
    solution=["{dtype_bits} / {bits:.4g} = {result:.3g} (quant.decode_speedup_bound)."],
    diagnostics=lambda p, bound: [(_bits(p) / _code_bits(p), "count the scales' bits too")],
)


@family("quant.multi_lora_adapters", difficulty=2, section=SEC_LORA, reference=REF_SLORA)
def _multi_lora(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"])
    mem = pick(rng, [80, 141])  # GB: an H100, an H200
    batch, ctx = pick(rng, [4, 8, 16]), pick(rng, [1024, 2048])
    r = pick(rng, [8, 16, 64])
    targets = pick(rng, [("q_proj", "v_proj"), quant.sizing.LINEAR_NAMES])
    weights = inference.weight_bytes(model, "bf16")
    kv = inference.kv_cache_bytes(model, batch * ctx, "bf16")
    adapter = 2 * quant.lora_params(model, r, targets)
    n = int((mem * 1e9 - weights - kv) // adapter)
    return dict(
        text=f"A multi-LoRA server (S-LoRA, Punica) keeps {model}'s base weights in bf16 on one {mem} GB GPU "
        f"(10^9 bytes), reserves a bf16 KV cache for {batch} sequences of {ctx} tokens, and holds unmerged LoRA "
        f"adapters of rank r = {r} on the {', '.join(targets)} layers of every block, in bf16, in the rest. How many "
        "adapters fit (ignore activations and fragmentation)?",
        params={"model": model, "mem": mem, "batch": batch, "ctx": ctx, "r": r, "targets": list(targets)},
        answer=n,
        unit="count",
        hints=[
            "Free memory: GPU bytes minus 2 bytes per base parameter minus the KV cache (2·L·n_kv·d·2 bytes a token).",
            "One adapter: r·(d_in + d_out) parameters per targeted layer and block, 2 bytes each.",
        ],
        solution=[
            f"{mem} GB − weights {gb(weights)} − KV cache {gb(kv)} = {gb(mem * 1e9 - weights - kv)} free; one "
            f"adapter {adapter / 1e6:.4g} MB (quant.lora_params × 2): {n} adapters. Merging an adapter into the "
            "base would need one copy of the weights per adapter; unmerged, they all share one base.",
        ],
        diagnostics=[
            ((mem * 1e9 - weights) / adapter / max(n, 1), "subtract the KV cache too"),
            (0.5, "bf16 adapters take 2 bytes per parameter, not 4"),
        ],
    )


@family("quant.paged_optimizer_eviction", difficulty=2, section=SEC_QLORA, reference=REF_QLORA)
def _paged(rng):
    model = pick(rng, ["llama-2-7b", "llama-3-8b", "llama-2-13b"])
    r = pick(rng, [16, 64])
    f = quant.finetune_bytes(model, "qlora", r=r)
    fixed = f["weights"] + f["adapters"] + f["grads"]  # never evicted
    mem = pick(rng, [m for m in (16, 24, 48) if m * 1e9 > fixed + f["optimizer"] + 1e9])  # GB: fits between spikes
    share = pick(rng, [0.25, 0.5, 0.75])  # of the optimizer state that the spike displaces
    spike = round((mem * 1e9 - fixed - (1 - share) * f["optimizer"]) / 1e9, 2)  # GB of activations at the spike
    evict = max(0.0, fixed + f["optimizer"] + spike * 1e9 - mem * 1e9)
    return dict(
        text=f"QLoRA on {model} (NF4 base with double quantization, LoRA r = {r} on every linear layer of the "
        f"blocks, bf16 adapters and gradients, fp32 AdamW moments) on a {mem} GB GPU (10^9 bytes). QLoRA's paged "
        f"optimizers keep AdamW's state in unified memory: one long batch needs {spike} GB of activations. How many "
        "bytes of optimizer state are paged out to the CPU at that step (the base, adapters and gradients stay)?",
        params={"model": model, "r": r, "mem": mem, "spike_gb": spike},
        answer=evict,
        unit="bytes",
        tolerance=0.02,
        hints=[
            "What stays: the frozen NF4 base (~0.516 bytes per quantized weight, 2 per other weight), the adapters "
            "and their gradients (2 + 2 bytes per adapter parameter).",
            "Evicted = stays + optimizer state (8 bytes per adapter parameter) + activations − GPU memory.",
        ],
        solution=[
            f"base {gb(f['weights'])} + adapters and gradients {gb(f['adapters'] + f['grads'])} + AdamW "
            f"{gb(f['optimizer'])} + activations {spike} GB − {mem} GB = {gb(evict)} paged out (quant.finetune_bytes). "
            "The pages return when the spike is over: NVIDIA unified memory moves them on the next access, so only "
            "the spiking steps pay the PCIe traffic.",
        ],
        diagnostics=[(f["optimizer"] / max(evict, 1.0), "only the part the spike displaces is paged out")],
    )
