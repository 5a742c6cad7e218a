"""Activations: the named saved-for-backward tensors of one transformer layer, and outside the layers.

``layer_terms(model, train)`` lists them for one micro-batch on one rank (bytes, after TP/SP/CP division), so
every number can be traced to a tensor. ``kernels="eager"`` describes this package's ``Transformer`` exactly as
PyTorch runs it (validated on CPU against ``torch.autograd.graph.saved_tensors_hooks``,
``mlsys_nb.models.measure``), ``kernels="fused"`` a GPU training stack (Korthikanti et al. 2022's accounting,
arXiv:2205.05198, eq. 1-2, Table 2). TP shards the head-split and FFN-width terms; SP additionally shards the
h-wide terms (norm inputs, dropout masks); the s^2 attention terms are split over heads (/tp, with or without
SP); CP divides everything by cp. ``fused`` counts a fused SwiGLU's saved input (gate and up, SiLU recomputed in
backward) and FlashAttention's output once (it is the output projection's input).
"""

from __future__ import annotations

from ..config import ModelConfig, TrainConfig
from .units import PRECISION_BYTES


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
    return t.device != "cuda" or PRECISION_BYTES[t.precision]["act"] < 4


def _norm_terms(m: ModelConfig, B: int, eager: bool, where: str) -> list:
    """What one norm saves, per token: its input and statistics (fused kernels), or PyTorch's decomposed
    RMSNorm's fp32 upcast, rstd and normalized input (``eager``); ``B``: activation bytes per element."""
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
    B = PRECISION_BYTES[t.precision]["act"]
    tokens = t.micro_batch * (t.seq_len / t.cp)
    if rc == "full":  # only the block input is kept (Megatron shards it under SP)
        return [("layer input (full recompute)", B * m.hidden * tokens / (t.tp if t.sp else 1))]
    terms = _attention_terms(m, t, keep_core=rc == "none")
    terms += _mlp_terms(m, t, _moe_layer(m, layer))
    if t.finetune != "full":  # each adapter's r-wide A output, saved for B's weight gradient; A's input is the
        # tensor the frozen layer would have saved anyway (first order: everything else unchanged)
        terms += [("LoRA A outputs (B inputs)", B * t.lora_rank * len(t.lora_targets), "full")]
    return _per_rank(terms, t, tokens)


def _attention_terms(m: ModelConfig, t: TrainConfig, keep_core: bool) -> list:
    """The attention half of a layer (norm, q/k/v and their input, the core unless recomputed, the output
    projection's input, dropout): terms per token (see the kinds above)."""
    B = PRECISION_BYTES[t.precision]["act"]
    eager = t.kernels == "eager"
    h, a, d = m.hidden, m.n_heads, m.head_dim
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
    if keep_core:
        terms += _attention_core_terms(m, t)
    terms += [("output projection input", B * a * d, "tp")]
    if m.dropout > 0:
        terms += [("attention output dropout mask", _mask_bytes(t) * h, "rep")]
    return terms


def _mask_bytes(t: TrainConfig) -> int:
    """Bytes per element of a dropout mask: bool on CUDA, the activation dtype on a CPU."""
    return 1 if t.device == "cuda" else PRECISION_BYTES[t.precision]["act"]


def _attention_core_terms(m: ModelConfig, t: TrainConfig) -> list:
    """What the attention core saves (selective recomputation drops it): FlashAttention's output and
    log-sum-exp, or the softmax output (and its dropout) of the unfused kernel."""
    B = PRECISION_BYTES[t.precision]["act"]
    eager = t.kernels == "eager"
    a, d = m.n_heads, m.head_dim
    core = []
    if t.flash_attention:  # FlashAttention's backward needs its output O and the row log-sum-exp (Dao et al.
        # 2022, arXiv:2205.14135, Alg. 4); fused stacks lay O out [s, b, heads x d], so the output projection's
        # saved input is O itself (counted below); eager: SDPA's [b, heads, s, d] output is copied by the reshape
        if _eager_attention_output_copy(t):
            core += [("attention output (flash)", B * a * d, "tp")]
        core += [("softmax log-sum-exp (fp32)", 4 * a, "tp")]
        if eager and t.device == "cuda":  # the kernel's random-number state (seed, offset), saved even without dropout
            core += [("attention kernel RNG seed and offset (2 x int64)", 16, "const")]
        return core
    core += [("softmax output", B * a * t.seq_len, "s2")]
    if m.dropout > 0:
        core += [
            ("attention dropout mask", _mask_bytes(t) * a * t.seq_len, "s2"),
            ("attention dropout output", B * a * t.seq_len, "s2"),
        ]
    if eager:
        core += [("causal mask (bool, per layer)", t.seq_len * (t.seq_len / t.cp), "const")]
    return core


