"""Attention over a paged KV pool: the kernels a ``PagedKVCache`` (``paged.py``) and the engine's runner call.

The pool is ``k_cache``, ``v_cache`` [num_blocks, block_size, n_kv_heads, head_dim] and each sequence reads its K/V
through a *block table* (logical block i -> physical block id; PagedAttention, Kwon et al., 2023,
arXiv:2309.06180, §4). Three ways to attend over it, each checked against contiguous attention
(tests/test_paged.py, tests/test_paged_varlen.py):

- ``paged_attention``: gather each sequence's blocks, then one ``scaled_dot_product_attention`` call
  (grouped-query heads supported), causal relative to each sequence's length. The default.
- ``paged_attention_tiled``: block by block with the online softmax, nothing gathered (PagedAttention's
  kernel idea; ``kernels.tile_partial`` and ``kernels.merge_partials``).
- ``paged_decode_attention_varlen``: one new token per sequence, all sequences' contexts packed as chunks
  (``varlen_decode_chunks``) and attended split-KV as Flash-Decoding does, a fixed number of torch calls per
  layer whatever the batch; ``attention_with_lse`` is the chunk attention that also returns the log-sum-exp.

Units: tokens for lengths and positions, elements for tensor shapes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = [
    "VARLEN_CHUNK_TOKENS",
    "attention_with_lse",
    "paged_attention",
    "paged_attention_tiled",
    "paged_decode_attention_varlen",
    "varlen_decode_chunks",
]


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention of new queries over K/V stored in blocks.

    q: [batch, n_heads, q_len, head_dim], the last ``q_len`` tokens of each sequence;
    k_cache, v_cache: [num_blocks, block_size, n_kv_heads, head_dim] (n_heads a multiple of n_kv_heads);
    block_tables: [batch, max_blocks] int physical block ids (entries past a sequence's end are ignored);
    context_lens: [batch] tokens in each sequence *including* the q_len new ones.
    Query i of sequence b sits at position ``context_lens[b] - q_len + i`` and sees keys 0..that position
    (a row padded to q_len passes the length it would have if its padding were real tokens: its real
    queries see exactly their causal context, its padding rows are finite and meaningless).
    Returns [batch, n_heads, q_len, head_dim]."""
    b, h, q_len, d = q.shape
    n_kv = k_cache.shape[2]
    if h % n_kv:
        raise ValueError(f"n_heads={h} must be a multiple of n_kv_heads={n_kv}")
    flat = block_tables.clamp(min=0).long().reshape(-1)
    # Gather each sequence's blocks in table order: [batch * max_blocks, block_size, n_kv, d]
    # -> [batch, n_kv, T, d] with T = max_blocks * block_size. (A GPU kernel reads the blocks in place.)
    k = k_cache.index_select(0, flat).view(b, -1, n_kv, d).transpose(1, 2)
    v = v_cache.index_select(0, flat).view(b, -1, n_kv, d).transpose(1, 2)
    t = k.shape[2]
    lens = context_lens.to(device=q.device, dtype=torch.long).view(b, 1, 1)
    q_pos = lens - q_len + torch.arange(q_len, device=q.device).view(1, q_len, 1)
    k_pos = torch.arange(t, device=q.device).view(1, 1, t)
    mask = k_pos <= q_pos  # [batch, q_len, T]: causal, and nothing past the sequence's end
    # enable_gqa: query head j reads KV head j // (n_heads // n_kv_heads), as repeat_interleave would
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.unsqueeze(1), scale=scale, enable_gqa=True)


VARLEN_CHUNK_TOKENS = 32  # context tokens per chunk of paged_decode_attention_varlen (whole blocks: 2 of 16; larger
# chunks gather more padding, smaller ones leave more partial results to merge)


