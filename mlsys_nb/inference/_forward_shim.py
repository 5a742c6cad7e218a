"""TEMPORARY: the decoding forward pass over a ``cache`` for the package's Transformer, until the
model's own ``forward(tokens, *, positions=None, cache=None)`` lands (then this file is deleted)."""
from __future__ import annotations

from ..models.transformer import apply_rope


def packed_forward(model, tokens, positions, cache):
    x = model.embed(tokens)
    cos, sin = model.rope_cos[positions][:, None], model.rope_sin[positions][:, None]  # [b, 1, s, d/2]
    for i, blk in enumerate(model.blocks):
        a, h = blk.attn, blk.attn_norm(x)
        cfg = a.cfg
        b, s, _ = h.shape
        q = a.q_proj(h).view(b, s, cfg.n_heads, cfg.head_dim).transpose(1, 2)
        k = a.k_proj(h).view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        v = a.v_proj(h).view(b, s, cfg.n_kv_heads, cfg.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        y = cache.attend(i, q, k, v).transpose(1, 2).reshape(b, s, cfg.q_dim)
        x = x + a.o_proj(y)
        x = x + blk.mlp(blk.mlp_norm(x))
    return model.lm_head(model.norm(x))