def _mlp_terms(m: ModelConfig, t: TrainConfig, moe: bool) -> list:
    """The MLP half of a layer (norm, input, the FFN or the routed and shared experts, dropout)."""
    B = PRECISION_BYTES[t.precision]["act"]
    terms = _norm_terms(m, B, _eager_norm(t), "mlp")
    terms += [("mlp input", B * m.hidden, "rep")]
    if moe:  # dense dispatch as in mlsys_nb.models.MoE; T*k token slots per rank, also under EP
        k = m.top_k
        terms += [
            ("router probs, top-k ids and weights", B * m.n_experts + 8 * k + B * (k + 1), "rep"),
            ("routed token ids, inputs, outputs, weights", k * (8 + 3 * B * m.hidden + B), "rep"),
        ]
        terms += _ffn_terms(m, t, m.expert_ffn_hidden, "routed experts", k)
        if m.n_shared_experts:
            terms += _ffn_terms(m, t, m.expert_ffn_hidden, "shared experts", m.n_shared_experts)
    else:
        terms += _ffn_terms(m, t, m.ffn_hidden, "mlp")
    if m.dropout > 0:
        terms += [("mlp output dropout mask", _mask_bytes(t) * m.hidden, "rep")]
    return terms


def _ffn_terms(m: ModelConfig, t: TrainConfig, width: float, name: str, scale: float = 1.0) -> list:
    """What one FFN of this width saves, ``scale`` times (the experts a token visits)."""
    B = PRECISION_BYTES[t.precision]["act"]
    if m.activation == "swiglu" and t.kernels == "eager":  # gate out (SiLU input), SiLU out, up out, product
        return [(f"{name} SwiGLU gate/silu/up/product", scale * 4 * B * width, "tp")]
    if m.activation == "swiglu":  # fused SwiGLU saves only its input (gate and up) and recomputes SiLU in
        # backward (Megatron-LM's core/fusions/fused_bias_swiglu); + product (down input)
        return [(f"{name} SwiGLU gate/up/product (fused)", scale * 3 * B * width, "tp")]
    if m.activation == "gelu":  # GELU input, GELU output (down input)
        return [(f"{name} GELU input/output", scale * 2 * B * width, "tp")]
    return [(f"{name} ReLU output", scale * B * width, "tp")]


def _per_rank(terms: list, t: TrainConfig, tokens: float) -> list[tuple[str, float]]:
    """``(name, bytes)`` of each term for ``tokens`` tokens on one rank: divided by its TP sharding."""
    out = []
    for name, per_tok, kind in terms:
        if kind == "const":
            out.append((name, per_tok))
            continue
        div = 1 if kind == "full" else (t.tp if (kind in ("tp", "s2") or t.sp) else 1)
        out.append((name, per_tok * tokens / div))
    return out


class LayerBytes:
    """Saved bytes of one layer (the sum of ``layer_terms``) for a model and a training setup, remembered per
    kind of layer: a layer's bytes depend on its index only through whether it is an MoE layer. Call it as
    ``layer_bytes(i)`` or ``layer_bytes(i, recompute)`` (``recompute`` overrides ``train.recompute``)."""

    def __init__(self, model: ModelConfig, train: TrainConfig):
        self.model, self.train = model, train
        self.cache: dict[tuple, float] = {}  # (MoE layer?, recompute override) -> bytes

    def __call__(self, i: int, recompute: str | None = None) -> float:
        key = (_moe_layer(self.model, i), recompute)
        if key not in self.cache:
            self.cache[key] = sum(b for _, b in layer_terms(self.model, self.train, layer=i, recompute=recompute))
        return self.cache[key]


def outside_terms(m: ModelConfig, t: TrainConfig, first: bool, last: bool) -> list[tuple[str, float]]:
    """Saved tensors outside the transformer layers for one micro-batch on one rank, ``[(name, bytes), ...]``:
    the token ids and embedding dropout on the ``first`` stage, the final norm, head input and loss on the
    ``last``."""
    B = PRECISION_BYTES[t.precision]["act"]
    M = _mask_bytes(t)
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
