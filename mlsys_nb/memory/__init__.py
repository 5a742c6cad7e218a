"""Training memory per GPU: parameters, gradients, optimizer states, master weights, activations.

``estimate(model, train)`` returns a ``Breakdown`` whose fields are **bytes per rank** (the
heaviest pipeline stage unless ``stage=`` is given). Model states follow the ZeRO paper's analysis
(Rajbhandari et al. 2020, arXiv:1910.02054, §3; Micikevicius et al. 2018, arXiv:1710.03740) with exact
parameter counts (GQA, SwiGLU, untied head, MoE total vs active,
DeepSeek MLA) sharded by TP (Megatron column/row split, vocab-parallel embedding), PP (``stage_layers``:
⌊L/pp⌋ or ⌈L/pp⌉ layers per stage, or a published uneven split ``train.pp_layers``; embedding on the
first stage, head on the last; DualPipe ranks hold two stages), EP (experts) and ZeRO 0-3 over dp x cp.
Activations are summed from named saved-for-backward tensors of one transformer layer
(``layer_terms``), so every number can be traced to a tensor; ``kernels="eager"`` describes this
package's ``Transformer`` exactly as PyTorch runs it (validated on CPU against
``torch.autograd.graph.saved_tensors_hooks``, ``mlsys_nb.models.measure``), ``kernels="fused"`` a GPU
training stack (Korthikanti et al. 2022's accounting, arXiv:2205.05198, eq. 1-2, Table 2). TP shards the head-split and
FFN-width terms; SP additionally shards the h-wide terms (norm inputs, dropout masks); the s^2
attention terms are split over heads (/tp, with or without SP); CP divides everything by cp;
PP multiplies by the schedule's in-flight micro-batches. ``fused`` counts a fused SwiGLU's saved input
(gate and up, SiLU recomputed in backward) and FlashAttention's output once (it is the output
projection's input); ``train.recompute_layers`` recomputes only the first k layers of each stage.

``playbook_estimate(**inputs)`` ports the Ultra-Scale Playbook widget exactly (its bugs included,
docs/references.md#playbook-memory-widget); ``estimate(..., compat="playbook")`` shows it for a model/training pair. The
default mode fixes those bugs (tests in ``tests/test_memory.py`` pin each fix).

Units: bytes everywhere; ``GB = 1e9``, ``GiB = 2**30``.
"""

from __future__ import annotations

import math
from functools import lru_cache
from dataclasses import asdict, dataclass, field

from ..config import (
    LORA_TARGETS,
    ArgumentError,
    ModelConfig,
    TrainConfig,
    check_choice,
    check_int,
    load_model_preset,
    model_presets,
)

from ..pipeline.closed_forms import peak_in_flight

__all__ = [
    "ModelConfig",
    "TrainConfig",
    "preset",
    "presets",
    "ParamCount",
    "param_count",
    "ModelStates",
    "model_state_bytes",
    "Breakdown",
    "estimate",
    "layer_terms",
    "playbook_estimate",
    "playbook_inputs",
    "PLAYBOOK_PRESETS",
    "GB",
    "GiB",
    "format_playbook_bytes",
    "stage_layers",
    "block_linear_shapes",
    "lora_layer_params",
    "block_linear_weights",
    "finetune_elements",
]

GB = 1e9
GiB = 2.0**30

# bytes per element: params, grads, fp32 master, one optimizer state, activations
_PRECISION = {
    "fp32": dict(param=4, grad=4, master=0, state=4, act=4),
    "bf16-mixed": dict(param=2, grad=2, master=4, state=4, act=2),
    "bf16-nomaster": dict(param=2, grad=2, master=0, state=4, act=2),
    "fp8-te": dict(param=4, grad=4, master=0, state=4, act=2),
    "fp8-dsv3": dict(param=1, grad=2 + 4, master=4, state=2, act=2),
}
_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1, "adam-8bit": 2}


def presets() -> list[str]:
    """Names of the model presets in ``data/models.yaml``."""
    return list(model_presets())


def preset(name: str) -> ModelConfig:
    """The ``ModelConfig`` of a preset (e.g. ``"llama-3.1-8b"``); the error lists valid names."""
    return load_model_preset(name)


# ---- parameter counts -----------------------------------------------------------------------
def _mlp_params(m: ModelConfig, width: int) -> tuple[int, int]:
    """(TP-sharded, replicated) parameters of one MLP of this width."""
    mats = (3 if m.activation == "swiglu" else 2) * m.hidden * width
    if not m.bias:
        return mats, 0
    col_bias = (2 if m.activation == "swiglu" else 1) * width
    return mats + col_bias, m.hidden  # the row-parallel (down) bias is replicated


def _attn_params(m: ModelConfig, tp: int) -> tuple[float, int]:
    """(per-rank sharded part, replicated part) of one attention block under TP degree ``tp``."""
    h, a, d = m.hidden, m.n_heads, m.head_dim
    if m.kv_lora_rank:  # DeepSeek multi-head latent attention
        dr, qr, kvr = m.rope_head_dim, m.q_lora_rank, m.kv_lora_rank
        rep = (h * qr + qr if qr else 0) + h * (kvr + dr) + kvr
        q = (qr if qr else h) * a * (d + dr)
        shard = q + kvr * a * 2 * d + a * d * h
        return shard / tp, rep
    kv_heads_rank = m.n_kv_heads / tp if tp <= m.n_kv_heads else 1  # KV heads replicated past n_kv
    shard = h * m.q_dim / tp + 2 * h * d * kv_heads_rank + m.q_dim * h / tp
    rep = 0
    if m.bias or m.qkv_bias:
        shard += m.q_dim / tp + 2 * d * kv_heads_rank
    if m.bias:
        rep += h
    return shard, rep


def norm_params(m: ModelConfig) -> int:
    """Parameters of one normalisation layer: the gain (``hidden``), plus the bias of a LayerNorm with biases."""
    return m.hidden * (2 if (m.norm == "layernorm" and m.bias) else 1)


def _kinds(m: ModelConfig, layers: range) -> dict[int, int]:
    """{representative layer index: how many layers of that kind} (dense-MLP vs MoE layers)."""
    out: dict[bool, list] = {}
    for i in layers:
        out.setdefault(m.is_moe and i >= m.n_dense_layers, [i, 0])[1] += 1
    return {i: n for i, n in out.values()}


def _layer_params(m: ModelConfig, i: int, *, tp: int = 1, ep: int = 1, active: bool = False) -> dict:
    """Parameters of layer ``i`` held by one rank: ``dense`` (ZeRO over dp x cp) and ``expert``
    (ZeRO over dp x cp / ep)."""
    attn_shard, attn_rep = _attn_params(m, tp)
    dense = attn_shard + attn_rep + 2 * norm_params(m)
    expert = 0.0
    if m.is_moe and i >= m.n_dense_layers:
        dense += m.hidden * m.n_experts  # router, replicated
        sh, rep = _mlp_params(m, m.expert_ffn_hidden)
        dense += m.n_shared_experts * (sh / tp + rep)
        n_exp = m.top_k if active else m.n_experts / ep
        expert = n_exp * (sh / tp + rep)
    else:
        sh, rep = _mlp_params(m, m.ffn_hidden)
        dense += sh / tp + rep
    return {"dense": dense, "expert": expert}


