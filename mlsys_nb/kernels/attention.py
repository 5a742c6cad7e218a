"""Attention three ways, in plain PyTorch: the O(s²) reference, FlashAttention's tiles, FlashDecoding's split-K.

Shapes: ``q`` is ``[batch, heads, s_q, head_dim]``, ``k`` and ``v`` are ``[batch, kv_heads, s_k, head_dim]``
with ``heads`` a multiple of ``kv_heads`` (grouped-query attention: query head ``h`` reads KV head
``h // (heads // kv_heads)``, as ``repeat_interleave`` and SDPA's ``enable_gqa``). Softmax scale ``1/sqrt(d)``.

**Causal, bottom-right aligned.** With ``s_q <= s_k`` the queries are the *last* ``s_q`` positions of
the sequence (the KV-cache convention: a decode step's one query sees every cached key): query row ``i``
sees key ``j`` iff ``j <= i + (s_k - s_q)``. SDPA's ``is_causal=True`` is top-left aligned instead
(row ``i`` sees ``j <= i``); the two agree only when ``s_q == s_k``.

**The online softmax** (Dao et al. 2022, arXiv:2205.14135, Sec. 3.1; Milakov & Gimelshein 2018). A
partial result over some keys is a pair ``(o, lse)``: ``o`` the softmax-weighted sum of their values,
normalised over those keys only, and ``lse = log Σ exp(scores)`` over them. Two partials over disjoint
key sets merge exactly (``merge_partials``)::

    lse = log(e^lse_a + e^lse_b),   o = e^(lse_a − lse) · o_a + e^(lse_b − lse) · o_b

The factor ``e^(lse_a − lse)`` is the *rescale*: the old output was normalised by a sum that is now
too small. This is FlashAttention's running max and running sum in log form (the max is folded into
``lse``). The same merge joins ring attention's blocks (``parallel/context.py``) and FlashDecoding's
splits (``flash_decode``).

**Backward without the s×s matrix** (FlashAttention-2, Dao 2023, arXiv:2307.08691, Alg. 2). Saved:
``q, k, v, o`` and ``lse`` (``s_q`` numbers per head). Per tile the scores are recomputed and
``P = exp(S − lse)``; with ``D = rowsum(dO ∘ O)``: ``dV += Pᵀ dO``, ``dP = dO Vᵀ``,
``dS = P ∘ (dP − D)``, ``dQ += dS K / sqrt(d)``, ``dK += dSᵀ Q / sqrt(d)``. ``D`` is the row term of
the softmax Jacobian (``Σ_j P_ij dP_ij = dO_i · O_i``); without it the gradients are wrong.
"""

from __future__ import annotations

import math

import torch

from ..config import check_int

__all__ = [
    "naive_attention",
    "flash_attention",
    "flash_decode",
    "decode_splits",
    "decode_key_blocks",
    "fill_splits",
    "merge_partials",
    "merge_segments",
    "segment_max",
    "tile_partial",
    "causal_mask",
    "check_shapes",
    "row_term",
]


