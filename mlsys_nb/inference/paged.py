"""A paged KV cache: fixed-size blocks, block tables, reference counts, copy-on-write, prefix hashing.

The idea is PagedAttention's (Kwon et al., 2023, arXiv:2309.06180, §4): instead of reserving
``max_seq_len`` contiguous slots per request, the cache is a pool of ``num_blocks`` blocks of
``block_size`` token slots; each sequence owns a *block table* (logical block i -> physical block id)
and attention gathers K/V through it. A sequence wastes at most ``block_size - 1`` slots (its last,
partly filled block) instead of ``max_seq_len - len``.

Three pieces, each readable on its own:

- ``BlockManager``: bookkeeping only (no tensors). A free list, per-sequence block tables, a
  reference count per block, copy-on-write when a sequence appends into a last block it shares
  (after ``fork``, as in parallel sampling), and hash-chained prefix caching: a *full* block is keyed
  by ``hash((parent block's hash, its token ids))`` so two prompts share blocks exactly as far as their
  token prefixes agree (the design of nano-vllm's ``block_manager.py`` and vLLM's automatic prefix
  caching). A block is registered under its key only once its K/V are computed
  (``mark_computed(seq_id, n)``, called after the forward that computed the first ``n`` tokens), so
  the prefix cache is the one truth of which blocks hold computed K/V: a block that is allocated but not
  yet computed (a prompt in chunked prefill, a sequence preempted mid-prefill) is never a hit. Freed
  blocks keep their key until the pool hands them out again, so a later request with the same prefix
  can revive them. ``check_invariants()`` re-derives every count from scratch.
- ``paged_attention(q, k_cache, v_cache, block_tables, context_lens)``: attention over K/V read
  through block tables (grouped-query heads supported), causal relative to each sequence's length.
- ``PagedKVCache``: K/V tensors ``[n_layers, num_blocks, block_size, n_kv_heads, head_dim]`` plus a
  ``BlockManager``, implementing the cache protocol of ``mlsys_nb.inference.kv_cache`` (``plan``,
  ``begin``, ``attend``, ``commit``): in every layer the package's ``Transformer`` calls
  ``cache.attend(layer, q, k, v)``, which writes the new K/V into their slots and returns
  ``paged_attention`` over the whole context.
- KV-cache quantization (``dtype="int8"`` or ``"fp8"``, e4m3) with KIVI's scheme (Liu et al., 2024,
  arXiv:2402.02750): K per *channel* (K has outlier channels; one fp32 scale per block, KV head and
  channel: the group is the block) and V per token (one fp32 scale per token and KV head). A per-channel
  scale needs the whole group, and appending a token to a partly filled block would change the block's
  channel max, so every append would re-round its earlier tokens (the error compounds). KIVI keeps the
  recent tokens in full precision instead; here the K of a block stays in an fp32 *residual* (a side pool
  of ``residual_blocks`` blocks, K only) until the block is full and its tokens are computed
  (``BlockManager.mark_computed``, after any speculative rollback), then the block is quantized per
  channel once, from exact values. A block written whole in one forward (a prefill chunk) is quantized
  directly; a speculative verify chunk always goes through the residual, since a rollback
  (``BlockManager.truncate``) may un-fill the block. Copy-on-write copies the residual with the block,
  swap carries it, freeing a block returns its residual, prefix-cache hits are full (quantized) blocks.
  ``read`` dequantizes a layer's pool and puts the residual blocks' exact K over their codes.

Errors name the value and the limit, and a failing call changes nothing (the tests run
``check_invariants()`` after every failing call).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..config import check_int, torch_dtype
from .block_manager import NO_HASH, BlockManager, OutOfBlocksError, _Seq, block_hash, fragmentation  # noqa: F401

__all__ = [
    "BlockManager",
    "allocate_kv_cache",
    "KV_QUANT_DTYPES",
    "OutOfBlocksError",
    "PagedKVCache",
    "block_hash",
    "dequantize_kv",
    "fragmentation",
    "kv_block_bytes",
    "kv_residual_blocks",
    "kv_residual_bytes",
    "paged_attention",
    "paged_decode_attention_varlen",
    "quantize_kv",
    "varlen_decode_chunks",
]

KV_QUANT_DTYPES = {"int8": torch.int8, "fp8": torch.float8_e4m3fn}  # quantized pools: codes + scales
KV_SCALE_DTYPE = torch.float32  # K: one scale per (block, KV head, channel); V: one per (token, KV head)
KV_RESIDUAL_DTYPE = torch.float32  # the full-precision K of blocks not yet quantized (the residual)


def quantize_kv(x: torch.Tensor, kind: str, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
    """Absmax quantization of K or V ``x`` to ``kind`` ("int8" or "fp8"), one scale per slice along ``dim``.

    ``dim=-1`` (head_dim): one scale per token and KV head (V's scheme); ``dim`` = the token axis of a
    block ``[..., block_size, n_kv_heads, head_dim]``: one scale per channel (K's scheme, KIVI).
    Returns ``(codes, scales)``: codes shaped like ``x`` (int8, or float8_e4m3fn), scales ``x``'s shape
    without ``dim`` (fp32), with ``x ~ codes * scales.unsqueeze(dim)``. int8 puts the slice's amax on 127
    (``mlsys_nb.quant.quantize`` with ``group_size=-1``: error <= amax / 254); fp8 puts it on e4m3's max
    448 (``precision.fp8.amax_scale``; relative error <= 2^-4 above the smallest normal)."""
    dim = dim % x.ndim
    if dim != x.ndim - 1:
        codes, scales = quantize_kv(x.movedim(dim, -1), kind)
        return codes.movedim(-1, dim), scales
    if kind == "int8":
        from ..quant.formats import quantize

        qt = quantize(x, "int8", group_size=-1)
        return qt.codes.view(x.shape), qt.scales.view(x.shape[:-1])
    if kind == "fp8":
        from ..precision.fp8 import amax_scale

        s = amax_scale(x.float().abs().amax(dim=-1), "fp8_e4m3")  # fmax / amax (1 for an all-zero row)
        return (x.float() * s[..., None]).to(KV_QUANT_DTYPES["fp8"]), 1 / s
    raise ValueError(f"kind={kind!r} is not a quantized KV dtype: use one of {tuple(KV_QUANT_DTYPES)}")


def dequantize_kv(codes: torch.Tensor, scales: torch.Tensor, dtype=torch.float32, dim: int = -1) -> torch.Tensor:
    """``codes * scales`` (scales broadcast along ``dim``, as ``quantize_kv`` made them) in ``dtype``."""
    return (codes.float() * scales.unsqueeze(dim % codes.ndim)).to(dtype)


def kv_block_bytes(cfg, block_size: int, dtype) -> int:
    """Bytes of one KV block over all layers, K and V.

    Unquantized: ``2 · n_layers · block_size · n_kv_heads · head_dim · bytes per value``. "int8"/"fp8":
    ``n_layers · n_kv_heads · (block_size · head_dim + 4 · head_dim)`` for K (codes, one fp32 scale per
    channel) plus ``n_layers · n_kv_heads · block_size · (head_dim + 4)`` for V (codes, one fp32 scale per
    token); the residual's bytes are ``kv_residual_bytes``. ``dtype``: a ``torch.dtype`` or a name
    ("fp32", "bf16", "fp16", "int8", "fp8")."""
    L, H, d = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
    if isinstance(dtype, str) and dtype in KV_QUANT_DTYPES:
        nb, sb = KV_QUANT_DTYPES[dtype].itemsize, KV_SCALE_DTYPE.itemsize
        return L * H * (block_size * d * nb + d * sb) + L * H * block_size * (d * nb + sb)
    nb = (dtype if isinstance(dtype, torch.dtype) else torch_dtype(dtype)).itemsize
    return 2 * L * block_size * H * d * nb


def kv_residual_bytes(cfg, block_size: int, residual_blocks: int) -> int:
    """Bytes of the full-precision K residual: ``residual_blocks · n_layers · block_size · n_kv_heads ·
    head_dim · 4`` (fp32)."""
    return residual_blocks * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * KV_RESIDUAL_DTYPE.itemsize


def kv_residual_blocks(max_num_seqs: int, block_size: int, num_speculative_tokens: int = 0) -> int:
    """Residual blocks an engine needs: per running sequence its partly filled last block, plus the one a
    prefill chunk or decode may start (2), or with speculation the blocks a verify chunk of k+1 tokens
    touches beyond its first (``ceil((k + 1) / block_size)``) if that is more."""
    extra = max(1, math.ceil((num_speculative_tokens + 1) / block_size)) if num_speculative_tokens else 1
    return max_num_seqs * (1 + extra)


def _raw(t: torch.Tensor) -> torch.Tensor:
    """A same-storage view that CPU indexing kernels accept (fp8 has no index_copy_ on CPU: view as uint8)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


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


def _attention_with_lse(q, k, v, bias, scale, fused=None):
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
    out, lse = _attention_with_lse(qc, k, v, bias.view(n, 1, 1, c_tok), scale)  # [chunks, n_kv, g, d], [.., g]
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


class PagedKVCache:
    """K/V of a ``Transformer`` in blocks; implements the cache protocol of ``mlsys_nb.inference.kv_cache``
    (``plan``, ``begin``, ``attend``, ``commit``), so ``model(tokens, cache=cache)`` works unchanged.

    Unlike the contiguous ``KVCache``, the paged cache knows each sequence's token ids (the block
    manager hashes them for prefix caching), so tokens are registered before the forward that
    computes them, and ``commit`` (after the forward) marks the computed blocks as prefix-cache hits:

    - ``n_cached = cache.add_sequence(seq_id, prompt_ids)``: blocks for the prompt; the first
      ``n_cached`` tokens (whole blocks found in the prefix cache) need no compute. Then
      ``cache.plan([seq_id])`` and ``model(tensor([prompt_ids[n_cached:]]), cache=cache)``.
    - per decode step: ``cache.append_tokens({seq_id: token, ...})`` (may copy a shared last block),
      ``cache.plan(seq_ids)`` and ``model(tokens[:, None], cache=cache)``.
    - ``cache.fork(parent, child)`` (shares all blocks), ``cache.free(seq_id)`` at the end.

    Without ``plan``, the rows of the next forward are the sequences with uncomputed tokens, in the
    order they were added. ``plan(seq_ids, n_new)`` may compute fewer tokens than are pending
    (chunked prefill) and mixes prefill chunks with decodes (rows padded to the longest).
    A block becomes a prefix-cache hit only after the forward that computed it, so a sequence added
    before that forward computes the shared prefix itself.

    ``k``, ``v``: [n_layers, num_blocks, block_size, n_kv_heads, head_dim]; ``dtype``: "fp32", "bf16",
    "fp16" or a ``torch.dtype`` (default: the model's parameters' dtype, fp32 for a ``ModelConfig``), or
    "int8" / "fp8" (e4m3): then ``k``/``v`` hold codes, ``k_scale`` [n_layers, num_blocks, n_kv_heads,
    head_dim] K's per-channel scales, ``v_scale`` [n_layers, num_blocks, block_size, n_kv_heads] V's
    per-token scales, and ``k_res`` [n_layers, residual_blocks, block_size, n_kv_heads, head_dim] the fp32
    K of the blocks not yet quantized (``res_of``: block id -> residual slot; module docstring).
    ``residual_blocks`` (default ``num_blocks``, always enough; the engine sizes it with
    ``kv_residual_blocks``). Every write goes through ``write``, every read through ``read``, and every
    copy of blocks (copy-on-write, swap) through ``tensors()`` plus ``get_residual``/``set_residual``,
    so the scales and residuals travel with their codes."""

    def __init__(
        self,
        model,
        *,
        num_blocks: int,
        block_size: int = 16,
        dtype=None,
        device=None,
        prefix_caching: bool = True,
        max_seq_len: int | None = None,
        residual_blocks: int | None = None,
    ):
        cfg = getattr(model, "cfg", model)  # a Transformer or its ModelConfig
        if dtype is None and isinstance(model, torch.nn.Module):
            p = next(model.parameters())
            dtype, device = p.dtype, device or p.device
        if max_seq_len is not None:
            check_int(f"max_seq_len (cfg.seq_len={cfg.seq_len})", max_seq_len, 1, cfg.seq_len)
        self.cfg, self.block_size = cfg, block_size
        self.attention_backend = "gather"  # or "tiled" (paged_attention_tiled); the engine sets EngineConfig's
        self.quant = dtype if isinstance(dtype, str) and dtype in KV_QUANT_DTYPES else None
        self.manager = BlockManager(  # a quantized pool reads the manager's events (``sync``)
            num_blocks,
            block_size,
            prefix_caching=prefix_caching,
            max_seq_len=max_seq_len or cfg.seq_len,
            record_events=bool(self.quant),
        )
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        store = KV_QUANT_DTYPES[self.quant] if self.quant else torch.float32 if dtype is None else torch_dtype(dtype)
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros_like(self.k)
        n_res = 0
        if self.quant:
            n_res = check_int("residual_blocks", num_blocks if residual_blocks is None else residual_blocks, 1)
            n_res = min(n_res, num_blocks)  # never more blocks not yet quantized than blocks
        self.k_scale = (
            torch.zeros(shape[:2] + shape[3:], dtype=KV_SCALE_DTYPE, device=device) if self.quant else None
        )  # K: per (block, head, channel)
        self.v_scale = torch.zeros(shape[:-1], dtype=KV_SCALE_DTYPE, device=device) if self.quant else None
        self.k_res = torch.zeros(shape[:1] + (n_res,) + shape[2:], dtype=KV_RESIDUAL_DTYPE, device=device)
        self._res_of: dict[int, int] = {}  # block id -> residual slot (its K in full precision, not yet quantized)
        self.res_free = list(range(n_res - 1, -1, -1))
        self._res_index = None  # (block ids, residual slots) as tensors, for ``read``; None when stale
        self._write_plan = None
        self.auto_sync = True  # read the manager's events before touching the residual (``sync``)
        self.computed: dict[object, int] = {}  # tokens of each sequence whose K/V are in the cache
        self._planned = None
        self._step = None

    @property
    def nbytes(self) -> int:
        """Bytes of the pool: K and V codes plus, for a quantized pool, their scales and the K residual."""
        return sum(t.nbytes for t in self.tensors()) + self.k_res.nbytes

    def tensors(self) -> list[torch.Tensor]:
        """Every per-block tensor of the pool ([n_layers, num_blocks, ...]): K, V and (quantized) their
        scales, as views CPU indexing accepts. Copying blocks means copying the same rows of each."""
        extra = [self.k_scale, self.v_scale] if self.quant else []
        return [_raw(self.k), _raw(self.v)] + extra

    def copy_blocks(self, src, dst) -> None:
        """Copy block ``src`` to ``dst`` in every layer (codes, scales and, if it has one, its K residual)."""
        for t in self.tensors():
            t[:, dst] = t[:, src]
        if self.quant and src in self.res_of:
            self.set_residual(dst, self.get_residual(src))

    # ---- the K residual (quantized pools): full-precision K of blocks not yet quantized -------------
    @property
    def res_of(self) -> dict[int, int]:
        """Block id -> residual slot of the blocks whose K is still in full precision (as of the last ``sync``)."""
        self._auto_sync()
        return self._res_of

    def sync(self) -> None:
        """Catch up with the block manager (``BlockManager.take_events``), in order: the blocks a sequence has
        full of computed tokens are quantized out of the residual, a freed block gives its residual slot back.

        With ``auto_sync`` (the default) every method that reads or changes the residual (``read``, ``write``,
        ``get_residual``, ``set_residual``, ``copy_blocks``, ``res_of``) calls it first, so whoever calls the
        manager directly (a scheduler, a speculative rollback) needs no extra step. An engine that frees blocks
        before it copies them out (swap) or schedules on another thread sets ``auto_sync = False`` and calls
        ``sync()`` at points of its own."""
        for kind, blocks in self.manager.take_events():
            if kind == "computed":
                self._seal(blocks)
            else:
                for b in blocks:
                    self._release_residual(b)

    def _auto_sync(self) -> None:
        if self.auto_sync:
            self.sync()

    def get_residual(self, block: int) -> torch.Tensor | None:
        """A copy of ``block``'s full-precision K [n_layers, block_size, n_kv_heads, head_dim], or None."""
        self._auto_sync()
        r = self._res_of.get(block)
        return None if r is None else self.k_res[:, r].clone()

    def set_residual(self, block: int, k: torch.Tensor | None = None) -> None:
        """Give ``block`` a residual holding ``k`` (default: its dequantized codes, so a reopened block keeps
        its tokens)."""
        self._auto_sync()
        if block not in self._res_of:
            if not self.res_free:
                raise RuntimeError(
                    f"the K residual is full: residual_blocks={self.k_res.shape[1]} blocks are all in use "
                    "(size it for the running sequences: paged.kv_residual_blocks)"
                )
            self._res_of[block] = self.res_free.pop()
            self._res_index = None
        if k is None:
            k = dequantize_kv(self.k[:, block], self.k_scale[:, block], KV_RESIDUAL_DTYPE, dim=1)
        self.k_res[:, self._res_of[block]] = k.to(self.k_res.device, KV_RESIDUAL_DTYPE)

    def _release_residual(self, block: int) -> None:
        r = self._res_of.pop(block, None)
        if r is not None:
            self.res_free.append(r)
            self._res_index = None

    def _seal(self, blocks) -> None:
        """Quantize per channel (once, from exact values) every block of ``blocks`` (full of computed tokens)
        still in the residual; their residual slots go back."""
        full = [b for b in blocks if b in self._res_of]
        if not full:
            return
        res = torch.tensor([self._res_of[b] for b in full], device=self.k.device)
        blocks = torch.tensor(full, device=self.k.device)
        codes, scales = quantize_kv(self.k_res[:, res], self.quant, dim=2)  # [L, n, bs, H, d]: over the tokens
        _raw(self.k)[:, blocks] = _raw(codes)
        self.k_scale[:, blocks] = scales
        for b in full:
            self._release_residual(b)

    def _plan_write(self, slots: torch.Tensor, tentative) -> tuple:
        """Where K of one write goes (the same for every layer): blocks the write fills whole, none of it
        tentative, are quantized directly ((block ids, token indices [n, block_size])); every other token
        goes to its block's residual ((token indices, flat residual slots)), which is opened if needed."""
        bs = self.block_size
        tent = [False] * len(slots) if tentative is None else [bool(t) for t in tentative]
        by_block: dict[int, dict[int, int]] = {}
        for i, sl in enumerate(slots.tolist()):
            b, o = divmod(sl, bs)
            by_block.setdefault(b, {})[o] = i  # a repeated slot (padding) keeps its last token
        direct_b, direct_i, res_i, res_s = [], [], [], []
        for b, offs in by_block.items():
            if b not in self._res_of and len(offs) == bs and not any(tent[i] for i in offs.values()):
                direct_b.append(b)
                direct_i.append([offs[o] for o in range(bs)])
                continue
            if b not in self._res_of:
                self.set_residual(b)
            res_i += offs.values()
            res_s += [self._res_of[b] * bs + o for o in offs]
        dev = self.k.device
        return (
            slots,
            torch.tensor(direct_b, dtype=torch.long, device=dev),
            torch.tensor(direct_i, dtype=torch.long, device=dev).view(-1, bs),
            torch.tensor(res_i, dtype=torch.long, device=dev),
            torch.tensor(res_s, dtype=torch.long, device=dev),
        )

    def write(
        self, layer_idx: int, slots: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, tentative=None
    ) -> None:
        """Store ``k_new``, ``v_new`` [T, n_kv_heads, head_dim] at flat slot indices ``slots`` [T] of one layer.

        An "int8"/"fp8" pool quantizes V per token, and K per channel for the blocks this write fills whole,
        else keeps K in the residual until its block is full and computed (module docstring). ``tentative``
        [T] (bool): tokens a rollback may remove (a speculative verify chunk); their blocks stay in the
        residual. The plan is made once per step: layer 0, or new ``slots``."""
        n_kv, d = self.k.shape[-2], self.k.shape[-1]
        if not self.quant:
            for pool, x in ((self.k, k_new), (self.v, v_new)):
                pool[layer_idx].view(-1, n_kv, d).index_copy_(0, slots, x.to(pool.dtype))
            return
        self._auto_sync()
        codes, s = quantize_kv(v_new, self.quant)
        _raw(self.v[layer_idx]).view(-1, n_kv, d).index_copy_(0, slots, _raw(codes))
        self.v_scale[layer_idx].view(-1, n_kv).index_copy_(0, slots, s)
        if layer_idx == 0 or self._write_plan is None or self._write_plan[0] is not slots:
            self._write_plan = self._plan_write(slots, tentative)
        _, direct_b, direct_i, res_i, res_s = self._write_plan
        if len(direct_b):
            codes, s = quantize_kv(k_new[direct_i], self.quant, dim=1)  # [n, bs, H, d]: per channel
            _raw(self.k[layer_idx])[direct_b] = _raw(codes)
            self.k_scale[layer_idx][direct_b] = s
        if len(res_i):
            self.k_res[layer_idx].view(-1, n_kv, d).index_copy_(0, res_s, k_new[res_i].to(KV_RESIDUAL_DTYPE))

    def read(self, layer_idx: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V pools [num_blocks, block_size, n_kv_heads, head_dim] in ``dtype`` (dequantized;
        the residual blocks' K exact)."""
        if self.quant:
            self._auto_sync()
            k = dequantize_kv(self.k[layer_idx], self.k_scale[layer_idx], dtype, dim=1)
            if self._res_of:
                if self._res_index is None:
                    dev = self.k.device
                    self._res_index = (
                        torch.tensor(list(self._res_of), device=dev),
                        torch.tensor(list(self._res_of.values()), device=dev),
                    )
                blocks, res = self._res_index
                k[blocks] = self.k_res[layer_idx, res].to(dtype)
            return k, dequantize_kv(self.v[layer_idx], self.v_scale[layer_idx], dtype)
        return self.k[layer_idx].to(dtype), self.v[layer_idx].to(dtype)

    @property
    def lengths(self) -> dict:
        """Cached (computed) tokens per sequence: ``{seq_id: n}``."""
        return dict(self.computed)

    def pending(self, seq_id) -> int:
        """Tokens of ``seq_id`` registered but not yet computed by a forward."""
        return self.manager.num_tokens(seq_id) - self.computed[seq_id]

    # ---- sequence management -------------------------------------------------------------------
    def add_sequence(self, seq_id, token_ids) -> int:
        """Allocate blocks for a prompt; return how many leading tokens already have K/V (prefix cache)."""
        n = self.manager.allocate(seq_id, token_ids)
        self.computed[seq_id] = n
        return n

    def append_tokens(self, tokens: dict) -> None:
        """One new token per sequence (``{seq_id: token_id}``) ahead of a decode step; copies on write."""
        for sid, tok in tokens.items():
            copy = self.manager.append_token(sid, int(tok))
            if copy is not None:
                self.copy_blocks(*copy)

    def fork(self, parent_id, child_id) -> None:
        """``child_id`` continues ``parent_id`` (same tokens, same blocks, nothing copied yet)."""
        if self.pending(parent_id):
            raise ValueError(
                f"fork of seq_id={parent_id!r} with {self.pending(parent_id)} uncomputed tokens: run the forward first"
            )
        self.manager.fork(parent_id, child_id)
        self.computed[child_id] = self.computed[parent_id]

    def free(self, seq_id) -> None:
        self.manager.free_seq(seq_id)
        del self.computed[seq_id]

    def reset(self, seq_ids=None) -> None:
        """Free sequences (all by default)."""
        for sid in list(self.computed) if seq_ids is None else list(seq_ids):
            self.free(sid)

    # ---- the protocol the model calls ----------------------------------------------------------
    def plan(self, seq_ids=None, n_new=None) -> None:
        """Row i of the next forward is ``seq_ids[i]`` with ``n_new[i]`` new tokens (default: all pending)."""
        ids = None if seq_ids is None else list(seq_ids)
        if ids is not None:
            for sid in ids:
                self.manager._seq(sid)
            if len(set(ids)) != len(ids):
                raise ValueError(f"seq_ids {ids} repeat a sequence: each row needs its own")
        n = None if n_new is None else [int(x) for x in (n_new.tolist() if torch.is_tensor(n_new) else n_new)]
        if ids is not None and n is not None and len(ids) != len(n):
            raise ValueError(f"seq_ids has {len(ids)} entries but n_new has {len(n)}")
        self._planned = (ids, n)

    def begin(self, b: int, s: int) -> torch.Tensor:
        ids, n = self._planned or (None, None)
        self._planned, self._step = None, None
        if ids is None:
            ids = [sid for sid in self.computed if self.pending(sid)]
        if n is None:
            n = [self.pending(sid) for sid in ids]
        if len(ids) != b or len(n) != b:
            waiting = [x for x in self.computed if self.pending(x)]
            raise ValueError(
                f"the batch has {b} rows but the plan has {len(ids)} sequences / {len(n)} new-token "
                f"counts (sequences with uncomputed tokens: {waiting})"
            )
        for sid, cnt in zip(ids, n):
            check_int(
                f"n_new of seq_id={sid!r} (min(s={s}, uncomputed tokens={self.pending(sid)}))",
                cnt,
                1,
                min(s, self.pending(sid)),
            )

        bs = self.block_size
        start = [self.computed[sid] for sid in ids]
        slots = [
            self.manager.seqs[sid].table[p // bs] * bs + p % bs
            for sid, lo, cnt in zip(ids, start, n)
            for p in range(lo, lo + cnt)
        ]
        tables = [self.manager.seqs[sid].table for sid in ids]
        width = max(map(len, tables))
        dev = self.k.device
        start_t = torch.tensor(start, dtype=torch.long)
        n_t = torch.tensor(n, dtype=torch.long)
        valid = torch.arange(s)[None, :] < n_t[:, None]  # [b, s]: which row positions are real tokens
        self._step = {
            "ids": ids,
            "n": n,
            "slots": torch.tensor(slots, dtype=torch.long, device=dev),
            "valid": None if bool(valid.all()) else valid.to(dev),
            "tables": torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=dev),
            "lens": (start_t + s).to(dev),  # query j of row i sits at start_i + j (padding: beyond, ignored)
        }
        return start_t[:, None] + torch.minimum(torch.arange(s)[None, :], n_t[:, None] - 1)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        st = self._step
        if st is None:
            raise RuntimeError("cache.attend called outside a step: the model calls cache.begin first")
        n_kv, d = k.shape[1], k.shape[3]
        k_new, v_new = k.transpose(1, 2), v.transpose(1, 2)  # [b, s, n_kv, d]
        if st["valid"] is not None:
            k_new, v_new = k_new[st["valid"]], v_new[st["valid"]]
        # write the new tokens into their slots (the flat view of this layer's pool), then attend
        self.write(layer_idx, st["slots"], k_new.reshape(-1, n_kv, d), v_new.reshape(-1, n_kv, d))
        kc, vc = self.read(layer_idx, q.dtype)
        return paged_attention(q, kc, vc, st["tables"], st["lens"])

    def commit(self) -> None:
        if self._step is None:
            raise RuntimeError("cache.commit called without cache.begin")
        for sid, cnt in zip(self._step["ids"], self._step["n"]):
            self.computed[sid] += cnt
            self.manager.mark_computed(sid, self.computed[sid])
        self._step = None

    def __repr__(self):
        return (
            f"PagedKVCache(num_blocks={self.manager.num_blocks}, block_size={self.block_size}, "
            f"free={self.manager.num_free_blocks()}, sequences={len(self.computed)}, "
            f"{self.nbytes / 2**20:.2f} MiB{', ' + self.quant if self.quant else ''})"
        )


def allocate_kv_cache(cfg, config, dtype, device) -> PagedKVCache:
    """The engine's paged pool for a model of ``cfg`` under ``config`` (an ``EngineConfig``; nano-vllm's
    ``allocate_kv_cache``). ``dtype``: the model's parameter dtype, used when ``kv_cache_dtype="auto"``.

    ``num_blocks=None``: as many blocks of ``kv_block_bytes`` as ``kv_cache_memory`` bytes hold, capped at
    ``max_num_seqs`` sequences of the full context; an int8/fp8 pool first takes its fp32 K residual
    (``kv_residual_blocks``, more with speculation) out of that budget. The context (``max_seq_len``) is
    ``min(cfg.seq_len, num_blocks · block_size)`` tokens, so one sequence alone always fits."""
    c, block_size = config, config.block_size
    kv_dtype = dtype if c.kv_cache_dtype == "auto" else c.kv_cache_dtype
    spec_k = c.num_speculative_tokens if c.speculative_model is not None else 0
    residual = kv_residual_blocks(c.max_num_seqs, block_size, spec_k) if kv_dtype in KV_QUANT_DTYPES else None
    memory = c.kv_cache_memory - (kv_residual_bytes(cfg, block_size, residual) if residual else 0)
    num_blocks = c.num_blocks
    if num_blocks is None:  # from the memory budget, capped at max_num_seqs full-length sequences
        full = c.max_num_seqs * math.ceil(cfg.seq_len / block_size)
        num_blocks = max(1, min(memory // kv_block_bytes(cfg, block_size, kv_dtype), full))
    left = f", {memory} after the K residual's {c.kv_cache_memory - memory}" if residual else ""
    check_int(f"num_blocks (from kv_cache_memory={c.kv_cache_memory} bytes{left})", num_blocks, 2)
    kv = PagedKVCache(
        cfg,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=kv_dtype,
        device=device,
        prefix_caching=c.enable_prefix_caching,
        max_seq_len=min(cfg.seq_len, num_blocks * block_size),
        residual_blocks=residual,
    )
    kv.attention_backend = c.attention_backend
    return kv
