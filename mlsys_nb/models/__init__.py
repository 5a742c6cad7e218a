"""The package's real small transformer (Llama- or GPT-style), built from a ``ModelConfig``.

- ``Transformer(cfg)``: ``forward(tokens, targets=None, *, positions=None, cache=None)``; with a
  cache (``mlsys_nb.inference.KVCache``) it prefills and decodes.
- ``from_hf(hf_model)`` / ``to_hf(model)`` (``hf``): transformers Llama/Qwen2/Mistral <-> Transformer.
"""
from .transformer import MLP, Attention, Block, MoE, Transformer, build_norm, rope_tables

__all__ = ["MLP", "Attention", "Block", "MoE", "Transformer", "build_norm", "config_from_hf", "from_hf",
           "rope_tables", "to_hf"]


def __getattr__(name):  # transformers loads only when a conversion is asked for
    if name in ("from_hf", "to_hf", "config_from_hf"):
        from . import hf

        return getattr(hf, name)
    raise AttributeError(f"module 'mlsys_nb.models' has no attribute {name!r}")
