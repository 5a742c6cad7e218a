"""Second routes of the topic ``tensor``: TP bytes and times by hand, parameters counted on the real
model's modules, SP's activation saving from the hand list of saved tensors."""

from __future__ import annotations

from .memory import acts_per_token, outside_bytes
from .model import cfg_of, model_counts
from .registry import register_route


@register_route("tensor.tp_bytes_per_layer", "tensor.sp_bytes_per_layer")
def _(p):
    return 2 * 2 * (p["tp"] - 1) / p["tp"] * p["b"] * p["s"] * p["h"] * 2


@register_route("tensor.tp_allreduce_time_per_layer")
def _(p):
    n, S = p["tp"], p["b"] * p["s"] * p["h"] * 2
    return 2 * (2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * S / p["beta"])


@register_route("tensor.params_per_rank")
def _(p):
    """Parameters counted on the real model's modules (meta device), split as Megatron splits them."""
    m = model_counts(p["model"])
    split = m["linear"] + (0 if m["cfg"].tied_embeddings else m["embedding"])  # vocab-parallel embedding
    return split / p["tp"] + m["norms"]


@register_route("tensor.sp_activation_saving")
def _(p):
    """Each saved tensor written out by hand, split by TP with and without SP."""
    cfg, s, tp = cfg_of(p["model"]), p["seq_len"], p["tp"]
    total = {
        sp: cfg.n_layers * s * acts_per_token(cfg, seq_len=s, tp=tp, sp=sp) + outside_bytes(cfg, s, tp, sp)
        for sp in (False, True)
    }
    return total[False] / total[True]