def check_shapes(q, k, v, causal) -> int:
    """Check attention inputs (4-d, matching batch and head_dim, GQA heads, causal ``s_q <= s_k``); the group size."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-d tensor [batch, heads, seq, head_dim], got {getattr(t, 'shape', t)}")
    if k.shape != v.shape:
        raise ValueError(f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}")
    b, h, sq, d = q.shape
    if k.shape[0] != b or k.shape[3] != d:
        raise ValueError(f"k must be [batch={b}, kv_heads, s_k, head_dim={d}], got {tuple(k.shape)}")
    if h % k.shape[1]:
        raise ValueError(f"q's heads ({h}) must be a multiple of k's heads ({k.shape[1]}) for grouped-query attention")
    if causal and sq > k.shape[2]:
        raise ValueError(
            f"causal attention needs s_q <= s_k (queries are the last s_q positions), got s_q={sq}, s_k={k.shape[2]}"
        )
    return h // k.shape[1]


def causal_mask(s_q: int, s_k: int, *, q_start: int = 0, k_start: int = 0, device=None) -> torch.Tensor:
    """Boolean ``[s_q, s_k]`` mask, True where query ``q_start + i`` may see key ``k_start + j`` under
    bottom-right causal alignment of a full ``(s_q_total, s_k_total)`` problem whose offset
    ``s_k_total - s_q_total`` is folded into ``k_start`` by the caller (pass ``k_start - offset``)."""
    i = torch.arange(q_start, q_start + s_q, device=device).unsqueeze(1)
    j = torch.arange(k_start, k_start + s_k, device=device).unsqueeze(0)
    return j <= i


def naive_attention(q, k, v, *, causal: bool = False):
    """Reference attention that builds the whole ``[s_q, s_k]`` score matrix (O(s²) memory):
    ``softmax(q kᵀ / sqrt(d) + mask) v``, bottom-right causal mask, GQA by repeating K/V heads."""
    g = check_shapes(q, k, v, causal)
    k, v = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    if causal:
        sq, sk = s.shape[-2:]
        s = s.masked_fill(~causal_mask(sq, sk, k_start=-(sk - sq), device=s.device), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def merge_partials(out, lse, out_b, lse_b):
    """Merge two attention partials over disjoint keys (the online softmax): returns ``(out, lse)``
    with ``lse = log(e^lse + e^lse_b)`` and ``out = e^(lse − new)·out + e^(lse_b − new)·out_b``.
    ``out``: ``[..., n, d]``, ``lse``: ``[..., n]``. A row that has seen no key yet has ``lse = -inf``
    (its ``out`` is ignored); two such rows merge to ``(0, -inf)``."""
    new = torch.logaddexp(lse, lse_b)
    ref = torch.where(torch.isfinite(new), new, torch.zeros_like(new))  # no key seen: weights 0, not NaN
    wa, wb = torch.exp(lse - ref).unsqueeze(-1), torch.exp(lse_b - ref).unsqueeze(-1)
    return wa * out + wb * out_b, new


def segment_max(x: torch.Tensor, seq: torch.Tensor, num_segments: int) -> torch.Tensor:
    """Per-segment maximum: x [total, ...], seq [total] segment ids in 0..num_segments-1 ->
    [num_segments, ...] (-inf for an empty segment). The shift that keeps a segment softmax's exp finite."""
    out = torch.full((num_segments,) + tuple(x.shape[1:]), float("-inf"), dtype=x.dtype, device=x.device)
    index = seq.view((-1,) + (1,) * (x.dim() - 1)).expand_as(x)
    return out.scatter_reduce_(0, index, x, reduce="amax", include_self=True)


def merge_segments(out, lse, seq, num_segments: int):
    """``merge_partials`` over any number of partials at once: partial i (``out[i]`` ``[..., d]``, ``lse[i]``
    ``[...]``) belongs to segment ``seq[i]``; returns ``(out, lse)`` of each of the ``num_segments`` segments,
    ``lse = M + log Σ e^(lse_i − M)`` and ``out = Σ e^(lse_i − lse)·out_i`` over its partials, with ``M`` the
    segment's largest ``lse_i`` (``segment_max``: the shift that keeps the exponentials finite). The same result as
    folding ``merge_partials`` over a segment's partials in any order. In fp32; every segment needs a partial that
    has seen a key."""
    out, lse = out.float(), lse.float()
    top = segment_max(lse, seq, num_segments)
    w = torch.exp(lse - top.index_select(0, seq))  # each partial's share, up to 1/denominator
    denom = torch.zeros_like(top).index_add_(0, seq, w)
    total = torch.zeros((num_segments,) + tuple(out.shape[1:]), device=out.device).index_add_(
        0, seq, out * w.unsqueeze(-1)
    )
    return total / denom.unsqueeze(-1), top + denom.log()


