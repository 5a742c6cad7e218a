"""Paged attention on FlexAttention: the K/V blocks read in place, through a block mask built from the block tables.

``attention_backend="flex"`` (``EngineConfig``). The other backends of ``paged_kernels.py`` copy blocks: "gather"
copies every sequence's blocks into one contiguous tensor before SDPA, "varlen" copies them chunk by chunk.
FlexAttention (``torch.nn.attention.flex_attention``, Dong et al., 2024, arXiv:2412.05496) takes the whole pool as
ONE key/value sequence of ``num_blocks * block_size`` tokens (``[1, n_kv_heads, num_blocks * block_size,
head_dim]``, a view of the layer's pool: nothing copied) and a ``BlockMask`` that lists, for each query row, the
KV blocks it visits: a sequence's block table is its list of visited blocks (``kv_indices``, with
``BLOCK_SIZE=(FLEX_Q_BLOCK, block_size)``: one KV block of the mask = one block of the pool), and ``mask_mod``
maps a physical slot back to its logical position (block table inverted: physical block -> logical block) for
causality. This is PyTorch's own paged-attention recipe
(``torch.nn.attention.experimental._paged_attention.PagedAttention.convert_logical_block_mask``).

Fast only compiled: ``torch.compile`` turns ``flex_attention`` into one fused kernel that visits only the listed
blocks; eager, PyTorch runs an unfused reference that materializes the scores over the whole pool
([batch, heads, q_len, num_blocks * block_size]; correct, slow, and it warns). ``paged_attention_flex(...,
compiled=True)`` runs ``compiled_flex_attention()`` (static shapes: one compile per new batch/query-length shape;
``dynamic=True`` fails to build its C++ kernel on CPU in torch 2.13). The engine (``FlexPagedAttention``) runs the
eager op, or with ``EngineConfig.compile=True`` the compiled one on decodes, their batch padded to a power of two
(a bounded number of compiles), and prefill chunks through ``paged_attention`` (gather).

An int8/fp8 pool works as with every backend (``PagedKVCache.read`` dequantizes the layer's pool first), but
then the blocks are read from that dequantized copy, not in place.

Units: tokens for lengths and positions, elements for shapes.
"""

from __future__ import annotations

import functools
import warnings

import torch
from torch.nn.attention.flex_attention import BlockMask, flex_attention

__all__ = [
    "FLEX_Q_BLOCK",
    "FlexPagedAttention",
    "compiled_flex_attention",
    "decode_bucket",
    "flex_block_mask",
    "paged_attention_flex",
]

FLEX_Q_BLOCK = 128  # query rows per row of the block mask (FlexAttention's default Q block)


