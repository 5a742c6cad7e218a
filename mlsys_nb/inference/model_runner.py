"""The model runner: one engine step's batch -> one forward pass over paged K/V -> next-token logits.

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

Storage and bookkeeping are ``paged.PagedKVCache``'s (its ``k``/``v`` pools, its ``BlockManager``,
``append_tokens`` with copy-on-write); its own ``plan``/``begin`` path pads every row to the longest
(a 256-token prefill chunk would pad 15 decodes to 256 tokens each), so the engine packs instead.

Logits are taken only at each sequence's last new token, and only for sequences whose prompt is
complete after this step (a middle prefill chunk samples nothing). A speculative *verify chunk* (the
last token and k drafted ones, ``speculative.VerifyView``: ``num_logits = k + 1``) is packed as a
(k+1)-token prefill chunk and returns logits at all its k+1 rows (``StepBatch.num_logits``).

``SwapPool``: a CPU pool of blocks for preemption by swapping (a preempted sequence's K/V are copied
out and copied back on resume, instead of being recomputed). The scheduler decides which blocks move
(``scheduler.SchedulerOutput``); the runner owns the pool and does every copy (``ModelRunner.move_blocks``),
at one point of the step: before its forward, on the engine's thread.

CUDA graphs of the decode step (``CUDAGraphRunner``, ``StaticDecodeBatch``, the buckets and the reasons an
engine runs eager) are ``cuda_graphs.py``'s; ``capture_cuda_graphs`` builds them on this runner.
"""

from __future__ import annotations

import torch

from ..runtime.profiling import trace_range
from .paged import (
    PagedKVCache,
    paged_attention,
    paged_attention_tiled,
    paged_decode_attention_varlen,
    varlen_decode_chunks,
)
from .sequence import Sequence


DECODE_GROUP = 4  # decode rows per attention call (sorted by length, so little padding is gathered)
SHORT_CHUNK = 16  # chunks of at most this many tokens and equal length share attention calls (verify chunks)


class StepBatch:
    """One step's packed batch: what the model reads through ``cache=`` (see the module docstring).

    ``scheduled``: ``[(sequence, num_new_tokens)]`` in the scheduler's order."""

    # positions are built here from token counts the engine bounds by max_model_len <= cfg.seq_len, so the
    # model skips its device-side bound check (a host sync per step, and refused inside a CUDA graph's capture)
    positions_checked = True

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
            # one attention call per group of DECODE_GROUP rows, each padded only to its own longest table
            self.dec_groups = []
            for lo in range(0, len(dec_tables), DECODE_GROUP):
                group = dec_tables[lo : lo + DECODE_GROUP]
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
        attend = paged_attention_tiled if self.kv.attention_backend == "tiled" else paged_attention
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


class SwapPool:
    """CPU blocks for preemption by swap: ``swap_out`` copies a sequence's blocks here, ``swap_in`` back.

    It mirrors every per-block tensor of the pool (``PagedKVCache.tensors()``: K, V and, for an int8/fp8
    pool, their scales) and, for a quantized pool, carries the full-precision K residual of a block not
    yet quantized (``get_residual``/``set_residual``; at most the sequence's partly filled last block), so
    a swapped-in block reads as what was swapped out. ``k``, ``v``: the CPU K/V (codes for a quantized
    pool)."""

    def __init__(self, kv: PagedKVCache, num_blocks: int):
        self.parts = [torch.zeros((t.shape[0], num_blocks) + tuple(t.shape[2:]), dtype=t.dtype) for t in kv.tensors()]
        self.k, self.v = self.parts[0], self.parts[1]
        self.free = list(range(num_blocks))
        self.held: dict[int, list[int]] = {}  # seq_id -> CPU block ids, in logical order
        self.residuals: dict[int, dict[int, torch.Tensor]] = {}  # seq_id -> {logical block: its K residual}

    def can_hold(self, n_blocks: int) -> bool:
        return n_blocks <= len(self.free)

    def swap_out(self, seq_id: int, kv: PagedKVCache, gpu_blocks: list[int]) -> None:
        cpu = [self.free.pop() for _ in gpu_blocks]
        idx = torch.tensor(gpu_blocks, device=kv.k.device)
        for mine, theirs in zip(self.parts, kv.tensors()):
            mine[:, cpu] = theirs[:, idx].cpu()
        self.held[seq_id] = cpu
        if kv.quant:
            res = {i: kv.get_residual(b) for i, b in enumerate(gpu_blocks) if b in kv.res_of}
            self.residuals[seq_id] = {i: r.cpu() for i, r in res.items()}

    def swap_in(self, seq_id: int, kv: PagedKVCache, gpu_blocks: list[int], first: int = 0) -> None:
        """Copy blocks ``first..`` of ``seq_id`` back into ``gpu_blocks`` (earlier ones came from the prefix cache)."""
        cpu = self.held.pop(seq_id)
        if gpu_blocks[first:]:
            src, dst = torch.tensor(cpu[first:]), torch.tensor(gpu_blocks[first:], device=kv.k.device)
            for mine, theirs in zip(self.parts, kv.tensors()):
                theirs[:, dst] = mine[:, src].to(theirs.device)
        for i, r in self.residuals.pop(seq_id, {}).items():
            if i >= first:
                kv.set_residual(gpu_blocks[i], r)
        self.free += cpu

    def drop(self, seq_id: int) -> None:
        self.free += self.held.pop(seq_id, [])
        self.residuals.pop(seq_id, None)


