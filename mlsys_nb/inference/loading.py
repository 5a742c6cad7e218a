"""What the engine is built from: the model, its tokenizer and end-of-sequence ids, and new weights.

``resolve_model`` turns a preset name, a ``ModelConfig`` (random weights from ``seed``), a package
``Transformer`` or a ``transformers`` causal LM (converted, ``models.from_hf``) into the package's
``Transformer``; ``resolve_tokenizer`` picks the tokenizer (a name loads ``transformers``' one; a package model
with a vocabulary of at least 256 gets the byte tokenizer); ``resolve_eos`` the end-of-sequence ids.
``load_state_dict`` takes new weights under the package's parameter names or ``transformers``' ones
(``LLMEngine.load_weights``).
"""

from __future__ import annotations

import torch

from .tokenizer import ByteTokenizer

__all__ = ["is_hf_model", "load_state_dict", "resolve_eos", "resolve_model", "resolve_tokenizer"]


def resolve_model(model, seed: int = 0):
    """A package ``Transformer`` from a preset name, a ``ModelConfig``, a ``Transformer`` or a transformers model."""
    from ..config import ModelConfig, load_model_preset
    from ..models import Transformer

    if isinstance(model, str):
        model = load_model_preset(model)
    if isinstance(model, ModelConfig):
        torch.manual_seed(seed)
        return Transformer(model)
    if isinstance(model, Transformer):
        return model
    if is_hf_model(model):
        from ..models import from_hf

        return from_hf(model)
    raise TypeError(
        f"model={type(model).__name__}: expected a preset name, a ModelConfig, a Transformer "
        "or a transformers causal LM"
    )


def is_hf_model(model) -> bool:
    """A ``transformers`` causal LM (it has ``config`` and ``generate``), not a package ``Transformer``."""
    return hasattr(model, "config") and hasattr(model, "generate") and not hasattr(model, "cfg")


def resolve_eos(tokenizer, hf_model=None) -> set[int]:
    """The end-of-sequence ids: the tokenizer's, else a transformers model's generation config's (or none)."""
    if tokenizer is not None:
        eos = getattr(tokenizer, "eos_token_id", None)
    else:
        eos = getattr(getattr(hf_model, "generation_config", None), "eos_token_id", None)
    return set(eos if isinstance(eos, (list, tuple)) else [] if eos is None else [eos])


def resolve_tokenizer(tokenizer, model, hf: bool = False):
    """``tokenizer`` itself, a ``transformers`` tokenizer for a name, else the byte tokenizer for a package model
    whose vocabulary holds every byte (None for a converted transformers model: token ids only)."""
    if isinstance(tokenizer, str):
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(tokenizer)
    if tokenizer is not None:
        return tokenizer
    if hf:
        return None  # a converted transformers model: token ids only unless its tokenizer is passed
    return ByteTokenizer(model.cfg.vocab_size) if model.cfg.vocab_size >= 256 else None


def load_state_dict(model, state_dict) -> None:
    """Copy ``state_dict`` into ``model`` (a package ``Transformer``) in place, strictly. Its names are the
    package's or ``transformers``' (``model.layers.N...``, e.g. a trained ``LlamaForCausalLM``'s), mapped as
    ``models.from_hf`` does."""
    if any(k.startswith("model.") for k in state_dict):
        from ..models.hf import hf_name_map

        names = hf_name_map(model.cfg)
        missing = [theirs for theirs in names.values() if theirs not in state_dict]
        if missing:
            raise KeyError(f"transformers-style state_dict lacks {missing[:3]} ({len(missing)} missing in all)")
        state_dict = {ours: state_dict[theirs] for ours, theirs in names.items()}
        if model.cfg.tied_embeddings:  # one tensor under both names
            state_dict["lm_head.weight"] = state_dict["embed.weight"]
    with torch.no_grad():
        model.load_state_dict(state_dict, strict=True)