@dataclass(frozen=True)
class ParamCount:
    """Exact parameter counts (elements). ``active``: used per token (MoE: top-k routed experts);
    ``embedding``/``head``: the vocabulary matrices (head 0 when tied); ``per_layer``: each layer."""

    total: int
    active: int
    embedding: int
    head: int
    per_layer: tuple = ()

    def __int__(self):
        return self.total

    @property
    def non_embedding(self) -> int:
        return self.total - self.embedding - self.head


def param_count(model: ModelConfig) -> ParamCount:
    """Exact parameter count of ``model`` as ``mlsys_nb.models.Transformer`` builds it (plus MLA
    for DeepSeek presets, which the small Transformer does not build)."""
    return _param_count(model)


@lru_cache(maxsize=256)
def _param_count(model: ModelConfig) -> ParamCount:
    kinds = _kinds(model, range(model.n_layers))
    per = {i: _layer_params(model, i) for i in kinds}
    per_active = {i: _layer_params(model, i, active=True) for i in kinds}
    emb = model.vocab_size * model.hidden
    head = 0 if model.tied_embeddings else emb
    outside = emb + head + norm_params(model)
    total = outside + sum(n * (per[i]["dense"] + per[i]["expert"]) for i, n in kinds.items())
    active = outside + sum(n * (per_active[i]["dense"] + per_active[i]["expert"]) for i, n in kinds.items())
    kind_of = lambda j: max(i for i in kinds if i <= j) if model.is_moe else next(iter(kinds))  # noqa: E731
    layers = tuple(int(round(per[kind_of(j)]["dense"] + per[kind_of(j)]["expert"])) for j in range(model.n_layers))
    return ParamCount(int(round(total)), int(round(active)), emb, head, layers)


# ---- model states ------------------------------------------------------------------------------
@dataclass(frozen=True)
class ModelStates:
    """Bytes per rank of the model states (``int(x)`` / ``.total`` = their sum)."""

    params: float
    grads: float
    optimizer: float
    master: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.master

    def __int__(self):
        return int(round(self.total))

    def __float__(self):
        return float(self.total)


def bytes_per_param(precision: str, optimizer: str, fp32_grad_accum: bool, k: float | None) -> dict:
    """Bytes per parameter of each model state (``param``, ``grad``, ``master``, ``optimizer``, ...) for a
    precision recipe and an optimizer; ``k`` overrides the optimizer-state bytes (the ZeRO paper's K)."""
    check_choice("precision", precision, _PRECISION)
    check_choice("optimizer", optimizer, _STATES)
    p = dict(_PRECISION[precision])
    state = 1 if optimizer == "adam-8bit" else p["state"]
    p["optimizer"] = float(k) if k is not None else _STATES[optimizer] * state
    if fp32_grad_accum and precision != "fp8-dsv3":  # dsv3 already accumulates in fp32
        p["grad"] += 4
    return p


def _sharded(n: float, group: int, on: bool) -> float:
    """Elements one rank holds of ``n`` when ZeRO shards them over ``group`` (flat, padded)."""
    return math.ceil(n / group) if (on and group > 1) else n


@lru_cache(maxsize=64)
def _module_layout(model: ModelConfig) -> tuple[tuple[int, ...], tuple[tuple[int, ...], ...]]:
    """(elements per ZeRO unit, shape of every parameter) of ``Transformer(model)``, built on the
    meta device (no memory); units as ``parallel.zero.default_units`` cuts them, a tied weight
    counted in its first unit only."""
    import torch

    from ..models import Transformer
    from ..parallel.zero import default_units

    with torch.device("meta"):
        module = Transformer(model)
    seen, units = set(), []
    for unit in default_units(module):
        fresh = [p for p in unit.parameters() if id(p) not in seen]
        seen.update(id(p) for p in fresh)
        units.append(sum(p.numel() for p in fresh))
    return tuple(units), tuple(tuple(p.shape) for p in module.parameters())


