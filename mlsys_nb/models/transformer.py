"""A small decoder-only transformer, readable in one sitting (nanoGPT/Llama style).

Built from ``mlsys_nb.config.ModelConfig``: RMSNorm or LayerNorm, rotary position embeddings,
grouped-query attention, a SwiGLU/GELU/ReLU MLP or a top-k mixture of experts, dropout, a tied or
untied LM head, and optional activation recomputation:

- ``recompute="none"``: every intermediate is saved for backward;
- ``recompute="selective"``: the attention core (scores, softmax, dropout, weighted sum) is
  recomputed in backward, as in Korthikanti et al. 2022;
- ``recompute="full"``: only each block's input is saved; the block is recomputed in backward.

Decoding: ``forward(tokens, cache=cache)`` runs prefill (a whole prompt) and decode (one new token
per sequence) through the same code. Each attention layer computes q, k, v, rotates q and k at the
tokens' absolute positions, and hands them to ``cache.attend(layer_idx, q, k, v)``, which stores k, v
and returns the attention of the new queries over everything cached so far. The protocol (and a
contiguous implementation) is in ``mlsys_nb.inference.kv_cache``.

``attn_impl="sdpa"`` uses ``F.scaled_dot_product_attention``; ``attn_impl="matmul"`` writes the
attention out as explicit matmuls so ``FlopCounterMode`` can count it (SDPA counts 0 FLOPs on CPU)
and saved tensors are visible one by one. Both give the same output (tested).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..config import RECOMPUTE, ModelConfig, check_choice, check_int

from .routing import check_router_args, load_balancing_loss, load_balancing_terms, route, update_bias, z_loss_sum

ATTN_IMPLS = ("sdpa", "matmul")


def build_norm(cfg: ModelConfig) -> nn.Module:
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
    return nn.LayerNorm(cfg.hidden, eps=cfg.norm_eps, bias=cfg.bias)


def rope_tables(head_dim: int, seq_len: int, theta: float = 10000.0, device=None):
    """cos and sin tables of shape [seq_len, head_dim // 2] for rotary embeddings."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    return angles.cos(), angles.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x[..., :d/2], x[..., d/2:]) of x [b, heads, s, d] by position angles.

    cos, sin: [s, d/2] (the same positions for every sequence) or [b, 1, s, d/2] (per sequence)."""
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2], x[..., d2:]
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


def attention_core(q, k, v, *, dropout_p: float = 0.0, impl: str = "sdpa", training: bool = False):
    """Causal attention of q [b, a, s, d] over k, v [b, a, s, d] (KV heads already repeated)."""
    if impl == "sdpa":
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=dropout_p if training else 0.0)
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = F.dropout(scores.softmax(dim=-1), p=dropout_p, training=training)
    return probs @ v


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, attn_impl: str = "sdpa", layer_idx: int = 0):
        super().__init__()
        self.cfg, self.attn_impl, self.layer_idx = cfg, attn_impl, layer_idx
        qkv_bias = cfg.bias or cfg.qkv_bias
        self.q_proj = nn.Linear(cfg.hidden, cfg.q_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(cfg.hidden, cfg.kv_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(cfg.hidden, cfg.kv_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(cfg.q_dim, cfg.hidden, bias=cfg.bias)
        self.selective_recompute = False

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache=None) -> torch.Tensor:
        """x [b, s, hidden]; cos, sin: the full RoPE tables [seq_len, d/2] (positions 0..s-1 are used)
        or per-token tables [b, 1, s, d/2]; with ``cache`` the attention is ``cache.attend``."""
        cfg = self.cfg
        b, s, _ = x.shape
        # heads = -1: under PyTorch tensor parallelism (ColwiseParallel) a rank holds n_heads / tp heads
        q = self.q_proj(x).view(b, s, -1, cfg.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, -1, cfg.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, -1, cfg.head_dim).transpose(1, 2)
        if cos.dim() == 2:
            cos, sin = cos[:s], sin[:s]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:  # the cache stores k, v (n_kv_heads) and owns attention over its tokens
            y = cache.attend(self.layer_idx, q, k, v).transpose(1, 2).reshape(b, s, cfg.q_dim)
            return F.dropout(self.o_proj(y), p=cfg.dropout, training=self.training)
        group = cfg.n_heads // cfg.n_kv_heads
        if group > 1:  # grouped-query attention: each KV head serves `group` query heads
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        kw = {"dropout_p": cfg.dropout, "impl": self.attn_impl, "training": self.training}
        if self.selective_recompute and torch.is_grad_enabled():
            y = checkpoint(attention_core, q, k, v, use_reentrant=False, **kw)
        else:
            y = attention_core(q, k, v, **kw)
        y = y.transpose(1, 2).reshape(b, s, -1)
        return F.dropout(self.o_proj(y), p=cfg.dropout, training=self.training)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)); GELU/ReLU: down(act(up(x)))."""

    def __init__(self, cfg: ModelConfig, width: int | None = None):
        super().__init__()
        self.cfg = cfg
        width = width or cfg.ffn_hidden
        if cfg.activation == "swiglu":
            self.gate_proj = nn.Linear(cfg.hidden, width, bias=cfg.bias)
        self.up_proj = nn.Linear(cfg.hidden, width, bias=cfg.bias)
        self.down_proj = nn.Linear(width, cfg.hidden, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = self.cfg.activation
        if act == "swiglu":
            h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        elif act == "gelu":
            h = F.gelu(self.up_proj(x))
        else:
            h = F.relu(self.up_proj(x))
        return F.dropout(self.down_proj(h), p=self.cfg.dropout, training=self.training)


class MoE(nn.Module):
    """Top-k routed experts (+ shared experts), computed by dense dispatch: each expert runs on
    the tokens routed to it and its output is weighted by the renormalised gate weight.

    ``gating``: ``"softmax"`` (top-k of softmax) or ``"sigmoid"`` (DeepSeek-V3: top-k of
    sigmoid + ``router_bias``, weights renormalised; the bias buffer is moved by ``update_bias``,
    not by gradients). ``capacity_factor``: None (no drops) or cf > 0: each expert accepts
    ``⌈cf·T·k/E⌉`` assignments of the batch's T tokens, filled first choices first, tokens in order
    (``mlsys_nb.models.routing``). After each forward: ``last_routing`` (choices, weights, which
    assignments were dropped), ``last_aux_loss`` (Switch/GShard load-balancing loss, 1.0 when
    uniform), ``last_z_loss`` (router z-loss), ``last_load`` (kept assignments per expert) and
    ``last_dropped`` (dropped assignments). The losses are differentiable and *not* added to the
    output: add ``α·last_aux_loss + β·last_z_loss`` to your loss."""

    def __init__(self, cfg: ModelConfig, *, gating: str = "softmax", capacity_factor: float | None = None):
        super().__init__()
        check_router_args(cfg.n_experts, cfg.top_k, gating, capacity_factor)
        self.cfg, self.gating, self.capacity_factor = cfg, gating, capacity_factor
        self.router = nn.Linear(cfg.hidden, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg, cfg.expert_ffn_hidden) for _ in range(cfg.n_experts))
        self.shared = nn.ModuleList(MLP(cfg, cfg.expert_ffn_hidden) for _ in range(cfg.n_shared_experts))
        self.register_buffer("router_bias", torch.zeros(cfg.n_experts), persistent=False)
        self.last_routing = self.last_aux_loss = self.last_z_loss = self.last_load = None
        self.last_dropped = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        E, T = self.cfg.n_experts, flat.shape[0]
        r = route(
            self.router(flat),
            self.cfg.top_k,
            gating=self.gating,
            bias=self.router_bias,
            capacity_factor=self.capacity_factor,
        )
        counts, prob_sums = load_balancing_terms(r, E)
        self.last_routing, self.last_dropped = r, r.dropped
        self.last_aux_loss = load_balancing_loss(counts, prob_sums, T, self.cfg.top_k)
        self.last_z_loss = z_loss_sum(r.logits) / T
        self.last_load = r.counts(E, kept_only=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            token, slot = ((r.idx == e) & r.keep).nonzero(as_tuple=True)
            if token.numel():
                out.index_add_(0, token, expert(flat[token]) * r.weight[token, slot, None])
        for expert in self.shared:
            out = out + expert(flat)
        return out.view(b, s, h)

    def update_bias(self, gamma: float = 1e-3, load: torch.Tensor | None = None) -> None:
        """Auxiliary-loss-free balancing step on ``router_bias`` from ``load`` (default: the last
        forward's assignments per expert before drops)."""
        update_bias(self.router_bias, self.last_routing.counts(self.cfg.n_experts) if load is None else load, gamma)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer_idx: int = 0, attn_impl: str = "sdpa"):
        super().__init__()
        self.attn_norm = build_norm(cfg)
        self.attn = Attention(cfg, attn_impl, layer_idx)
        self.mlp_norm = build_norm(cfg)
        moe = cfg.is_moe and layer_idx >= cfg.n_dense_layers
        self.mlp = MoE(cfg) if moe else MLP(cfg)

    def forward(self, x, cos, sin, cache=None):
        x = x + self.attn(self.attn_norm(x), cos, sin, cache)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    """Decoder-only LM: embedding -> dropout -> L blocks -> final norm -> LM head.

    ``forward(tokens)`` returns logits [b, s, vocab]; ``forward(tokens, targets)`` returns the mean
    cross-entropy loss (a scalar). ``positions`` ([s] or [b, s] absolute positions, int64) sets the
    RoPE angles (default 0..s-1). ``forward(tokens, cache=cache)`` (inference) asks the cache for
    the positions of the new tokens (``cache.begin``), lets it attend in every layer
    (``cache.attend``) and commits the new lengths (``cache.commit``) after the last layer; see
    ``mlsys_nb.inference.kv_cache`` for the protocol."""

    def __init__(self, cfg: ModelConfig, *, recompute: str = "none", attn_impl: str = "sdpa"):
        super().__init__()
        check_choice("recompute", recompute, RECOMPUTE)
        check_choice("attn_impl", attn_impl, ATTN_IMPLS)
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden)
        self.blocks = nn.ModuleList(Block(cfg, i, attn_impl) for i in range(cfg.n_layers))
        self.norm = build_norm(cfg)
        self.lm_head = nn.Linear(cfg.hidden, cfg.vocab_size, bias=False)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.set_recompute(recompute)
        if not self.embed.weight.is_meta:  # a meta build has no values to set (and init there costs seconds)
            self.apply(self._init_weights)

    @staticmethod
    def _init_weights(m):
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def set_recompute(self, mode: str) -> None:
        check_choice("mode", mode, RECOMPUTE)
        self.recompute = mode
        for blk in self.blocks:
            blk.attn.selective_recompute = mode == "selective"

    def set_attn_impl(self, impl: str) -> None:
        check_choice("impl", impl, ATTN_IMPLS)
        for blk in self.blocks:
            blk.attn.attn_impl = impl

    def num_parameters(self, *, exclude_embedding: bool = False) -> int:
        """Unique parameters (a tied head counts once)."""
        n = sum(p.numel() for p in self.parameters())
        if exclude_embedding:
            n -= self.embed.weight.numel()
            if not self.cfg.tied_embeddings:
                n -= self.lm_head.weight.numel()
        return n

    def _rope_at(self, positions: torch.Tensor, b: int, s: int, check: bool = True):
        """Per-token RoPE tables [b, 1, s, d/2] for absolute ``positions`` ([s] or [b, s]).

        ``check``: bound every position to [0, cfg.seq_len) (reads min and max back to the host: a device sync,
        which a CUDA graph's capture refuses; a cache whose positions were checked on the host says so)."""
        if positions.dim() == 1:
            positions = positions.unsqueeze(0).expand(b, s)
        if tuple(positions.shape) != (b, s):
            raise ValueError(f"positions has shape {tuple(positions.shape)}: expected ({b}, {s}) or ({s},)")
        if check and positions.numel():
            for bound in (int(positions.min()), int(positions.max())):
                check_int(f"each of positions (cfg.seq_len={self.cfg.seq_len})", bound, 0, self.cfg.seq_len - 1)

        return self.rope_cos[positions].unsqueeze(1), self.rope_sin[positions].unsqueeze(1)

    def forward(
        self,
        tokens: torch.Tensor,
        targets: torch.Tensor | None = None,
        *,
        positions: torch.Tensor | None = None,
        cache=None,
    ):
        b, s = tokens.shape
        if cache is not None:
            cache_positions = cache.begin(b, s)  # [b, s]: cached length + 0..s-1 of each sequence
            positions = cache_positions if positions is None else positions
        elif s > self.cfg.seq_len:
            raise ValueError(f"sequence length {s} exceeds cfg.seq_len={self.cfg.seq_len}")
        if positions is None:
            cos, sin = self.rope_cos, self.rope_sin
        else:
            checked = getattr(cache, "positions_checked", False)  # built on the host from checked lengths
            cos, sin = self._rope_at(positions.to(self.rope_cos.device), b, s, check=not checked)
        x = F.dropout(self.embed(tokens), p=self.cfg.dropout, training=self.training)
        for blk in self.blocks:
            if cache is not None:
                x = blk(x, cos, sin, cache)
            elif self.recompute == "full" and torch.is_grad_enabled():
                x = checkpoint(blk, x, cos, sin, use_reentrant=False)
            else:
                x = blk(x, cos, sin)
        if cache is not None:
            cache.commit()  # only now do the new tokens count as cached
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1))