def tile_partial(q, k, v, scale: float, mask=None):
    """The partial ``(out, lse)`` of queries ``q [..., n, d]`` over one tile of keys ``k, v [..., m, d]``;
    ``mask [n, m]`` True where a key is visible. Rows that see no key of the tile give ``(0, -inf)``."""
    s = (q @ k.transpose(-2, -1)) * scale
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    m = s.amax(dim=-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    p = torch.exp(s - m)
    rowsum = p.sum(dim=-1, keepdim=True)
    out = (p @ v) / torch.where(rowsum > 0, rowsum, torch.ones_like(rowsum))
    return out, (m + rowsum.log()).squeeze(-1)


def _tiles(sq, sk, bq, bk, causal, device=None):
    """(q slice, k slice, mask or None) for every tile that is not entirely hidden (tile skipping)."""
    off = sk - sq
    for qa in range(0, sq, bq):
        qb = min(qa + bq, sq)
        for ka in range(0, sk, bk):
            kb = min(ka + bk, sk)
            if causal and ka > qb - 1 + off:  # every key after the last query's horizon: skip the tile
                break
            masked = causal and kb - 1 > qa + off
            mask = causal_mask(qb - qa, kb - ka, q_start=qa + off, k_start=ka, device=device) if masked else None
            yield slice(qa, qb), slice(ka, kb), mask


def _kv_tile(t, ks, g):
    t = t[:, :, ks]
    return t if g == 1 else t.repeat_interleave(g, dim=1)  # one tile's worth, never the whole K/V


class _FlashAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, bq, bk):
        g = check_shapes(q, k, v, causal)
        sq, sk, scale = q.shape[2], k.shape[2], 1.0 / math.sqrt(q.shape[-1])
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        for qs, ks, mask in _tiles(sq, sk, bq, bk, causal, q.device):
            ob, lb = tile_partial(q[:, :, qs], _kv_tile(k, ks, g), _kv_tile(v, ks, g), scale, mask)
            out[:, :, qs], lse[:, :, qs] = merge_partials(out[:, :, qs], lse[:, :, qs], ob, lb)
        ctx.save_for_backward(q, k, v, out, lse)  # O(s·d) and O(s): nothing s_q × s_k
        ctx.causal, ctx.bq, ctx.bk = causal, bq, bk
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        b, kvh, sk, d = k.shape
        sq, g, scale = q.shape[2], q.shape[1] // kvh, 1.0 / math.sqrt(d)
        delta = row_term(dout, out)
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        for qs, ks, mask in _tiles(sq, sk, ctx.bq, ctx.bk, ctx.causal, q.device):
            qt, kt, vt, dot = q[:, :, qs], _kv_tile(k, ks, g), _kv_tile(v, ks, g), dout[:, :, qs]
            s = (qt @ kt.transpose(-2, -1)) * scale
            p = torch.exp(s - lse[:, :, qs].unsqueeze(-1))  # recomputed from the saved lse
            if mask is not None:
                p = p.masked_fill(~mask, 0.0)
            dp = dot @ vt.transpose(-2, -1)
            ds = p * (dp - delta[:, :, qs].unsqueeze(-1))
            dq[:, :, qs] += (ds @ kt) * scale
            n = ks.stop - ks.start
            dk[:, :, ks] += ((ds.transpose(-2, -1) @ qt) * scale).view(b, kvh, g, n, d).sum(2)
            dv[:, :, ks] += (p.transpose(-2, -1) @ dot).view(b, kvh, g, n, d).sum(2)
        return dq, dk, dv, None, None, None


def row_term(dout, out):
    """D = rowsum(dO ∘ O): ``[..., s_q]``, the softmax Jacobian's row term."""
    return (dout * out).sum(-1)


def flash_attention(q, k, v, *, causal: bool = False, block_q: int = 64, block_k: int = 64):
    """FlashAttention in plain PyTorch: the output of ``softmax(q kᵀ/sqrt(d)) v`` computed one
    ``block_q × block_k`` tile of scores at a time with the online softmax (``merge_partials``), never
    holding the ``s_q × s_k`` matrix; differentiable through its own backward, which recomputes each
    tile's scores from the saved log-sum-exp. ``causal``: bottom-right aligned (needs ``s_q <= s_k``),
    tiles above the diagonal skipped. GQA and any lengths (the last tiles may be short)."""
    block_q, block_k = check_int("block_q", block_q, 1), check_int("block_k", block_k, 1)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    return _FlashAttention.apply(q, k, v, causal, block_q, block_k)