def sharded_elements(model: ModelConfig, n: int, layout: str, rank: int = 0) -> dict[str, int]:
    """Exact elements per rank when ``n`` ranks shard ``Transformer(model)``'s parameters.

    ``layout="units"`` (``mlsys_nb.parallel.zero``): each unit's flat buffer is padded to a multiple
    of ``n``; ``full`` = the padded buffers (what a rank holds of the parameters below stage 3),
    ``shard`` = their ``1/n``. ``layout="fsdp2"`` (``fully_shard``): every parameter of ``r`` rows is
    split along dim 0 into ``⌈r/n⌉``-row shards; ``full`` = the unpadded parameters. ``layout="flat"``:
    one buffer, ``⌈P/n⌉``. ``total`` = the parameters without padding. ``local``: the unpadded
    elements of ``rank``'s shard, what an optimizer built on FSDP2's local tensors allocates (the
    last ranks hold fewer rows; rank 0 always the most); for the other layouts the shard itself."""
    check_int("rank", rank, 0, n - 1)
    check_choice("layout", layout, ("flat", "units", "fsdp2"))
    units, shapes = _module_layout(model)
    total = sum(units)
    if layout == "units":
        padded = [math.ceil(u / n) * n for u in units]
        return dict(total=total, full=sum(padded), shard=sum(padded) // n, local=sum(padded) // n)
    if layout == "fsdp2":
        rows = [(s[0], math.prod(s) // s[0]) if s else (1, 1) for s in shapes]
        shard = sum(math.ceil(r / n) * c for r, c in rows)
        local = sum(max(0, min(math.ceil(r / n), r - rank * math.ceil(r / n))) * c for r, c in rows)
        return dict(total=total, full=total, shard=shard, local=local)
    return dict(total=total, full=total, shard=math.ceil(total / n), local=math.ceil(total / n))  # "flat"


def model_state_bytes(
    n_params: float,
    *,
    dp: int = 1,
    zero: int = 0,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    fp32_grad_accum: bool = False,
    optimizer_bytes_per_param: float | None = None,
) -> ModelStates:
    """Bytes per rank of params + grads + optimizer states (+ fp32 master) for ``n_params``
    parameters replicated over ``dp`` ranks with ZeRO stage ``zero`` (ZeRO paper, arXiv:1910.02054, §3):
    stage 1 shards optimizer states and master weights, 2 also gradients, 3 also parameters."""
    check_int("zero", zero, 0, 3)
    check_int("dp", dp, 1)
    b = bytes_per_param(precision, optimizer, fp32_grad_accum, optimizer_bytes_per_param)
    return ModelStates(
        params=b["param"] * _sharded(n_params, dp, zero >= 3),
        grads=b["grad"] * _sharded(n_params, dp, zero >= 2),
        optimizer=b["optimizer"] * _sharded(n_params, dp, zero >= 1),
        master=b["master"] * _sharded(n_params, dp, zero >= 1),
    )


# ---- fine-tuning: LoRA / QLoRA -----------------------------------------------------------------
_ROW_PARALLEL = ("o_proj", "down_proj")  # Megatron: input dimension split over TP; the others split the output


def block_linear_shapes(model: ModelConfig) -> dict[str, tuple[int, int]]:
    """``{name: (in_features, out_features)}`` of one block's linear layers (dense models without MLA)."""
    cfg = model
    if cfg.is_moe or cfg.kv_lora_rank:
        raise ArgumentError(f"model must be a dense model without MLA for LoRA's closed forms, got {cfg.name!r}")
    h, q, kv, f = cfg.hidden, cfg.q_dim, cfg.kv_dim, cfg.ffn_hidden
    shapes = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h), "up_proj": (h, f)}
    shapes["down_proj"] = (f, h)
    if cfg.activation == "swiglu":
        shapes["gate_proj"] = (h, f)
    return shapes


def _rank_shapes(model: ModelConfig, tp: int) -> dict[str, tuple[float, float]]:
    """``block_linear_shapes`` as one TP rank holds them: column-parallel layers keep ``out/tp`` outputs (K and V:
    their KV heads, replicated past ``n_kv_heads`` as ``_attn_params`` counts them), row-parallel ones ``in/tp``."""
    kv_heads_rank = model.n_kv_heads / tp if tp <= model.n_kv_heads else 1
    out = {}
    for name, (i, o) in block_linear_shapes(model).items():
        if name in _ROW_PARALLEL:
            out[name] = (i / tp, o)
        elif name in ("k_proj", "v_proj"):
            out[name] = (i, model.head_dim * kv_heads_rank)
        else:
            out[name] = (i, o / tp)
    return out


def block_linear_weights(model: ModelConfig, tp: int = 1) -> float:
    """Weights (elements, biases excluded) of one block's linear layers that one TP rank holds."""
    return sum(i * o for i, o in _rank_shapes(model, tp).values())


def lora_layer_params(model: ModelConfig, r: int, targets=LORA_TARGETS, tp: int = 1) -> float:
    """LoRA parameters (elements) one TP rank holds for one block: ``r·(in + out)`` per targeted linear layer
    (Hu et al. 2021, arXiv:2106.09685) with ``in``/``out`` as the rank holds them: on a column-parallel layer A
    (``in → r``) is replicated and B split with the output, on a row-parallel one A is split with the input and
    B (``r → out``) replicated."""
    check_int("r", r, 1)
    shapes = _rank_shapes(model, tp)
    unknown = [x for x in targets if x not in shapes]
    if unknown:
        raise ArgumentError(f"targets must be among {sorted(shapes)}, got {unknown}")
    return sum(r * (shapes[x][0] + shapes[x][1]) for x in targets)


def finetune_elements(model: ModelConfig, train: TrainConfig, n_rank: float, layers: int) -> dict[str, float]:
    """Elements one rank holds under ``train.finetune``, before ZeRO: ``frozen`` (in the parameter dtype),
    ``quantized`` (QLoRA: the blocks' linear weights, stored in NF4) and ``trainable``. ``n_rank``: the model's
    parameters on this rank (TP/PP/EP applied), ``layers``: its transformer layers."""
    t = train
    if t.finetune == "full":
        return dict(frozen=0.0, quantized=0.0, trainable=n_rank)
    trainable = layers * lora_layer_params(model, t.lora_rank, t.lora_targets, t.tp)
    quantized = layers * block_linear_weights(model, t.tp) if t.finetune == "qlora" else 0.0
    return dict(frozen=n_rank - quantized, quantized=quantized, trainable=trainable)


def _nf4_bytes_per_weight(t: TrainConfig) -> float:
    """Bytes per NF4 weight with double quantization (QLoRA's base), from the format's owner."""
    from ..quant.formats import bits_per_weight

    return bits_per_weight("nf4", t.qlora_group_size, True) / 8


# ---- activations -------------------------------------------------------------------------------
# A term: (name, bytes per token, how TP shards it). Kinds: "rep" = h-wide tensor replicated in the
# TP group (sharded /tp only under SP); "tp" = head- or FFN-split (/tp); "s2" = per token x s
# attention-score tensors (split over heads: /tp); "const" = per layer, not per token; "full" = per token,
# replicated on every TP rank even under SP (LoRA's r-wide A outputs).
def _eager_norm(t: TrainConfig) -> bool:
    """Whether the norms save what PyTorch's composite (decomposed) kernels save: the eager model on a CPU. On
    CUDA, ``nn.RMSNorm`` and ``nn.LayerNorm`` run fused kernels that save the input and fp32 statistics (measured
    with the GPU pack on an H100, torch 2.11), as the ``fused`` stack does."""
    return t.kernels == "eager" and t.device != "cuda"


def _eager_attention_output_copy(t: TrainConfig) -> bool:
    """Whether the eager model's ``transpose(1, 2).reshape`` of SDPA's output copies it (a saved tensor of its
    own, the output projection's input). On a CPU, yes. On CUDA it depends on the kernel PyTorch picks, measured
    on an H100 (torch 2.11): bf16/fp16 run cuDNN attention, whose [b, heads, s, d] output the reshape copies; fp32
    runs the memory-efficient kernel, whose output is laid out [b, s, heads, d] already, so the reshape is a view.
    (FlashAttention-2's kernel, picked for bf16 where cuDNN's is not, lays it out as the latter.)"""
    if t.kernels != "eager":
        return False
    return t.device != "cuda" or _PRECISION[t.precision]["act"] < 4


def _norm_terms(m: ModelConfig, B: int, eager: bool, where: str) -> list:
    h = m.hidden
    if m.norm == "layernorm":  # native_layer_norm: input + mean + rstd (activation dtype on CPU)
        stats = 2 * (B if eager else 4)
        return [(f"{where} norm input", B * h, "rep"), (f"{where} norm mean+rstd", stats, "rep")]
    if not eager:  # fused RMSNorm: input + fp32 rstd
        return [(f"{where} norm input", B * h, "rep"), (f"{where} norm rstd", 4, "rep")]
    # nn.RMSNorm as PyTorch decomposes it: fp32 upcast of the input, fp32 rstd, fp32 normalized x
    return [
        (f"{where} norm input (fp32 upcast)", 4 * h, "rep"),
        (f"{where} norm rstd", 4, "rep"),
        (f"{where} norm normalized (fp32)", 4 * h, "rep"),
    ]


def _moe_layer(m: ModelConfig, layer: int) -> bool:
    """Whether layer ``layer`` (0-based) is a mixture-of-experts layer: the only way ``layer_terms`` depends on it."""
    return m.is_moe and layer >= m.n_dense_layers


def layer_terms(
    model: ModelConfig, train: TrainConfig, *, layer: int | None = None, recompute: str | None = None
) -> list[tuple[str, float]]:
    """Named saved-for-backward tensors of one transformer layer for one micro-batch on one rank:
    ``[(name, bytes), ...]`` after TP/SP/CP division. ``recompute`` overrides ``train.recompute``
    (``"none"`` gives the full working set of one layer)."""
    m, t = model, train
    rc = recompute or t.recompute
    layer = m.n_layers - 1 if layer is None else layer
    B = _PRECISION[t.precision]["act"]
    M = 1 if t.device == "cuda" else B
    eager = t.kernels == "eager"
    h, a, d = m.hidden, m.n_heads, m.head_dim
    s_local = t.seq_len / t.cp
    tokens = t.micro_batch * s_local
    if rc == "full":  # only the block input is kept (Megatron shards it under SP)
        return [("layer input (full recompute)", B * h * tokens / (t.tp if t.sp else 1))]
    drop = m.dropout > 0
    q_w = a * d
    kv_w = q_w if (eager or m.kv_lora_rank) else m.n_kv_heads * d  # eager repeats KV heads for GQA
    v_w = q_w if (eager or m.kv_lora_rank) else m.n_kv_heads * d
    if m.kv_lora_rank:  # MLA: q and k carry the decoupled RoPE part
        q_w = kv_w = a * (d + m.rope_head_dim)
    terms = _norm_terms(m, B, _eager_norm(t), "attention")
    terms += [
        ("attention input (q/k/v proj)", B * h, "rep"),
        ("q", B * q_w, "tp"),
        ("k", B * kv_w, "tp"),
        ("v", B * v_w, "tp"),
    ]
    core = []
    if t.flash_attention:  # FlashAttention's backward needs its output O and the row log-sum-exp (Dao et al.
        # 2022, arXiv:2205.14135, Alg. 4); fused stacks lay O out [s, b, heads x d], so the output projection's
        # saved input is O itself (counted below); eager: SDPA's [b, heads, s, d] output is copied by the reshape
        if _eager_attention_output_copy(t):
            core += [("attention output (flash)", B * a * d, "tp")]
        core += [("softmax log-sum-exp (fp32)", 4 * a, "tp")]
        if eager and t.device == "cuda":  # the kernel's random-number state (seed, offset), saved even without dropout
            core += [("attention kernel RNG seed and offset (2 x int64)", 16, "const")]
    else:
        core += [("softmax output", B * a * t.seq_len, "s2")]
        if drop:
            core += [
                ("attention dropout mask", M * a * t.seq_len, "s2"),
                ("attention dropout output", B * a * t.seq_len, "s2"),
            ]
        if eager:
            core += [("causal mask (bool, per layer)", t.seq_len * s_local, "const")]
    if rc == "none":
        terms += core
    terms += [("output projection input", B * a * d, "tp")]
    if drop:
        terms += [("attention output dropout mask", M * h, "rep")]
    terms += _norm_terms(m, B, _eager_norm(t), "mlp")
    terms += [("mlp input", B * h, "rep")]
    moe = _moe_layer(m, layer)

    def ffn(width: float, name: str, scale: float = 1.0):
        if m.activation == "swiglu" and eager:  # gate out (SiLU input), SiLU out, up out, product (down input)
            return [(f"{name} SwiGLU gate/silu/up/product", scale * 4 * B * width, "tp")]
        if m.activation == "swiglu":  # fused SwiGLU saves only its input (gate and up) and recomputes SiLU in
            # backward (Megatron-LM's core/fusions/fused_bias_swiglu); + product (down input)
            return [(f"{name} SwiGLU gate/up/product (fused)", scale * 3 * B * width, "tp")]
        if m.activation == "gelu":  # GELU input, GELU output (down input)
            return [(f"{name} GELU input/output", scale * 2 * B * width, "tp")]
        return [(f"{name} ReLU output", scale * B * width, "tp")]

    if moe:  # dense dispatch as in mlsys_nb.models.MoE; T*k token slots per rank, also under EP
        k = m.top_k
        terms += [
            ("router probs, top-k ids and weights", B * m.n_experts + 8 * k + B * (k + 1), "rep"),
            ("routed token ids, inputs, outputs, weights", k * (8 + 3 * B * h + B), "rep"),
        ]
        terms += ffn(m.expert_ffn_hidden, "routed experts", k)
        if m.n_shared_experts:
            terms += ffn(m.expert_ffn_hidden, "shared experts", m.n_shared_experts)
    else:
        terms += ffn(m.ffn_hidden, "mlp")
    if drop:
        terms += [("mlp output dropout mask", M * h, "rep")]
    if t.finetune != "full":  # each adapter's r-wide A output, saved for B's weight gradient; A's input is the
        # tensor the frozen layer would have saved anyway (first order: everything else unchanged)
        terms += [("LoRA A outputs (B inputs)", B * t.lora_rank * len(t.lora_targets), "full")]
    out = []
    for name, per_tok, kind in terms:
        if kind == "const":
            out.append((name, per_tok))
            continue
        div = 1 if kind == "full" else (t.tp if (kind in ("tp", "s2") or t.sp) else 1)
        out.append((name, per_tok * tokens / div))
    return out


def _outside_terms(m: ModelConfig, t: TrainConfig, first: bool, last: bool) -> list[tuple[str, float]]:
    B = _PRECISION[t.precision]["act"]
    M = 1 if t.device == "cuda" else B
    tokens = t.micro_batch * t.seq_len / t.cp
    sp = t.tp if t.sp else 1
    vp = t.tp if (t.vocab_parallel and t.tp > 1) else 1
    terms = []
    if first:
        terms.append(("input token ids (int64)", 8 * tokens))
        if m.dropout > 0:
            terms.append(("embedding dropout mask", M * m.hidden * tokens / sp))
    if last:
        terms += [(n, b * tokens / sp) for n, b, _ in _norm_terms(m, B, _eager_norm(t), "final")]
        terms += [
            ("LM head input", B * m.hidden * tokens / sp),
            ("cross-entropy log-probs (fp32)", 4 * m.vocab_size * tokens / vp),
            ("target ids (int64)", 8 * tokens),
            ("loss", 4.0),
        ]
    return terms


def in_flight_microbatches(t: TrainConfig, stage: int) -> float:
    """Micro-batches (in units of one micro-batch through a whole stage) whose activations a
    stage holds at its peak: the pipeline schedule's own closed form (``peak_in_flight``)."""
    if t.pp == 1:
        return 1.0
    return _in_flight_stages(t)[stage]


def _in_flight_stages(t: TrainConfig) -> list[float]:
    """``in_flight_microbatches`` of every stage of a pipeline (``t.pp > 1``): one evaluation of the closed form."""
    if t.pp_schedule == "dualpipe":  # PP + 1 micro-batches in flight (DeepSeek-AI 2024, arXiv:2412.19437, Table 2)
        return [float(min(t.microbatches, t.pp + 1))] * t.pp
    v = t.virtual_stages if t.pp_schedule == "interleaved-1f1b" else None
    return [float(x) for x in peak_in_flight(t.pp_schedule, t.pp, t.microbatches, v)]


# ---- the breakdown ---------------------------------------------------------------------------
@dataclass
class Breakdown:
    """Memory of one rank, in bytes. ``params``/``grads``/``optimizer``/``master`` are the model
    states (``master`` 0 where not used; ``grads`` includes an fp32 accumulation buffer if asked);
    ``activations`` = ``activations_layers`` (all layers on this rank x in-flight micro-batches) +
    ``activations_outside`` (embedding, final norm, head, loss); ``temporary``: transient buffers at
    the peak (ZeRO-3 gathered layers, recompute working set or logits gradient); ``overhead``:
    ``train.overhead_bytes``; ``total`` their sum. ``fits`` compares ``total`` with the GPU. With ``train.offload``
    the model-state fields are what stays on the accelerator, ``host`` the bytes held in host memory
    (``detail["host"]`` by state) and ``offload_bytes_per_step`` the host-link traffic of one step
    (``detail["offload"]``, ``checkpoint.offload.offload_bytes_per_step``); with ``train.finetune`` "lora" or
    "qlora", ``params`` = frozen base + adapters (``detail["finetune"]``), the other states the adapters'."""

    params: float
    grads: float
    optimizer: float
    master: float
    activations: float
    activations_per_layer: float
    activations_layers: float
    activations_outside: float
    temporary: float
    overhead: float
    total: float
    n_params_rank: float  # parameters this rank holds before ZeRO sharding (elements)
    n_params_total: int
    n_params_active: int
    layers: int  # transformer layers on this rank
    in_flight: float  # micro-batches held by the PP schedule
    stage: int
    gpu: str
    gpu_memory: float
    mode: str = "default"
    host: float = 0.0  # bytes held in host memory with train.offload (0 without)
    offload_bytes_per_step: float = 0.0  # bytes over the host link per optimizer step with train.offload
    terms: list = field(default_factory=list, repr=False)  # one layer's (name, bytes)
    detail: dict = field(default_factory=dict, repr=False)

    @property
    def fits(self) -> bool:
        return self.total <= self.gpu_memory

    def fits_on(self, gpu_name: str) -> bool:
        from .. import hardware

        return self.total <= hardware.gpu(gpu_name).memory_bytes

    @property
    def model_states(self) -> float:
        return self.params + self.grads + self.optimizer + self.master

    def to_frame(self):
        """A table of the components (bytes, GB = 1e9 B, GiB = 2**30 B)."""
        import pandas as pd

        rows = [
            ("parameters", self.params),
            ("gradients", self.grads),
            ("optimizer states", self.optimizer),
            ("master weights", self.master),
            ("activations (layers)", self.activations_layers),
            ("activations (outside layers)", self.activations_outside),
            ("temporary buffers", self.temporary),
            ("overhead", self.overhead),
            ("total", self.total),
        ]
        df = pd.DataFrame(rows, columns=["component", "bytes"])
        df["GB"] = df["bytes"] / GB
        df["GiB"] = df["bytes"] / GiB
        return df.set_index("component")

    def as_dict(self) -> dict:
        d = asdict(self)
        d.pop("terms")
        d.pop("detail")
        return d


def check(model: ModelConfig, train: TrainConfig) -> None:
    """Raise ``ValueError`` naming the parameter for impossible combinations."""
    m, t = model, train
    if m.n_heads % t.tp:
        raise ValueError(f"tp={t.tp} must divide n_heads={m.n_heads} (attention heads are split across TP ranks)")
    if not m.kv_lora_rank and t.tp > 1 and m.n_kv_heads % t.tp and t.tp % m.n_kv_heads:
        raise ValueError(
            f"tp={t.tp} and n_kv_heads={m.n_kv_heads}: one must divide the other (KV heads split or replicated)"
        )
    if m.ffn_hidden % t.tp or (m.is_moe and m.expert_ffn_hidden % t.tp):
        raise ValueError(f"tp={t.tp} must divide the FFN width ffn_hidden={m.ffn_hidden}")
    # every pipeline chunk needs at least one layer
    check_int(
        f"pp x virtual_stages = {t.pp} x {t.virtual_stages} (n_layers={m.n_layers})",
        t.pp * t.virtual_stages,
        1,
        m.n_layers if t.pp == 1 else m.n_layers + 2,
    )
    if t.pp_layers is not None:
        stage_layers(m.n_layers, t.pp, t.pp_layers)  # raises naming pp_layers
    if t.pp > 1 and t.virtual_stages > 1:  # the first chunk may hold only the embedding, the last only the head
        check_int(
            f"virtual_stages (n_layers={m.n_layers}, pp={t.pp}: chunks per rank = its layers, + 1 on the first "
            "and on the last stage, Llama 3 §3.3.2)",
            t.virtual_stages,
            1,
            max_chunks(m.n_layers, t.pp, t.pp_layers),
        )
    if t.pp_schedule == "dualpipe" and t.pp > 1 and t.pp % 2:
        raise ValueError(f"pp={t.pp}: pp_schedule='dualpipe' needs an even pp (stage i and pp-1-i share a rank)")
    if t.seq_len % t.cp:
        raise ValueError(f"cp={t.cp} must divide seq_len={t.seq_len}")
    if t.sp and t.seq_len // t.cp % t.tp:
        raise ValueError(f"with sp=True, tp={t.tp} must divide the local sequence length {t.seq_len // t.cp}")
    if t.ep > 1:
        if not m.is_moe:
            raise ValueError(f"ep={t.ep} needs a mixture-of-experts model (n_experts > 0)")
        if m.n_experts % t.ep:
            raise ValueError(f"ep={t.ep} must divide n_experts={m.n_experts}")
        if (t.dp * t.cp) % t.ep:
            raise ValueError(
                f"ep={t.ep} must divide dp x cp = {t.dp * t.cp} (experts are sharded over data-parallel ranks)"
            )
    if t.seq_len > m.seq_len and t.kernels == "eager":
        raise ValueError(f"seq_len={t.seq_len} exceeds the model's seq_len={m.seq_len}")
    if t.pp > 1:
        check_int("n_microbatches", t.microbatches, 1)


def stage_layers(n_layers: int, pp: int, split=None) -> tuple[int, ...]:
    """Transformer layers on each of ``pp`` pipeline stages.

    ``split`` (a published uneven split, e.g. from a paper) is validated and returned. Otherwise
    every stage gets ⌊L/pp⌋ layers and the ``L mod pp`` extra layers go to the middle stages
    1, 2, ... first (the first stage also holds the embedding, the last the LM head and loss), then
    to stage 0 and stage pp-1. For Llama 3.1 405B (126 layers, PP16) this gives 7, 8 x 14, 7: the
    split Meta describes ("one Transformer layer" fewer on the first and the last stage; Llama Team
    2024, arXiv:2407.21783, §3.3.2)."""
    if split is None:
        return _even_stage_layers(n_layers, pp)
    check_int(f"pp (a stage needs a layer: n_layers={n_layers})", pp, 1, n_layers)
    split = tuple(int(x) for x in split)
    if len(split) != pp or sum(split) != n_layers or min(split) < 1:
        raise ValueError(f"pp_layers={split}: need {pp} stage sizes >= 1 summing to n_layers={n_layers}")
    return split


def max_chunks(n_layers: int, pp: int, split=None) -> int:
    """Most interleaved-schedule chunks (``virtual_stages``) each of ``pp`` pipeline ranks can hold: every chunk
    needs a layer, except that the first stage's first chunk may hold only the embedding and the last stage's
    last chunk only the output layer and loss (Llama Team 2024, arXiv:2407.21783, §3.3.2: 126 layers on 16
    stages of 7, 8 x 14, 7 layers make 8 chunks per rank)."""
    sizes = stage_layers(n_layers, pp, split)
    if pp == 1:
        return sizes[0]
    return min(n + (s == 0) + (s == pp - 1) for s, n in enumerate(sizes))


@lru_cache(maxsize=1024, typed=True)
def _even_stage_layers(n_layers: int, pp: int) -> tuple[int, ...]:
    """``stage_layers`` without a published split. Cached (a planner search asks for the same few splits ~10^5
    times); ``typed``: 2 and 2.0 are different keys, so a bad type still raises, an exception is never cached."""
    check_int(f"pp (a stage needs a layer: n_layers={n_layers})", pp, 1, n_layers)
    q, r = divmod(n_layers, pp)
    counts = [q] * pp
    order = (list(range(1, pp - 1)) + [0, pp - 1]) if pp > 2 else list(range(pp))
    for s in order[:r]:
        counts[s] += 1
    return tuple(counts)


def _stage_range(m: ModelConfig, t: TrainConfig, stage: int) -> range:
    sizes = stage_layers(m.n_layers, t.pp, t.pp_layers)
    start = sum(sizes[:stage])
    return range(start, start + sizes[stage])


def stage_params(m: ModelConfig, t: TrainConfig, stage: int) -> tuple[float, float, float, int]:
    """(dense, expert, largest layer) parameters on ``stage`` per TP/EP rank, and its layer count."""
    layers = _stage_range(m, t, stage)
    per = len(layers)
    dense = expert = 0.0
    largest = 0.0
    for i, n in _kinds(m, layers).items():
        lp = _layer_params(m, i, tp=t.tp, ep=t.ep)
        dense += n * lp["dense"]
        expert += n * lp["expert"]
        largest = max(largest, lp["dense"] + lp["expert"])
    vshard = math.ceil(m.vocab_size / t.tp) * m.hidden
    if stage == 0:
        dense += vshard
    if stage == t.pp - 1:
        dense += norm_params(m) + (vshard if (not m.tied_embeddings or t.pp > 1) else 0)
    return dense, expert, largest, per


def _stage_acts(m: ModelConfig, t: TrainConfig, layers: range, one_layer) -> float:
    """Saved activations of one micro-batch through the stage ``layers`` (bytes); ``one_layer(i, recompute)``
    gives layer ``i``'s. With ``t.recompute_layers = k`` the stage's first k layers are recomputed (only their
    inputs kept) and the others keep everything, as Megatron-LM's ``--recompute-method block`` does."""
    k = len(layers) if t.recompute_layers is None else min(t.recompute_layers, len(layers))
    cut = layers.start + k
    kept = "none" if t.recompute_layers is not None else None
    return sum(n * one_layer(i) for i, n in _kinds(m, range(layers.start, cut)).items()) + sum(
        n * one_layer(i, kept) for i, n in _kinds(m, range(cut, layers.stop)).items()
    )


_DTYPE_OF_BYTES = {4: "fp32", 2: "bf16", 1: "fp8"}


def _offload(t: TrainConfig, bpp: dict, states: dict, n_opt: float) -> tuple[dict, dict]:
    """Move the offloaded states of ``states`` (bytes, edited in place) to the host: returns (host bytes by
    state, the step's traffic from ``checkpoint.offload.offload_bytes_per_step``). Model, as ``OffloadAdamW``
    runs it: the host holds an fp32 copy of the parameters it updates (the master), fp32 gradients and the
    optimizer states; the accelerator none of them (gradients stream out during backward; its bucket is not
    counted); ``optimizer+params`` moves the parameters too. ``n_opt``: elements the optimizer updates here."""
    if t.offload == "none":
        return {}, {}
    from ..checkpoint.offload import offload_bytes_per_step

    grad_b, param_b = bpp["grad"], bpp["param"]
    if grad_b not in _DTYPE_OF_BYTES or param_b not in _DTYPE_OF_BYTES:
        raise ArgumentError(
            f"offload={t.offload!r} needs parameters and gradients of 1, 2 or 4 bytes, got {param_b} and {grad_b} "
            f"(precision={t.precision!r}, fp32_grad_accum={t.fp32_grad_accum})"
        )
    on_host = t.offload == "optimizer+params"
    if on_host and t.finetune != "full":
        raise ArgumentError(f"offload='optimizer+params' is modelled for finetune='full' only, got {t.finetune!r}")
    host = {"master (fp32)": 4.0 * n_opt, "gradients (fp32)": 4.0 * n_opt, "optimizer": states["optimizer"]}
    if on_host:
        host["parameters"] = states["param"]
        states["param"] = 0.0
    states["grad"] = states["optimizer"] = states["master"] = 0.0
    traffic = offload_bytes_per_step(
        int(round(n_opt)), _DTYPE_OF_BYTES[grad_b], _DTYPE_OF_BYTES[param_b], params_on_host=on_host
    )
    return host, traffic


def estimate(
    model: ModelConfig, train: TrainConfig | None = None, *, stage: int | None = None, compat: str | None = None
) -> Breakdown:
    """Memory per rank of training ``model`` with ``train`` (bytes; see ``Breakdown``).

    ``stage``: which pipeline stage to report (default: the one with the largest total).
    ``compat="playbook"``: the Ultra-Scale Playbook widget's numbers for the same inputs (bugs
    included; see ``playbook_inputs`` for the mapping)."""
    from .. import hardware

    t = train or TrainConfig()
    if compat is not None:
        check_choice("compat", compat, (None, "playbook"))
        return _playbook_breakdown(model, t)
    check(model, t)
    if stage is not None:
        check_int("stage", stage, 0, t.pp - 1)
    gpu = hardware.gpu(t.gpu)
    bpp = bytes_per_param(t.precision, t.optimizer, t.fp32_grad_accum, t.optimizer_bytes_per_param)
    pc = param_count(model)
    zgroup = t.dp * t.cp
    egroup = zgroup // t.ep
    results = []
    # the stages share these: one layer's saved bytes depend on the layer only through _moe_layer
    per_layer_terms = layer_terms(model, t)
    per_layer = sum(b for _, b in per_layer_terms)
    layer_bytes: dict[tuple, float] = {}  # (MoE layer?, recompute override) -> bytes, for this call only

    def one_layer(i: int, recompute: str | None = None) -> float:
        key = (_moe_layer(model, i), recompute)
        if key not in layer_bytes:
            layer_bytes[key] = sum(b for _, b in layer_terms(model, t, layer=i, recompute=recompute))
        return layer_bytes[key]

    flights = _in_flight_stages(t) if t.pp > 1 else None  # every stage's, computed once

    for st in [stage] if stage is not None else range(t.pp):
        dense, expert, largest, nlay = stage_params(model, t, st)
        stages = [st]
        if t.pp_schedule == "dualpipe" and t.pp > 1:  # DualPipe: this rank also holds stage pp-1-st
            mirror = t.pp - 1 - st
            d2, e2, l2, n2 = stage_params(model, t, mirror)
            dense, expert, largest, nlay = dense + d2, expert + e2, max(largest, l2), nlay + n2
            stages.append(mirror)
        states = {}
        exact = t.zero_layout != "flat" and t.zero >= 1 and zgroup > 1 and t.tp == t.pp == t.ep == t.cp == 1
        exact = exact and t.finetune == "full"  # the units' padding is the full model's
        ft_detail = {}
        if t.finetune != "full":  # LoRA / QLoRA: the frozen base and the adapters, ZeRO over dp x cp
            fe = finetune_elements(model, t, dense + expert, nlay)

            def z(n: float, zmin: int) -> float:
                return _sharded(n, zgroup, t.zero >= zmin)

            frozen = bpp["param"] * z(fe["frozen"], 3)
            if fe["quantized"]:
                frozen += z(fe["quantized"], 3) * _nf4_bytes_per_weight(t)
            adapters = bpp["param"] * z(fe["trainable"], 3)
            states = dict(
                param=frozen + adapters,
                grad=bpp["grad"] * z(fe["trainable"], 2),
                optimizer=bpp["optimizer"] * z(fe["trainable"], 1),
                master=bpp["master"] * z(fe["trainable"], 1),
            )
            n_opt = z(fe["trainable"], 1)
            ft_detail = dict(fe, frozen_bytes=frozen, adapter_bytes=adapters)
        if exact:  # the implementation's own padding (see TrainConfig.zero_layout)
            el = sharded_elements(model, zgroup, t.zero_layout)
            full = el["full"] if t.zero_layout == "units" else el["total"]
            held = dict(
                param=el["shard"] if t.zero >= 3 else full,
                grad=el["shard"] if t.zero >= 2 else full,
                optimizer=el["shard"],
                master=el["shard"],
            )
            states = {key: bpp[key] * held[key] for key in held}
            n_opt = held["optimizer"]
        for key, zmin in (("param", 3), ("grad", 2), ("optimizer", 1), ("master", 1)):
            if exact or ft_detail:
                break
            n = _sharded(dense, zgroup, t.zero >= zmin) + _sharded(expert, egroup, t.zero >= zmin)
            states[key] = bpp[key] * n
            if key == "optimizer":
                n_opt = n
        host, traffic = _offload(t, bpp, states, n_opt)
        stage_layer = _stage_range(model, t, st).start
        acts_layers = sum(_stage_acts(model, t, _stage_range(model, t, s_), one_layer) for s_ in stages)
        acts_layers /= len(stages)  # DualPipe: in-flight micro-batches counted over one stage's layers
        fl = flights[st] if flights else 1.0  # = in_flight_microbatches(t, st)
        acts_layers *= fl
        first, last = 0 in stages, t.pp - 1 in stages
        outside = _outside_terms(model, t, first, last)
        # embedding-side tensors wait for every in-flight micro-batch; the head's are freed by the
        # backward that follows each forward at once (last stage), so they count once
        first_out = _outside_terms(model, t, first, False) if first else []
        acts_out = sum(b for _, b in outside) + sum(b for _, b in first_out) * (fl - 1.0)
        # transient buffers at the peak
        temp = {}
        if t.zero >= 3 and zgroup > 1:  # current + prefetched gathered layer
            if exact and t.zero_layout == "units":  # a unit is gathered into its padded flat buffer
                largest = math.ceil(largest / zgroup) * zgroup
            temp["ZeRO-3 gathered layers (2 x largest)"] = 2 * largest * bpp["param"]
        elif t.offload == "optimizer+params":  # the layer being computed and the one being fetched
            temp["ZeRO-3 gathered layers (2 x largest)"] = 2 * largest * bpp["param"]
        if t.recompute != "none":
            work = one_layer(stage_layer, "none")
            kept = one_layer(stage_layer)
            temp["recompute working set (one layer)"] = work - kept if t.recompute == "selective" else work
        if last:
            vp = t.tp if (t.vocab_parallel and t.tp > 1) else 1
            B = _PRECISION[t.precision]["act"]
            # fused stacks: the logits in the activation dtype and their fp32 gradient; the eager model computes the
            # loss in fp32, and its backward holds the fp32 gradient of the log-probs and of the logits at once (8 B
            # per logit whatever the activation dtype; measured on an H100 by the GPU pack)
            per_logit = 8 if t.kernels == "eager" else 4 + B
            temp["logits + their gradient"] = per_logit * model.vocab_size * t.micro_batch * t.seq_len / t.cp / vp
        temporary = temp.get("ZeRO-3 gathered layers (2 x largest)", 0.0) + max(
            temp.get("recompute working set (one layer)", 0.0), temp.get("logits + their gradient", 0.0)
        )
        acts = acts_layers + acts_out
        total = sum(states.values()) + acts + temporary + t.overhead_bytes
        results.append(
            Breakdown(
                params=states["param"],
                grads=states["grad"],
                optimizer=states["optimizer"],
                master=states["master"],
                activations=acts,
                activations_per_layer=per_layer,
                activations_layers=acts_layers,
                activations_outside=acts_out,
                temporary=temporary,
                overhead=t.overhead_bytes,
                total=total,
                n_params_rank=dense + expert,
                n_params_total=pc.total,
                n_params_active=pc.active,
                layers=nlay,
                in_flight=fl,
                stage=st,
                gpu=t.gpu,
                gpu_memory=gpu.memory_bytes,
                terms=per_layer_terms,
                detail={"temporary": temp, "outside": outside, "host": host, "offload": traffic, "finetune": ft_detail},
                host=sum(host.values()),
                offload_bytes_per_step=traffic.get("total", 0.0),
            )
        )
    return max(results, key=lambda r: r.total)


# ---- the Ultra-Scale Playbook widget, exactly (docs/references.md#playbook-memory-widget) ----
def _playbook_data() -> dict:
    from ..config import load_yaml

    return load_yaml("playbook_memory.yaml")


# the widget's presets and initial page (data/playbook_memory.yaml)
PLAYBOOK_PRESETS = {k: v["inputs"] for k, v in _playbook_data()["presets"].items()}
PLAYBOOK_INITIAL = _playbook_data()["initial"]["inputs"]


def format_playbook_bytes(n: float) -> str:
    """The widget's ``formatBytes``: divides by 1024**i but prints KB/MB/GB/TB (they are KiB...)."""
    if n == 0:
        return "0 Bytes"
    # The widget's list stops at TB and fails from 1 PiB on (4 of 500 random inputs reached it):
    # the units continue in its style, and i is clamped to the list.
    sizes = ["Bytes", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB"]
    i = min(max(int(math.floor(math.log(n) / math.log(1024))), 0), len(sizes) - 1)
    return f"{n / 1024**i:.2f} {sizes[i]}"


def playbook_estimate(
    *,
    a=8,
    b=32,
    h=512,
    h_ff=2048,
    L=12,
    s=128,
    v=30522,
    tp=8,
    k=8,
    dp=1,
    mixed=True,
    seq_parallel=False,
    recomputation="none",
    zero=0,
    ff_activation="relu",
) -> dict:
    """The Playbook widget's numbers exactly (``src/memory.js``; bugs included).

    Returns bytes: ``activations`` (with its parts), ``parameters``, ``gradients``, ``optimizer``,
    ``total``, the widget's parameter count ``N`` and ``shown`` (its label: GiB printed as "GB")."""
    check_choice("recomputation", recomputation, ("none", "selective", "full"))
    check_choice("ff_activation", ff_activation, ("relu", "gelu", "swiglu"))
    zero = int(zero)  # the widget passes a string; JS coerces it in >=
    B = 2 if mixed else 4
    X = 1 / tp if seq_parallel else 1
    sbh = s * b * h
    if recomputation in ("none", "full"):
        if seq_parallel:
            attn = sbh / tp * (5 * B + 1) + (2 * B + 1) * a * s * s * b  # bug: s^2 term not / tp
        else:
            attn = sbh * (4 * B / tp + B + 1) + (2 * B + 1) * a * s * s * b / tp
    else:
        attn = sbh / tp * (5 * B + 1) if seq_parallel else sbh * (4 * B / tp + B + 1)
    ff = {
        "relu": sbh * B * X + s * b * h_ff * B / tp + sbh * X,
        "gelu": sbh * B * X + 2 * s * b * h_ff * B / tp + sbh * X,
        "swiglu": sbh * B * X + 4 * s * b * h_ff * B / tp + sbh * X,
    }[ff_activation]
    ln = sbh * B * X
    parts = {
        "dropout": sbh * X,
        "output layernorm": sbh * B * X,
        "output projection": sbh * B * X,
        "cross entropy": 4 * s * b * v * X,
    }
    if recomputation == "full":
        parts = {"layer inputs": sbh * B * L, **parts}  # bug: never divided by tp
        layers = 0.0
    else:
        layers = L * (attn + ff + 2 * ln)
        parts = {"attention": L * attn, "feedforward": L * ff, "layernorm": L * 2 * ln, **parts}
    act = layers + sum(v_ for k_, v_ in parts.items() if k_ not in ("attention", "feedforward", "layernorm"))
    N = h * (v + s) + L * (12 * h * h + 13 * h) + 2 * h
    kk = k + 4 if mixed else k
    bpp = 2 if mixed else 4
    params = bpp * N / dp if zero >= 3 else bpp * N
    grads = bpp * N / dp if zero >= 2 else bpp * N
    opt = kk * N / dp if zero >= 1 else kk * N
    total = act + params + grads + opt
    return dict(
        N=N,
        activations=act,
        activation_parts=parts,
        parameters=params,
        gradients=grads,
        optimizer=opt,
        total=total,
        shown=format_playbook_bytes(total),
        shown_activations=format_playbook_bytes(act),
    )


def playbook_inputs(model: ModelConfig, train: TrainConfig) -> dict:
    """Map a model/training pair to the widget's inputs (what the widget can express of them)."""
    mixed = train.precision != "fp32"
    k = train.optimizer_bytes_per_param
    if k is None:
        states = bytes_per_param(train.precision, train.optimizer, False, None)["optimizer"]
        k = states * (4 / _PRECISION[train.precision]["state"])
    return dict(
        a=model.n_heads,
        b=train.micro_batch,
        h=model.hidden,
        h_ff=model.ffn_hidden,
        L=model.n_layers,
        s=train.seq_len,
        v=model.vocab_size,
        tp=train.tp,
        k=k,
        dp=train.dp,
        mixed=mixed,
        seq_parallel=train.sp,
        recomputation=train.recompute,
        zero=train.zero,
        ff_activation=model.activation,
    )


def _playbook_breakdown(model: ModelConfig, train: TrainConfig) -> Breakdown:
    from .. import hardware

    r = playbook_estimate(**playbook_inputs(model, train))
    n = r["N"]
    return Breakdown(
        params=r["parameters"],
        grads=r["gradients"],
        optimizer=r["optimizer"],
        master=0.0,
        activations=r["activations"],
        activations_per_layer=float("nan"),
        activations_layers=r["activations"]
        - sum(
            v
            for k, v in r["activation_parts"].items()
            if k in ("dropout", "output layernorm", "output projection", "cross entropy")
        ),
        activations_outside=sum(
            v
            for k, v in r["activation_parts"].items()
            if k in ("dropout", "output layernorm", "output projection", "cross entropy")
        ),
        temporary=0.0,
        overhead=0.0,
        total=r["total"],
        n_params_rank=n,
        n_params_total=n,
        n_params_active=n,
        layers=model.n_layers,
        in_flight=1.0,
        stage=0,
        gpu=train.gpu,
        gpu_memory=hardware.gpu(train.gpu).memory_bytes,
        mode="playbook",
        detail={"playbook": r},
    )


# ---- RLHF: four models and the rollouts' KV cache ---------------------------------------------
def scalar_head_params(model: ModelConfig) -> int:
    """Parameters of ``model`` with its LM head replaced by a scalar head ``Linear(h, 1)`` (critic, reward)."""
    p = param_count(model)
    return p.total - p.head + model.hidden + 1


__all__ += ["scalar_head_params"]
