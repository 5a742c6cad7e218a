"""Hugging Face checkpoints <-> the package's ``Transformer``.

``from_hf(hf_model)`` builds a ``Transformer`` with the same weights as a ``transformers``
``LlamaForCausalLM``, ``Qwen2ForCausalLM`` or ``MistralForCausalLM`` (the same architecture: RMSNorm,
rotary embeddings with the half-split ``rotate_half`` layout, grouped-query attention, SwiGLU;
Qwen2 adds biases on q/k/v, mapped to ``ModelConfig.qkv_bias``). ``to_hf(model)`` goes the other
way (a ``LlamaForCausalLM``, or ``Qwen2ForCausalLM`` when the model has q/k/v biases).

What is checked and refused with a clear error rather than loaded silently wrong: RoPE scaling
other than ``default`` (e.g. Llama 3.1's ``llama3``, ``yarn``, ``linear``), a sliding window shorter
than the context used, biases on the MLP or output projection, activations other than SiLU.
transformers 5 keeps θ in ``config.rope_parameters["rope_theta"]``; the RMSNorm epsilon
(``rms_norm_eps``, 1e-6 by default in transformers, 1e-5 in this package) is carried over.

Parameter names (``transformers`` 5): ``model.embed_tokens``, ``model.layers.N.self_attn.{q,k,v,o}_proj``,
``model.layers.N.mlp.{gate,up,down}_proj``, ``model.layers.N.{input,post_attention}_layernorm``,
``model.norm``, ``lm_head`` (the same tensor as the embedding when ``tie_word_embeddings``).
"""

from __future__ import annotations

import torch

from ..config import ModelConfig
from .transformer import Transformer

SUPPORTED = ("llama", "qwen2", "mistral")


def _rope_theta(hc) -> float:
    params = getattr(hc, "rope_parameters", None) or {}
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type != "default":
        raise NotImplementedError(
            f"RoPE scaling rope_type={rope_type!r} ({params}) is not implemented by mlsys_nb's Transformer "
            "(it has plain RoPE only): loading would give wrong logits. Supported: rope_type='default'"
        )
    theta = params.get("rope_theta", getattr(hc, "rope_theta", None))
    if theta is None:
        raise ValueError("the config has no rope_theta (expected config.rope_parameters['rope_theta'])")
    return float(theta)


def config_from_hf(hc, *, seq_len: int | None = None) -> ModelConfig:
    """The ``ModelConfig`` of a transformers Llama/Qwen2/Mistral config (errors for what is unsupported)."""
    mt = getattr(hc, "model_type", None)
    if mt not in SUPPORTED:
        raise NotImplementedError(f"model_type={mt!r}: from_hf supports {SUPPORTED}")
    if getattr(hc, "hidden_act", "silu") != "silu":
        raise NotImplementedError(f"hidden_act={hc.hidden_act!r}: only 'silu' (SwiGLU) is mapped")
    if getattr(hc, "mlp_bias", False):
        raise NotImplementedError("mlp_bias=True: the package's SwiGLU MLP has no biases unless all layers do")
    theta = _rope_theta(hc)
    seq_len = seq_len or hc.max_position_embeddings
    window = getattr(hc, "sliding_window", None)
    uses_window = window is not None and (mt == "mistral" or getattr(hc, "use_sliding_window", False))
    if uses_window and seq_len > window:
        raise NotImplementedError(
            f"sliding_window={window} < seq_len={seq_len}: the package attends to the whole context; pass "
            f"seq_len <= {window} to from_hf (identical attention up to that length)"
        )
    attn_bias = bool(getattr(hc, "attention_bias", False))
    if mt == "llama" and attn_bias:
        raise NotImplementedError("attention_bias=True on Llama also biases o_proj: not mapped")
    head_dim = getattr(hc, "head_dim", None) or hc.hidden_size // hc.num_attention_heads
    return ModelConfig(
        n_layers=hc.num_hidden_layers,
        hidden=hc.hidden_size,
        n_heads=hc.num_attention_heads,
        n_kv_heads=hc.num_key_value_heads or hc.num_attention_heads,
        head_dim=head_dim,
        vocab_size=hc.vocab_size,
        ffn_hidden=hc.intermediate_size,
        seq_len=seq_len,
        tied_embeddings=bool(hc.tie_word_embeddings),
        activation="swiglu",
        norm="rmsnorm",
        bias=False,
        qkv_bias=mt == "qwen2",
        rope_theta=theta,
        norm_eps=float(hc.rms_norm_eps),
        name=getattr(hc, "_name_or_path", "") or mt,
    )