@functools.cache
def compiled_flex_attention():
    """``torch.compile(flex_attention)``, built once per process (static shapes, inductor)."""
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(
    block_tables: torch.Tensor, context_lens: torch.Tensor, q_len: int, num_blocks: int, block_size: int
) -> BlockMask:
    """The ``BlockMask`` of ``paged_attention_flex``: query row b visits its sequence's blocks only, causally.

    block_tables: [batch, max_blocks] physical block ids (entries past a sequence's end ignored); context_lens:
    [batch] tokens including the ``q_len`` new ones (query i of row b sits at ``context_lens[b] - q_len + i``);
    ``num_blocks``, ``block_size``: the pool's. Each row's blocks in table order, split in two lists
    [batch, 1, rows, num_blocks] (padded with block 0, not visited: the counts say how many are real): the "full"
    blocks, wholly before the row's first query (read without ``mask_mod``), then the partial ones up to the end,
    where ``mask_mod`` maps a physical slot to its logical position through the inverted table ([batch, num_blocks],
    -1 where the block is not the row's) for causality. (The CPU decoding kernel in torch 2.13 also needs the full
    lists to exist.)"""
    b, dev = block_tables.shape[0], block_tables.device
    lens = context_lens.to(device=dev, dtype=torch.long)
    n_blk = torch.minimum((lens + block_size - 1) // block_size, torch.tensor(block_tables.shape[1], device=dev))
    logical = torch.arange(block_tables.shape[1], device=dev).expand(b, -1)
    live = logical < n_blk[:, None]
    tables = block_tables.long().clamp(min=0)
    # inverted table: phys_to_logical[b, block] = i where tables[b, i] == block (column num_blocks: a dump for padding)
    inv = torch.full((b, num_blocks + 1), -1, dtype=torch.long, device=dev)
    inv.scatter_(1, torch.where(live, tables, num_blocks), torch.where(live, logical, -1))
    phys_to_logical = inv[:, :num_blocks]
    first_q = lens - q_len  # position of query 0 of each row
    rows = -(-q_len // FLEX_Q_BLOCK)
    # mask row r (queries r*FLEX_Q_BLOCK..) sees the blocks before its first query's whole ("full": no mask_mod) and
    # the rest up to the end masked ("partial")
    row_first = first_q[:, None] + torch.arange(rows, device=dev) * FLEX_Q_BLOCK  # [b, rows]
    n_full = torch.minimum((row_first + 1) // block_size, n_blk[:, None])
    width = tables.shape[1]

    def listed(first, count):  # [b, 1, rows, num_blocks] int32: tables[b, first:first+count], then block 0
        idx = (first[..., None] + torch.arange(width, device=dev)).clamp(max=width - 1)
        ids = torch.gather(tables[:, None, :].expand(b, rows, width), 2, idx)
        ids = torch.where(torch.arange(width, device=dev) < count[..., None], ids, 0)
        out = torch.zeros(b, 1, rows, num_blocks, dtype=torch.int32, device=dev)
        out[:, 0, :, :width] = ids.to(torch.int32)
        return out

    full_idx = listed(torch.zeros_like(n_full), n_full)
    kv_indices = listed(n_full, n_blk[:, None] - n_full)
    kv_num_blocks = (n_blk[:, None] - n_full).to(torch.int32)[:, None]
    full_num_blocks = n_full.to(torch.int32)[:, None]

    def mask_mod(bi, h, q_idx, kv_idx):
        blk = phys_to_logical[bi, kv_idx // block_size]
        pos = blk * block_size + kv_idx % block_size  # the slot's token position in row bi's sequence
        return (blk >= 0) & (pos <= first_q[bi] + q_idx)

    return BlockMask.from_kv_blocks(
        kv_num_blocks,
        kv_indices,
        full_num_blocks,
        full_idx,
        BLOCK_SIZE=(FLEX_Q_BLOCK, block_size),
        mask_mod=mask_mod,
        seq_lengths=(q_len, num_blocks * block_size),
    )


def paged_attention_flex(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float | None = None,
    block_mask=None,
    compiled: bool = False,
) -> torch.Tensor:
    """``paged_kernels.paged_attention`` (same arguments, same result) with the blocks read in place by FlexAttention.

    q: [batch, n_heads, q_len, head_dim]; k_cache, v_cache: [num_blocks, block_size, n_kv_heads, head_dim]
    (n_heads a multiple of n_kv_heads: query head j reads KV head j // (n_heads // n_kv_heads), ``enable_gqa``);
    block_tables [batch, max_blocks]; context_lens [batch] including the q_len new tokens. ``block_mask``: from
    ``flex_block_mask`` (built here if None; the engine builds it once per step). ``compiled``: run
    ``compiled_flex_attention()`` (fused, visits listed blocks only) instead of the eager op (unfused: scores over
    the whole pool). Returns [batch, n_heads, q_len, head_dim] in ``q``'s dtype."""
    b, h, q_len, d = q.shape
    n, bs, n_kv, _ = k_cache.shape
    if h % n_kv:
        raise ValueError(f"n_heads={h} must be a multiple of n_kv_heads={n_kv}")
    if block_mask is None:
        block_mask = flex_block_mask(block_tables, context_lens, q_len, n, bs)
    k = k_cache.view(1, n * bs, n_kv, d).transpose(1, 2)  # the pool as one sequence: a view, nothing copied
    v = v_cache.view(1, n * bs, n_kv, d).transpose(1, 2)
    if compiled:
        return compiled_flex_attention()(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)
    with warnings.catch_warnings():  # eager is the correctness path (or traced inside a compiled model)
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=True)


def decode_bucket(batch: int) -> int:
    """The batch a compiled decode call is padded to: the next power of two (1, 2, 4, ..., so at most
    log2(max_num_seqs) + 1 compiled shapes)."""
    return 1 << (batch - 1).bit_length()


class FlexPagedAttention:
    """``paged_attention_flex`` for one engine step, called like ``paged_attention``: the block mask of each block
    table tensor (one per attention group of ``step_batch.StepBatch``) is built at its first layer and reused by
    every other layer of the step.

    ``compiled`` (``EngineConfig.compile`` with ``attention_backend="flex"``): decode calls run the fused kernel
    (``compiled_flex_attention``), their batch padded to ``decode_bucket`` rows (padding rows read block 0 and are
    dropped), so a new batch size compiles at most once per power of two; prefill chunks, whose lengths vary
    freely, go to ``paged_attention`` (gather): each new (rows, length) would be a new compile."""

    def __init__(self, compiled: bool = False):
        self.compiled = compiled
        self.masks: dict[tuple[int, int], tuple] = {}  # (id(tables), q_len) -> (tables, mask, padded tables, lens)

    def __call__(self, q, k_cache, v_cache, block_tables, context_lens, *, scale=None):
        b, q_len = q.shape[0], q.shape[2]
        if self.compiled and q_len > 1:
            from .paged_kernels import paged_attention

            return paged_attention(q, k_cache, v_cache, block_tables, context_lens, scale=scale)
        key = (id(block_tables), q_len)
        if key not in self.masks:  # the tables are kept with their mask, so their id stays theirs for the step
            tables, lens, pad = block_tables, context_lens, decode_bucket(b) - b if self.compiled else 0
            if pad:  # padding rows: context 1 token in block 0, dropped after the call
                tables = torch.cat([tables, tables.new_zeros((pad, tables.shape[1]))])
                lens = torch.cat([lens, lens.new_ones(pad)])
            mask = flex_block_mask(tables, lens, q_len, k_cache.shape[0], k_cache.shape[1])
            self.masks[key] = (block_tables, mask, tables, lens)
        _, mask, tables, lens = self.masks[key]
        if tables.shape[0] > b:
            q = torch.cat([q, q.new_zeros((tables.shape[0] - b,) + q.shape[1:])])
        elif self.compiled:
            q = q.contiguous()  # one memory layout per bucket (the compiled kernel is specialized on strides)
        out = paged_attention_flex(
            q, k_cache, v_cache, tables, lens, scale=scale, block_mask=mask, compiled=self.compiled
        )
        return out[:b]