def flash_decode(q, k, v, *, splits: int = 4, causal: bool = False):
    """FlashDecoding (Dao, Haziza, Massa, Sizov 2023): split the KV length into ``splits`` chunks, compute
    each chunk's partial ``(out, lse)`` independently (on a GPU: in parallel over the SMs, which a
    one-query decode step would otherwise leave idle), then reduce the partials with ``merge_partials``.
    Same shapes and causal rule as ``flash_attention``; forward only (decode needs no gradient)."""
    splits = check_int("splits", splits, 1)
    g = check_shapes(q, k, v, causal)
    sq, sk, scale = q.shape[2], k.shape[2], 1.0 / math.sqrt(q.shape[-1])
    chunk = -(-sk // splits)
    parts = []
    for ka in range(0, sk, chunk):  # independent: these would run at the same time
        ks = slice(ka, min(ka + chunk, sk))
        mask = causal_mask(sq, ks.stop - ka, k_start=ka - (sk - sq), device=q.device) if causal else None
        parts.append(tile_partial(q, _kv_tile(k, ks, g), _kv_tile(v, ks, g), scale, mask))
    out, lse = parts[0]
    for ob, lb in parts[1:]:  # the reduction step
        out, lse = merge_partials(out, lse, ob, lb)
    return out


def decode_splits(
    batch: int, heads: int, n_sms: int, *, m_blocks: int = 1, n_blocks: int | None = None, max_splits: int = 128
) -> int:
    """FlashDecoding's split count as flash-attn chooses it: ``num_splits_heuristic`` in
    ``csrc/flash_attn/flash_api.cpp`` (github.com/Dao-AILab/flash-attention, FlashAttention-2's C++ API).

    With ``w = batch · heads · m_blocks`` work items (``m_blocks`` = query blocks of 64 rows: 1 at decode):
    if ``w >= 0.8 · n_sms`` the SMs are almost full and it keeps **1** split. Otherwise, over the candidate
    split counts ``s = 1 .. min(max_splits, n_sms, n_blocks)`` it computes the wave efficiency
    ``n_waves / ceil(n_waves)`` with ``n_waves = w · s / n_sms`` and takes the **smallest** ``s`` whose
    efficiency is at least **0.85 ×** the best (more splits cost more HBM traffic for the partials and the
    reduction). A count that gives each split as many key blocks as one split fewer does
    (``ceil(n_blocks / s) == ceil(n_blocks / (s − 1))``) is skipped: it is the smaller count in disguise.
    ``n_blocks`` = key blocks of the KV length (``decode_key_blocks``); None: no limit from the KV length.

    The source's own example: 48 heads on 108 SMs (an A100) take 2 splits (efficiency 0.89), not 3 (0.67),
    though 3 is the fewest that gives every SM a work item. flash-attn passes ``n_sms`` = 2 × the SM count
    in its recent versions (two 128-thread blocks per SM) with ``max_splits`` 128 (earlier versions: the SM
    count and 64); pass what the kernel can run at once. Float32 comparisons as in the C++."""
    import numpy as np

    batch, heads, n_sms = check_int("batch", batch, 1), check_int("heads", heads, 1), check_int("n_sms", n_sms, 1)
    m_blocks, max_splits = check_int("m_blocks", m_blocks, 1), check_int("max_splits", max_splits, 1)
    if n_blocks is not None:
        n_blocks = check_int("n_blocks", n_blocks, 1)
    work = batch * heads * m_blocks
    f32 = np.float32
    if f32(work) >= f32(0.8) * f32(n_sms):
        return 1
    top = min(max_splits, n_sms, n_blocks if n_blocks is not None else max_splits)

    def eligible(s):
        return s == 1 or n_blocks is None or -(-n_blocks // s) != -(-n_blocks // (s - 1))

    eff = {}
    for s in range(1, top + 1):
        if eligible(s):
            waves = f32(work * s) / f32(n_sms)
            eff[s] = float(waves / np.ceil(waves))
    best = max(eff.values())
    return next(s for s, e in eff.items() if e >= 0.85 * best)


def decode_key_blocks(seqlen_k: int, head_dim: int) -> int:
    """Key blocks of flash-attn's split-KV kernel for ``decode_splits``: ``ceil(seqlen_k / block_n)`` with
    ``block_n`` = 256 for head_dim <= 64, 128 for <= 128, else 64 (``set_params_splitkv``, flash_api.cpp)."""
    seqlen_k, head_dim = check_int("seqlen_k", seqlen_k, 1), check_int("head_dim", head_dim, 1)
    block_n = 256 if head_dim <= 64 else 128 if head_dim <= 128 else 64
    return -(-seqlen_k // block_n)


def fill_splits(batch: int, heads: int, n_sms: int) -> int:
    """The fewest KV splits that give each of ``n_sms`` SMs at least one (batch, head, split) work item,
    ``ceil(n_sms / (batch · heads))``: a simpler rule than flash-attn's ``decode_splits`` (which keeps 1 split
    once the SMs are 80 % busy and otherwise trades wave efficiency against the number of splits)."""
    batch, heads, n_sms = check_int("batch", batch, 1), check_int("heads", heads, 1), check_int("n_sms", n_sms, 1)
    return -(-n_sms // (batch * heads))
