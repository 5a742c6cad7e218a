"""The model runner: one engine step's batch -> one forward pass over paged K/V -> next-token logits; and
every byte of K/V the engine moves.

``ModelRunner.run(scheduled)`` packs the step's sequences into one ``step_batch.StepBatch`` (a single row of
all their new tokens with explicit positions, no padding; its module docstring tells how each attention layer
writes and reads the paged K/V) and runs the model on it: fp32 logits of the rows that sample.
``prepare`` and ``forward`` are the two halves (async scheduling prepares on a worker thread).

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
from .cuda_graphs import CUDAGraphRunner
from .paged import PagedKVCache
from .sequence import Sequence
from .step_batch import DECODE_GROUP, SHORT_CHUNK, StepBatch

__all__ = ["DECODE_GROUP", "SHORT_CHUNK", "ModelRunner", "StepBatch", "SwapPool"]


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
        self.compiled = None  # compiled.CompiledModel (EngineConfig.compile): the forward compiled, same call

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
                model = self.compiled or self.model
                logits = model(batch.tokens, positions=batch.positions, cache=batch)[0, batch.sample_rows]
        if timer:
            timer("model")
        return logits.float()

    def capture_cuda_graphs(self, buckets=(1, 2, 4, 8, 16, 32, 64), max_blocks_per_seq=None) -> None:
        """Capture one decode graph per batch bucket (CUDA only; ``cuda_graphs.CUDAGraphRunner``)."""
        if not torch.cuda.is_available() or self.kv.k.device.type != "cuda":
            raise RuntimeError("CUDA graphs need torch.cuda.is_available() and the model and cache on a CUDA device")
        if self.kv.quant:
            raise RuntimeError(
                f"CUDA graphs need an unquantized KV pool (kv_cache_dtype={self.kv.quant!r}: its K residual is "
                "planned on the host every step)"
            )
        self.graphs = CUDAGraphRunner(self, buckets, max_blocks_per_seq)
