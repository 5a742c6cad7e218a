"""The packed batch of one engine step (``StepBatch``): what the model reads through ``cache=``.

Continuous batching mixes, in ONE forward, decodes (one new token each) with prefill chunks (many
tokens of one prompt). Rows of different lengths are *packed*: the batch is a single row of
``T = sum(new tokens)`` tokens with explicit positions, as vLLM and nano-vllm do (no padding). The
object passed to the model as ``cache`` is a ``StepBatch``; every attention layer calls
``cache.attend(layer_idx, q, k, v)`` (q/k/v after RoPE, ``[1, heads, T, head_dim]``), which

1. writes the new K/V into their slots (``slot = block_table[pos // block_size] * block_size +
   pos % block_size``) in the ``PagedKVCache`` tensors, then
2. attends each query over its own sequence's blocks with ``paged_attention``: one-token rows
   (decodes) sorted by context length in batched calls of ``DECODE_GROUP`` rows (a batched call
   gathers every row's blocks padded to the longest row: on CPU that copy is the step's largest
   cost), each prefill chunk in its own call. ``attention_backend="varlen"``: all decode rows in ONE call per layer
   (``paged_decode_attention_varlen``: contexts packed as 32-token chunks, mapped once per step, split-KV merge).
   ``attention_backend="flex"``: every call reads the blocks in place (``flex_paged.paged_attention_flex``, its
   block mask built once per step per call group), all decode rows in one call.

Storage and bookkeeping are ``paged.PagedKVCache``'s (its ``k``/``v`` pools, its ``BlockManager``,
``append_tokens`` with copy-on-write); its own ``plan``/``begin`` path pads every row to the longest
(a 256-token prefill chunk would pad 15 decodes to 256 tokens each), so the engine packs instead.

Logits are taken only at each sequence's last new token, and only for sequences whose prompt is
complete after this step (a middle prefill chunk samples nothing). A speculative *verify chunk* (the
last token and k drafted ones, ``spec_batch.VerifyView``: ``num_logits = k + 1``) is packed as a
(k+1)-token prefill chunk and returns logits at all its k+1 rows (``StepBatch.num_logits``).
"""

from __future__ import annotations

import torch

from .flex_paged import FlexPagedAttention
from .paged import (
    PagedKVCache,
    paged_attention,
    paged_attention_tiled,
    paged_decode_attention_varlen,
    varlen_decode_chunks,
)
from .sequence import Sequence


__all__ = ["DECODE_GROUP", "SHORT_CHUNK", "StepBatch"]

DECODE_GROUP = 4  # decode rows per attention call (sorted by length, so little padding is gathered)
SHORT_CHUNK = 16  # chunks of at most this many tokens and equal length share attention calls (verify chunks)


