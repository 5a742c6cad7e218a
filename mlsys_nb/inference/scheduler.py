"""The scheduler: which sequences run in the next step, and how many new tokens each feeds the model.

Queues: ``waiting`` (new, or preempted by recompute), ``running`` (hold KV blocks), ``swapped``
(preempted by swap: K/V in the CPU pool). Every step has a token budget,
``max_num_batched_tokens`` (the new tokens of one forward pass), and at most ``max_num_seqs``
sequences run. ``schedule()``:

1. **running** sequences, oldest first: a decode costs 1 token of budget; a prompt still being
   prefilled costs its remaining tokens, cut to the budget left (*chunked prefill*, Agrawal et al.,
   2024, arXiv:2403.02310, Sarathi-Serve) so long prompts do not stall the decodes batched with them.
   A decode needs a slot for its token; when no block is free the *youngest* running sequence is
   *preempted* (vLLM's policy, Kwon et al., 2023, arXiv:2309.06180, §4.5): by **recompute** (drop its
   blocks, requeue it at the front of ``waiting``; it later re-prefills prompt + generated tokens), or
   by **swap** (copy its blocks to the CPU pool, resume later by copying them back).
2. **swapped** sequences come back first when blocks allow; then
3. **waiting** sequences are admitted while sequences, blocks and budget allow (*continuous
   batching*, Yu et al., 2022, Orca, OSDI: requests join and leave at every step). Their prompt's full
   blocks found in the prefix cache are not recomputed. With ``continuous_batching=False`` (static
   batching, the baseline) a new batch is admitted only when the previous one has finished.

After the forward pass ``update(scheduled)`` advances ``num_computed_tokens`` and tells the block
manager (``mark_computed``), which registers the blocks now holding computed K/V in the prefix cache:
the block manager is the one truth of which blocks are hits, and a block whose chunked prefill has not
reached it yet (or whose sequence was preempted first) is not one.

**The scheduler decides; the runner moves bytes** (vLLM v1's ``SchedulerOutput``). ``schedule()`` returns a
``SchedulerOutput``: what runs (``scheduled``: sequences and their new tokens) and which K/V blocks must move
before that forward: ``swap_out`` (a preempted sequence's blocks, to the CPU pool), ``swap_in`` (back into
newly allocated blocks), ``copies`` (copy-on-write of a shared last block) and ``dropped`` (CPU copies no
longer needed). The scheduler changes only the block manager (which blocks belong to whom: a swapped-out
sequence's blocks are free at once, their contents untouched until the runner has copied them) and counts
the CPU pool's blocks (``swap_blocks``); the model runner owns the pool and the tensors and does every copy
(``ModelRunner.move_blocks``) on the engine's thread before the step's forward. This file imports no torch
and no runner.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from .block_manager import BlockManager, OutOfBlocksError
from .config import PREEMPTION_MODES, EngineConfig
from .sequence import Sequence, SequenceStatus

__all__ = ["PREEMPTION_MODES", "Scheduler", "SchedulerOutput"]


@dataclass
class SchedulerOutput:
    """One step's decisions. ``scheduled``: ``[(sequence, new tokens)]`` for the forward, in order. The block
    moves the runner does first (block ids of the block manager's pool): ``swap_out`` ``[(seq_id, blocks)]``
    to copy to the CPU pool (already free in the manager); ``swap_in`` ``[(seq_id, blocks, first)]`` to copy
    back into ``blocks[first:]`` (the ``first`` leading ones are prefix-cache hits); ``copies``
    ``[(src, dst)]`` (copy-on-write); ``dropped`` ``[seq_id]`` whose CPU copies are no longer needed."""

    scheduled: list[tuple[Sequence, int]] = field(default_factory=list)
    swap_out: list[tuple[int, list[int]]] = field(default_factory=list)
    swap_in: list[tuple[int, list[int], int]] = field(default_factory=list)
    copies: list[tuple[int, int]] = field(default_factory=list)
    dropped: list[int] = field(default_factory=list)


class Scheduler:
    """Works on a ``BlockManager`` (``manager``). Reads ``max_num_seqs``, ``max_num_batched_tokens``,
    ``enable_chunked_prefill``, ``continuous_batching``, ``preemption_mode`` and ``swap_blocks`` (CPU blocks
    for swap; default: as many as the manager's) from an ``EngineConfig`` (``options``: fields by name,
    overriding it)."""

    def __init__(self, manager: BlockManager, config: EngineConfig | None = None, **options):
        c = EngineConfig.build(config, **options)
        self.manager = manager
        self.max_num_seqs, self.max_num_batched_tokens = c.max_num_seqs, c.max_num_batched_tokens
        self.chunked, self.continuous = c.enable_chunked_prefill, c.continuous_batching
        self.preemption_mode = c.preemption_mode
        self.swap_blocks = (c.swap_blocks or manager.num_blocks) if c.preemption_mode == "swap" else 0
        self.swap_free = self.swap_blocks  # CPU blocks not holding a swapped sequence (the runner's pool has them)
        self.swapped_blocks: dict[int, int] = {}  # seq_id -> CPU blocks its swapped K/V take
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        self.num_preemptions = {"recompute": 0, "swap": 0}
        self.moves = SchedulerOutput()  # block moves decided since the last schedule() (returned by the next)

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    # ---- one step ------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        """The next step's ``SchedulerOutput`` (see the module docstring)."""
        budget, out, preempted = self.max_num_batched_tokens, self.moves, False
        self.moves = SchedulerOutput()
        queue, kept = list(self.running), []
        while queue:  # 1. running sequences, oldest first
            seq = queue.pop(0)
            n = min(seq.num_uncomputed, budget) if self.chunked else seq.num_uncomputed
            if n == 0 or n > budget:
                kept.append(seq)  # no budget left this step: it keeps its blocks and waits
                continue
            while not self._reserve(seq, out):  # no free slot for its token: preempt the youngest
                victim = queue.pop() if queue else seq
                self.preempt(victim, out)
                preempted = True
                if victim is seq:
                    break
            else:
                out.scheduled.append((seq, n))
                budget -= n
                kept.append(seq)
        self.running = kept
        while self.swapped and not preempted and budget > 0 and len(self.running) < self.max_num_seqs:
            seq = self.swapped[0]  # 2. swapped sequences come back when their blocks fit
            if not self._swap_in(seq, out) or not self._reserve(seq, out):
                break
            self.swapped.popleft()
            self.running.append(seq)
            n = min(seq.num_uncomputed, budget)
            out.scheduled.append((seq, n))
            budget -= n
        admit = self.continuous or not self.running  # static batching: only when the batch is done
        while admit and self.waiting and not preempted and not self.swapped and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]  # 3. admit new (or recomputing) sequences
            if self.continuous and budget == 0:
                break
            if not self.chunked and seq.num_tokens > budget and self.continuous:
                break
            if not self._allocate(seq):
                break
            self.waiting.popleft()
            self.running.append(seq)
            n = min(seq.num_uncomputed, budget) if self.chunked else seq.num_uncomputed * (seq.num_uncomputed <= budget)
            if n:
                out.scheduled.append((seq, n))
                budget -= n
        return out

    def update(self, scheduled: list[tuple[Sequence, int]]) -> None:
        """After the forward pass: the new tokens' K/V are cached; the blocks they completed become hits."""
        for seq, n in scheduled:
            seq.num_computed_tokens += n
            self.manager.mark_computed(seq.seq_id, seq.num_computed_tokens)

    def finish(self, seq: Sequence) -> None:
        """Release a finished or aborted sequence's blocks (they stay in the prefix cache until reused)."""
        if seq in self.running:
            self.running.remove(seq)
            self.manager.free_seq(seq.seq_id)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        elif seq in self.swapped:
            self.swapped.remove(seq)
            self.swap_free += self.swapped_blocks.pop(seq.seq_id)
            out = [m for m in self.moves.swap_out if m[0] == seq.seq_id]  # swapped out since the last schedule()
            if out:
                self.moves.swap_out.remove(out[0])  # nothing to copy: no CPU copy was made
            else:
                self.moves.dropped.append(seq.seq_id)  # the runner drops its CPU copy before the next swap-outs
        seq.status = SequenceStatus.FINISHED

    # ---- helpers -------------------------------------------------------------------------------
    def _allocate(self, seq: Sequence) -> bool:
        try:
            cached = self.manager.allocate(seq.seq_id, seq.token_ids)
        except OutOfBlocksError:
            return False
        seq.num_computed_tokens = cached  # prefix-cache hits: their K/V were computed by an earlier step
        if seq.num_preemptions == 0:
            seq.num_cached_tokens = seq.num_computed_tokens
        seq.status = SequenceStatus.RUNNING
        return True

    def _reserve(self, seq: Sequence, out: SchedulerOutput) -> bool:
        """Slots for every token of ``seq`` the block manager does not hold yet (a decode's last token); a
        shared last block is copied first (copy-on-write: the runner copies it, ``out.copies``)."""
        have = self.manager.num_tokens(seq.seq_id)
        try:
            for t in seq.token_ids[have:]:
                copy = self.manager.append_token(seq.seq_id, t)
                if copy is not None:
                    out.copies.append(copy)
        except OutOfBlocksError:
            return False
        return True

    def preempt(self, seq: Sequence, out: SchedulerOutput | None = None) -> None:
        """Take ``seq`` off the running list and free its blocks: by swap (its computed blocks go to
        ``out.swap_out``, copied by the runner before anything overwrites them) or by recompute."""
        out = self.moves if out is None else out
        seq.num_preemptions += 1
        sid = seq.seq_id
        self.running.remove(seq) if seq in self.running else None
        n_blocks = self.manager.blocks_needed(seq.num_computed_tokens)
        if self.preemption_mode == "swap" and n_blocks and n_blocks <= self.swap_free:
            out.swap_out.append((sid, self.manager.block_table(sid)[:n_blocks]))
            self.swap_free -= n_blocks
            self.swapped_blocks[sid] = n_blocks
            self.manager.free_seq(sid)
            seq.status = SequenceStatus.SWAPPED
            self.swapped.append(seq)
            self.num_preemptions["swap"] += 1
        else:  # recompute (also the fallback when the CPU pool is full)
            self.manager.free_seq(sid)
            seq.num_computed_tokens = 0
            seq.status = SequenceStatus.WAITING
            self.waiting.appendleft(seq)
            self.num_preemptions["recompute"] += 1

    def _swap_in(self, seq: Sequence, out: SchedulerOutput) -> bool:
        n = seq.num_computed_tokens
        if self.manager.blocks_needed(seq.num_tokens) > self.manager.num_free_blocks():
            return False  # room for its cached tokens and for the ones it feeds next
        cached = self.manager.allocate(seq.seq_id, seq.token_ids[:n])  # prefix-cache hits need no copy
        out.swap_in.append((seq.seq_id, self.manager.block_table(seq.seq_id), cached // self.manager.block_size))
        self.swap_free += self.swapped_blocks.pop(seq.seq_id)
        self.manager.mark_computed(seq.seq_id, n)  # the copied-back blocks hold computed K/V again
        seq.status = SequenceStatus.RUNNING
        return True
