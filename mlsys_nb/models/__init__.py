"""The package's real small transformer (Llama- or GPT-style), built from a ``ModelConfig``."""
from .transformer import MLP, Attention, Block, MoE, Transformer, build_norm, rope_tables

__all__ = ["MLP", "Attention", "Block", "MoE", "Transformer", "build_norm", "rope_tables"]