def varlen_decode_chunks(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, chunk_tokens: int = VARLEN_CHUNK_TOKENS
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Every sequence's context cut into chunks of ``per = max(1, chunk_tokens // block_size)`` blocks, all
    sequences' chunks packed one after another (padding only in each sequence's last chunk, never to the longest).

    block_tables: [batch, max_blocks] int physical block ids (entries past a sequence's end are ignored);
    context_lens: [batch] tokens of each sequence (each >= 1). Returns ``(blocks, seq, bias)``: ``blocks``
    [chunks * per] the physical block of each chunk slot (a slot past the sequence's table reads its last
    entry, masked), ``seq`` [chunks] the sequence of each chunk, ``bias`` [chunks, per * block_size] fp32,
    0 where the token is in the context and -inf past its end. Built once per step; every layer reuses it."""
    lens = context_lens.to(dtype=torch.long)
    per, dev = max(1, chunk_tokens // block_size), block_tables.device
    c_tok = per * block_size
    n_chunks = (lens + c_tok - 1) // c_tok
    seq = torch.repeat_interleave(torch.arange(len(lens), device=dev), n_chunks)
    first = torch.cumsum(n_chunks, 0) - n_chunks  # first chunk of each sequence
    chunk = torch.arange(len(seq), device=dev) - first[seq]  # index of each chunk within its sequence
    logical = (chunk.unsqueeze(1) * per + torch.arange(per, device=dev)).clamp(max=block_tables.shape[1] - 1)
    blocks = block_tables.long()[seq.unsqueeze(1), logical].reshape(-1)
    pos = chunk.unsqueeze(1) * c_tok + torch.arange(c_tok, device=dev)  # token position of each chunk slot
    bias = torch.zeros(len(seq), c_tok, device=dev).masked_fill_(pos >= lens[seq].unsqueeze(1), float("-inf"))
    return blocks, seq, bias


def attention_with_lse(q, k, v, bias, scale, fused=None):
    """softmax(q k^T * scale + bias) v and its log-sum-exp per query: q [n, H, L, d], k/v [n, H, S, d], bias
    broadcastable to [n, H, L, S] -> ([n, H, L, d] in q's dtype, [n, H, L] fp32). ``fused`` (default: on CPU)
    torch's fused CPU kernel (the one SDPA runs, which also returns the log-sum-exp), else ``kernels.tile_partial``."""
    if q.device.type == "cpu" if fused is None else fused:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, k, v, 0.0, False, attn_mask=bias.to(q.dtype), scale=scale
        )
        return out, lse.float()
    from ..kernels.attention import tile_partial  # the one (out, lse) of a tile, as paged_attention_tiled uses

    out, lse = tile_partial(q.float(), k.float(), v.float(), scale, bias == 0)  # bias: 0 visible, -inf not
    return out.to(q.dtype), lse


def paged_decode_attention_varlen(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    blocks: torch.Tensor,
    seq: torch.Tensor,
    bias: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """Decode attention of one new token per sequence over all sequences' paged K/V in a fixed number of torch
    calls per layer, whatever the batch: the contexts packed as chunks (``varlen_decode_chunks``; FlashAttention's
    "varlen" packing, Dao, 2023, arXiv:2307.08691) and attended split-KV as Flash-Decoding does (Dao et al., 2023).

    q: [batch, n_heads, head_dim], the last token of each sequence (it sees its whole context);
    k_cache, v_cache: [num_blocks, block_size, n_kv_heads, head_dim] (n_heads a multiple of n_kv_heads);
    blocks, seq, bias: ``varlen_decode_chunks(block_tables, context_lens, block_size)``.
    One gather of K and V for all chunks ([chunks, n_kv, chunk_tokens, d]), one attention call over every chunk
    (the n_heads // n_kv_heads query heads of a KV head as its query rows: query head j reads KV head
    j // (n_heads // n_kv_heads)) giving each chunk's output and log-sum-exp, then the chunks of a sequence merged
    by ``kernels.merge_segments`` (a softmax over their log-sum-exps, shifted by the sequence's max so large logits
    stay finite). Merging in fp32. Returns [batch, n_heads, head_dim] in ``q``'s dtype."""
    b, h, d = q.shape
    n_kv = k_cache.shape[2]
    if h % n_kv:
        raise ValueError(f"n_heads={h} must be a multiple of n_kv_heads={n_kv}")
    scale = d**-0.5 if scale is None else scale
    g, (n, c_tok) = h // n_kv, bias.shape
    k = k_cache.index_select(0, blocks).view(n, c_tok, n_kv, d).transpose(1, 2)  # [chunks, n_kv, c_tok, d]
    v = v_cache.index_select(0, blocks).view(n, c_tok, n_kv, d).transpose(1, 2)
    qc = q.reshape(b, n_kv, g, d).index_select(0, seq)  # [chunks, n_kv, g, d]: its sequence's query per chunk
    out, lse = attention_with_lse(qc, k, v, bias.view(n, 1, 1, c_tok), scale)  # [chunks, n_kv, g, d], [.., g]
    from ..kernels.attention import merge_segments  # the one online-softmax merge, over all of a sequence's chunks

    out, _ = merge_segments(out, lse, seq, b)  # the chunks of each sequence: [batch, n_kv, g, d] in fp32
    return out.view(b, h, d).to(q.dtype)


def paged_attention_tiled(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
) -> torch.Tensor:
    """``paged_attention`` block by block with the online softmax: PagedAttention's kernel idea.

    Same arguments and result as ``paged_attention``, but no sequence's K/V is ever gathered into one
    contiguous tensor: column j of the block tables (block j of every sequence) is one tile, its partial
    ``(out, lse)`` computed by ``kernels.tile_partial`` and merged into the running one by
    ``kernels.merge_partials`` (the one online-softmax merge, shared with FlashAttention and ring
    attention). Blocks past every sequence's end are skipped. Memory per step: one block per sequence
    instead of its whole context. Returns [batch, n_heads, q_len, head_dim] in ``q``'s dtype."""
    from ..kernels.attention import merge_partials, tile_partial

    b, h, q_len, d = q.shape
    n_kv, bs = k_cache.shape[2], k_cache.shape[1]
    if h % n_kv:
        raise ValueError(f"n_heads={h} must be a multiple of n_kv_heads={n_kv}")
    scale = d**-0.5 if scale is None else scale
    lens = context_lens.to(device=q.device, dtype=torch.long).view(b, 1, 1)
    q_pos = lens - q_len + torch.arange(q_len, device=q.device).view(1, q_len, 1)  # [b, q_len, 1]
    out = torch.zeros(b, h, q_len, d, dtype=torch.float32, device=q.device)
    lse = torch.full((b, h, q_len), float("-inf"), dtype=torch.float32, device=q.device)
    qf = q.float()
    n_blocks = min(block_tables.shape[1], -(-int(context_lens.max()) // bs))
    for j in range(n_blocks):
        ids = block_tables[:, j].clamp(min=0).long()
        k = k_cache.index_select(0, ids).transpose(1, 2).float()  # [b, n_kv, bs, d]: block j of every sequence
        v = v_cache.index_select(0, ids).transpose(1, 2).float()
        if n_kv != h:  # query head i reads KV head i // (h // n_kv)
            k, v = k.repeat_interleave(h // n_kv, dim=1), v.repeat_interleave(h // n_kv, dim=1)
        k_pos = j * bs + torch.arange(bs, device=q.device).view(1, 1, bs)
        mask = (k_pos <= q_pos).unsqueeze(1)  # [b, 1, q_len, bs]: causal and within the sequence
        out, lse = merge_partials(out, lse, *tile_partial(qf, k, v, scale, mask))
    return out.to(q.dtype)