class StepBatch:
    """One step's packed batch: what the model reads through ``cache=`` (see the module docstring).

    ``scheduled``: ``[(sequence, num_new_tokens)]`` in the scheduler's order."""

    # positions are built here from token counts the engine bounds by max_model_len <= cfg.seq_len, so the
    # model skips its device-side bound check (a host sync per step, and refused inside a CUDA graph's capture)
    positions_checked = True
    flex = None  # attention_backend="flex": a flex_paged.FlexPagedAttention (block masks built once per step)

    def __init__(self, kv: PagedKVCache, scheduled: list[tuple[Sequence, int]]):
        self.kv = kv
        bs = kv.block_size
        # decodes (one new token) first, then prefill chunks by length: the decodes share attention calls,
        # and so do short chunks of equal length (speculative verify chunks), by context length in each
        order = sorted(
            range(len(scheduled)),
            key=lambda i: (scheduled[i][1] != 1, scheduled[i][1], scheduled[i][0].num_computed_tokens),
        )
        self.seqs = [scheduled[i][0] for i in order]
        tokens, positions, slots, self.prefills, dec_tables, dec_lens = [], [], [], [], [], []
        tentative = []  # tokens a speculative rollback may remove (a quantized pool keeps their K exact)
        self.sample_rows, self.sample_seqs, self.num_logits = [], [], []
        for seq, n in (scheduled[i] for i in order):
            start = seq.num_computed_tokens
            table = kv.manager.seqs[seq.seq_id].table
            pos = range(start, start + n)
            off = len(tokens)
            tokens += seq.token_ids[start : start + n]
            positions += pos
            slots += [table[p // bs] * bs + p % bs for p in pos]
            tentative += [getattr(seq, "num_logits", 1) > 1] * n
            if n == 1:
                dec_tables.append(table)
                dec_lens.append(start + 1)
            else:
                self.prefills.append((off, n, table, start + n))
            if start + n == seq.num_tokens:  # this row ends the known tokens: sample the next one
                m = getattr(seq, "num_logits", 1)  # a speculative verify chunk wants its last k+1 rows
                self.sample_rows += range(len(tokens) - m, len(tokens))
                self.sample_seqs.append(seq)
                self.num_logits.append(m)
        self.num_decodes = len(dec_tables)
        dev = kv.k.device
        # chunks of one equal length <= SHORT_CHUNK share an attention call, DECODE_GROUP at a time:
        # (offset, length, rows, block tables [rows, width], context lengths [rows])
        groups = []
        for off, n, table, ctx in self.prefills:
            g = groups[-1] if groups else None
            if g is not None and n == g[1] <= SHORT_CHUNK and len(g[2]) < DECODE_GROUP:
                g[2].append(table)
                g[3].append(ctx)
            else:
                groups.append((off, n, [table], [ctx]))
        self.prefills = []
        for off, n, tables, ctxs in groups:
            w = max(map(len, tables))
            t = torch.tensor([tb + [0] * (w - len(tb)) for tb in tables], device=dev)
            self.prefills.append((off, n, len(tables), t, torch.tensor(ctxs, device=dev)))
        self.tokens = torch.tensor([tokens], device=dev)
        self.positions = torch.tensor([positions], device=dev)
        self.slots = torch.tensor(slots, device=dev)
        self.tentative = tentative if any(tentative) else None
        self.dec_varlen = None  # attention_backend="varlen": (blocks, seq, bias) of every decode's context
        if dec_tables:
            width = max(map(len, dec_tables))
            self.dec_tables = torch.tensor([t + [0] * (width - len(t)) for t in dec_tables], device=dev)
            self.dec_lens = torch.tensor(dec_lens, device=dev)
            if kv.attention_backend == "varlen":  # one chunk mapping per step, reused by every layer
                self.dec_varlen = varlen_decode_chunks(self.dec_tables, self.dec_lens, bs)
            # one attention call per group of DECODE_GROUP rows, each padded only to its own longest table ("flex":
            # one group, its blocks read in place)
            self.dec_groups = []
            per = len(dec_tables) if kv.attention_backend == "flex" else DECODE_GROUP
            for lo in range(0, len(dec_tables), per):
                group = dec_tables[lo : lo + per]
                w = max(map(len, group))
                self.dec_groups.append(
                    (
                        lo,
                        lo + len(group),
                        self.dec_tables[lo : lo + len(group), :w],
                        self.dec_lens[lo : lo + len(group)],
                    )
                )
        self.scheduled = [(s, n) for s, n in (scheduled[i] for i in order)]
        if kv.attention_backend == "flex":
            self.flex = FlexPagedAttention(compiled=kv.compile_attention)

    def begin(self, b: int, s: int) -> torch.Tensor:
        """The model's cache protocol: positions of the new tokens ([1, T], packed)."""
        return self.positions

    def commit(self) -> None:
        """The model's cache protocol: nothing to do (the scheduler advances ``num_computed_tokens``)."""

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # [T, n_kv, d]; verify chunks' tokens are tentative (a rollback may remove them)
        self.kv.write(layer_idx, self.slots, k[0].transpose(0, 1), v[0].transpose(0, 1), self.tentative)
        # [num_blocks, block_size, n_kv, d] in the model's dtype (a pool in another dtype, or int8/fp8
        # codes with their scales, is converted / dequantized: kv_cache_dtype)
        kc, vc = self.kv.read(layer_idx, q.dtype)
        attend = self.flex or (paged_attention_tiled if self.kv.attention_backend == "tiled" else paged_attention)
        outs, D = [], self.num_decodes
        if D and self.dec_varlen is not None:  # every decode in one call: a fixed number of ops per layer
            qd = q[0, :, :D].transpose(0, 1)  # [rows, heads, d]
            outs.append(paged_decode_attention_varlen(qd, kc, vc, *self.dec_varlen).transpose(0, 1))
        for lo, hi, tables, lens in self.dec_groups if D and self.dec_varlen is None else ():
            qd = q[0, :, lo:hi].transpose(0, 1).unsqueeze(2)  # [rows, heads, 1, d]
            out = attend(qd, kc, vc, tables, lens)
            outs.append(out.squeeze(2).transpose(0, 1))  # [heads, rows, d]
        H, d = q.shape[1], q.shape[3]
        for off, n, g, tables, ctx in self.prefills:  # g chunks of n tokens each, packed one after another
            qc = q[0, :, off : off + g * n].reshape(H, g, n, d).transpose(0, 1)  # [g, heads, n, d]
            out = attend(qc, kc, vc, tables, ctx)
            outs.append(out.transpose(0, 1).reshape(H, g * n, d))
        return torch.cat(outs, dim=1)[None].to(q.dtype)