class ModelRunner:
    """Owns the model, the paged K/V and (``swap_blocks`` > 0: ``preemption_mode="swap"``) the CPU ``SwapPool``;
    it moves every byte of K/V: ``move_blocks(out)`` does the copies a ``SchedulerOutput`` asks for, then
    ``run(scheduled)`` -> (logits of the sampled rows, batch)."""

    def __init__(self, model, kv: PagedKVCache, swap_blocks: int = 0):
        self.model, self.kv = model, kv
        kv.auto_sync = False  # the pool syncs with its block manager at the runner's points only (move_blocks)
        self.swap_pool = SwapPool(kv, swap_blocks) if swap_blocks else None
        self.graphs = None  # cuda_graphs.CUDAGraphRunner once captured

    def move_blocks(self, out) -> None:
        """The K/V moves of ``out`` (a ``scheduler.SchedulerOutput``), on the engine's thread while no forward
        runs, in this order: CPU copies no longer needed are dropped; swapped-out blocks are copied to the CPU
        pool (the scheduler freed them, nothing has written them since); the cache catches up with the block
        manager (``kv.sync()``: a quantized pool seals full blocks and takes back freed blocks' residual slots,
        so only after the swap-outs); copy-on-write copies; swapped-in blocks are copied back. The lists are
        emptied: moving the same output twice moves nothing."""
        pool, kv = self.swap_pool, self.kv
        for seq_id in out.dropped:
            pool.drop(seq_id)
        for seq_id, blocks in out.swap_out:
            pool.swap_out(seq_id, kv, blocks)
        kv.sync()
        for src, dst in out.copies:
            kv.copy_blocks(src, dst)
        for seq_id, blocks, first in out.swap_in:
            pool.swap_in(seq_id, kv, blocks, first)
        out.dropped, out.swap_out, out.copies, out.swap_in = [], [], [], []

    @torch.inference_mode()
    def run(self, scheduled: list[tuple[Sequence, int]], timer=None) -> tuple[torch.Tensor, StepBatch]:
        batch = self.prepare(scheduled)  # "prepare": block tables, slots, positions
        if timer:
            timer("prepare")
        return self.forward(batch, timer), batch

    def prepare(self, scheduled: list[tuple[Sequence, int]]) -> StepBatch:
        """The step's CPU-side inputs (``StepBatch``); async scheduling builds it on a worker thread."""
        return StepBatch(self.kv, scheduled)

    @torch.inference_mode()
    def forward(self, batch: StepBatch, timer=None) -> torch.Tensor:
        """The model on a prepared batch: fp32 logits of its sampled rows."""
        with trace_range("engine.model"):  # the forward as a profiler range (notebook 15)
            if self.graphs is not None and not batch.prefills and self.graphs.fits(batch):
                logits = self.graphs.run(batch)
            else:
                logits = self.model(batch.tokens, positions=batch.positions, cache=batch)[0, batch.sample_rows]
        if timer:
            timer("model")
        return logits.float()

    def capture_cuda_graphs(self, buckets=(1, 2, 4, 8, 16, 32, 64), max_blocks_per_seq=None) -> None:
        """Capture one decode graph per batch bucket (CUDA only; ``cuda_graphs.CUDAGraphRunner``)."""
        from .cuda_graphs import CUDAGraphRunner  # it builds on StepBatch, defined above

        if not torch.cuda.is_available() or self.kv.k.device.type != "cuda":
            raise RuntimeError("CUDA graphs need torch.cuda.is_available() and the model and cache on a CUDA device")
        if self.kv.quant:
            raise RuntimeError(
                f"CUDA graphs need an unquantized KV pool (kv_cache_dtype={self.kv.quant!r}: its K residual is "
                "planned on the host every step)"
            )
        self.graphs = CUDAGraphRunner(self, buckets, max_blocks_per_seq)