def hf_name_map(cfg: ModelConfig) -> dict[str, str]:
    """The kit's parameter name -> the ``transformers`` (Llama-layout) parameter name, for ``cfg``."""
    m = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}
    if not cfg.tied_embeddings:
        m["lm_head.weight"] = "lm_head.weight"
    for i in range(cfg.n_layers):
        p, h = f"blocks.{i}.", f"model.layers.{i}."
        m[p + "attn_norm.weight"] = h + "input_layernorm.weight"
        m[p + "mlp_norm.weight"] = h + "post_attention_layernorm.weight"
        for proj in ("q", "k", "v", "o"):
            m[f"{p}attn.{proj}_proj.weight"] = f"{h}self_attn.{proj}_proj.weight"
        if cfg.qkv_bias:
            for proj in ("q", "k", "v"):
                m[f"{p}attn.{proj}_proj.bias"] = f"{h}self_attn.{proj}_proj.bias"
        for proj in ("gate", "up", "down"):
            m[f"{p}mlp.{proj}_proj.weight"] = f"{h}mlp.{proj}_proj.weight"
    return m


def from_hf(hf_model, *, seq_len: int | None = None, dtype=None) -> Transformer:
    """A ``Transformer`` with the weights of a transformers Llama/Qwen2/Mistral causal LM.

    ``seq_len``: the context (RoPE table size) to build, default ``max_position_embeddings``;
    ``dtype``: default the checkpoint's. The result is in eval mode on the checkpoint's device."""
    cfg = config_from_hf(hf_model.config, seq_len=seq_len)
    src = hf_model.state_dict()
    ref = next(iter(src.values()))
    with torch.device("meta"):
        model = Transformer(cfg)
    names = hf_name_map(cfg)
    state = {}
    for ours, theirs in names.items():
        if theirs not in src:
            raise KeyError(f"{theirs} is missing from the checkpoint's state_dict (expected for {cfg.name})")
        state[ours] = src[theirs].to(dtype or ref.dtype)
    model.load_state_dict(state, strict=False, assign=True)
    if cfg.tied_embeddings:
        model.lm_head.weight = model.embed.weight
    left = [n for n, p in model.named_parameters() if p.is_meta]
    if left:
        raise RuntimeError(f"parameters not loaded from the checkpoint: {left}")
    model.rope_cos, model.rope_sin = _rope(cfg, ref.device)
    return model.eval()


def _rope(cfg: ModelConfig, device):
    from .transformer import rope_tables

    return rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta, device=device)


def to_hf(model: Transformer):
    """A transformers ``LlamaForCausalLM`` (``Qwen2ForCausalLM`` with q/k/v biases) with the same weights."""
    import transformers

    cfg = model.cfg
    bad = [
        f"{k}={getattr(cfg, k)!r}"
        for k, ok in (
            ("activation", cfg.activation == "swiglu"),
            ("norm", cfg.norm == "rmsnorm"),
            ("bias", not cfg.bias),
            ("n_experts", cfg.n_experts == 0),
            ("kv_lora_rank", cfg.kv_lora_rank == 0),
        )
        if not ok
    ]
    if bad:
        raise NotImplementedError(f"to_hf maps Llama-style models only (swiglu, rmsnorm, no bias, dense); got {bad}")
    kw = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "max_position_embeddings": cfg.seq_len,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta},
        "tie_word_embeddings": cfg.tied_embeddings,
        "hidden_act": "silu",
    }
    if cfg.qkv_bias:
        hc, cls = transformers.Qwen2Config(**kw, use_sliding_window=False), transformers.Qwen2ForCausalLM
    else:
        hc, cls = transformers.LlamaConfig(**kw, attention_bias=False, mlp_bias=False), transformers.LlamaForCausalLM
    p = next(model.parameters())
    hf = cls(hc).to(device=p.device, dtype=p.dtype)
    ours = model.state_dict()
    state = {theirs: ours[mine] for mine, theirs in hf_name_map(cfg).items()}
    missing, unexpected = hf.load_state_dict(state, strict=False)
    missing = [n for n in missing if not (cfg.tied_embeddings and n == "lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"to_hf mapping incomplete: missing {missing}, unexpected {unexpected}")
    if cfg.tied_embeddings:
        hf.tie_weights()
    return hf.eval()
