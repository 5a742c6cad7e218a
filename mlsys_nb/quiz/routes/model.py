"""What the routes read off the real model (``mlsys_nb.models.Transformer`` on the meta device) and
the hardware tables: element counts, the KV cache per token by hand, bytes per dtype, GPU memory, bf16 peak."""

from __future__ import annotations

import re
from functools import cache

from ... import hardware

BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp32": 4}


@cache
def _built(cfg) -> dict:
    import torch

    from ...models import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    norms = sum(p.numel() for m in model.modules() if "Norm" in type(m).__name__ for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in model.parameters())  # tied tensors once
    experts = [m for name, m in model.named_modules() if re.search(r"experts\.\d+$", name)]
    expert = sum(p.numel() for p in experts[0].parameters()) if experts else 0
    n_moe = sum(1 for name, _ in model.named_modules() if re.search(r"experts$", name))
    return dict(total=total, linear=linear, norms=norms, expert=expert, n_moe=n_moe)


@cache
def meta_counts(cfg) -> dict:
    """Element counts read off ``mlsys_nb.models.Transformer`` built on the meta device: ``total``
    (tied tensors once), ``linear`` (every nn.Linear weight: the matmul weights, LM head included),
    ``norms``, ``embedding``, ``expert`` (one routed expert's weights), ``n_moe`` (layers with routed
    experts). Layers are identical, so the 1- and 2-layer models are built and the difference is
    counted ``n_layers − 1`` more times (seconds saved on a 405B model; exact)."""
    if cfg.n_dense_layers:  # layers of two kinds: build them all
        out = dict(_built(cfg))
    else:
        one, two = _built(cfg.replace(n_layers=1)), _built(cfg.replace(n_layers=2))
        out = {k: one[k] + (cfg.n_layers - 1) * (two[k] - one[k]) for k in ("total", "linear", "norms", "n_moe")}
        out["expert"] = one["expert"]
    return dict(out, cfg=cfg, embedding=cfg.vocab_size * cfg.hidden)


def cfg_of(name):
    """The preset ``ModelConfig`` called ``name``."""
    from ...memory import preset

    return preset(name)


def model_counts(name) -> dict:
    """``meta_counts`` of the preset ``name``."""
    return meta_counts(cfg_of(name))


def kv_per_token(cfg, nbytes=2.0) -> float:
    """K and V of every layer (MHA/GQA): 2·L·n_kv·d·bytes; MLA: (latent + RoPE key)·L·bytes."""
    if cfg.kv_lora_rank:
        return (cfg.kv_lora_rank + cfg.rope_head_dim) * cfg.n_layers * nbytes
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * nbytes


def gpu_bytes(name) -> float:
    """Memory of GPU ``name`` in bytes (the hardware table)."""
    return hardware.gpu(name).memory_bytes


def peak_bf16(gpu) -> float:
    """Dense bf16 peak of GPU ``gpu`` in FLOP/s (the hardware table)."""
    return hardware.gpu(gpu).peak("bf16")
