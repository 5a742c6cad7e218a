"""The block manager of the paged KV cache: bookkeeping only, no tensors (and no torch).

PagedAttention's (Kwon et al., 2023, arXiv:2309.06180, §4) pool is ``num_blocks`` blocks of ``block_size``
token slots; each sequence owns a *block table* (logical block i -> physical block id). ``BlockManager``
keeps a free list (LRU order), the block tables, a reference count per block, copy-on-write when a
sequence appends into a last block it shares (after ``fork``, as in parallel sampling), and hash-chained
prefix caching: a *full* block is keyed by ``hash((parent block's hash, its token ids))`` so two prompts
share blocks exactly as far as their token prefixes agree (the design of nano-vllm's ``block_manager.py``
and vLLM's automatic prefix caching). A block is registered under its key only once its K/V are computed
(``mark_computed(seq_id, n)``, called after the forward that computed the first ``n`` tokens), so the
prefix cache is the one truth of which blocks hold computed K/V: a block that is allocated but not yet
computed (a prompt in chunked prefill, a sequence preempted mid-prefill) is never a hit. Freed blocks
keep their key until the pool hands them out again, so a later request with the same prefix can revive
them. ``check_invariants()`` re-derives every count from scratch.

The tensors live in ``paged.PagedKVCache``, which owns a ``BlockManager``; a scheduler (which imports no
torch) reads the manager's free blocks. Errors name the value and the limit, and a failing call changes
nothing (the tests run ``check_invariants()`` after every failing call).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from dataclasses import dataclass, field

from ..config import check_int

__all__ = ["NO_HASH", "BlockManager", "OutOfBlocksError", "block_hash", "fragmentation"]

NO_HASH = -1  # the key of a block not in the prefix cache (and the parent key of a sequence's first block)


class OutOfBlocksError(RuntimeError):
    """No free block right now (a scheduler would wait or preempt); the request itself is valid."""


def block_hash(token_ids, parent: int = NO_HASH) -> int:
    """The prefix-cache key of one full block: a hash of the parent block's key and this block's tokens.

    Chaining makes the key depend on the whole prefix, not just the block: two blocks with the same
    16 tokens after different prefixes get different keys (their K/V differ, through attention)."""
    return hash((parent, tuple(int(t) for t in token_ids)))


@dataclass
class _Seq:
    tokens: list[int]
    table: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens whose K/V came from the prefix cache
    hashed: int = 0  # leading blocks registered in the prefix cache (their K/V are computed)


class BlockManager:
    """Free list, block tables, reference counts, copy-on-write and hash-chained prefix caching.

    Parameters: ``num_blocks`` blocks of ``block_size`` token slots each; ``max_seq_len`` the longest
    sequence (prompt + generated tokens) allowed (default: the whole pool); ``prefix_caching``
    shares full blocks between sequences with the same token prefix; ``record_events`` keeps a log of
    what happened to blocks for ``take_events`` (a pool with per-block state of its own reads it)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 16,
        *,
        max_seq_len: int | None = None,
        prefix_caching: bool = True,
        record_events: bool = False,
    ):
        num_blocks, block_size = check_int("num_blocks", num_blocks), check_int("block_size", block_size)
        if max_seq_len is not None:
            max_seq_len = check_int("max_seq_len", max_seq_len)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.max_seq_len = max_seq_len if max_seq_len is not None else num_blocks * block_size
        self.prefix_caching = prefix_caching
        self.ref_count = [0] * num_blocks
        self.hash_of = [NO_HASH] * num_blocks  # key of a full block whose contents are cached
        self.tokens_of: list[tuple[int, ...]] = [()] * num_blocks  # its token ids (checked on a hit)
        self.cached: dict[int, int] = {}  # block key -> physical block id
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(num_blocks))  # LRU order
        self.seqs: dict[object, _Seq] = {}
        self.stats = {"prompt_tokens": 0, "cached_tokens": 0}
        self.events: list[tuple[str, tuple[int, ...]]] | None = [] if record_events else None  # take_events

    # ---- queries -------------------------------------------------------------------------------
    def num_free_blocks(self) -> int:
        return len(self.free)

    def block_table(self, seq_id) -> list[int]:
        return list(self._seq(seq_id).table)

    def num_tokens(self, seq_id) -> int:
        return len(self._seq(seq_id).tokens)

    def cached_tokens(self, seq_id) -> int:
        """Prompt tokens of ``seq_id`` whose K/V were found in the prefix cache at ``allocate``."""
        return self._seq(seq_id).cached_tokens

    def blocks_needed(self, num_tokens: int) -> int:
        return math.ceil(num_tokens / self.block_size)

    def waste(self, seq_id) -> int:
        """Reserved but unused slots of one sequence (its last block's empty slots): <= block_size - 1."""
        s = self._seq(seq_id)
        return len(s.table) * self.block_size - len(s.tokens)

    def _seq(self, seq_id) -> _Seq:
        if seq_id not in self.seqs:
            raise KeyError(f"seq_id={seq_id!r} is not allocated (allocated: {sorted(map(str, self.seqs))[:10]})")
        return self.seqs[seq_id]

    # ---- allocation ----------------------------------------------------------------------------
    def _check_length(self, n: int, what: str) -> None:
        if n > self.max_seq_len:
            raise ValueError(f"{what} of {n} tokens exceeds the context max_seq_len={self.max_seq_len}")
        if self.blocks_needed(n) > self.num_blocks:
            raise ValueError(
                f"{what} of {n} tokens needs {self.blocks_needed(n)} blocks of {self.block_size} "
                f"tokens but the block budget is num_blocks={self.num_blocks}"
            )

    def _take_free(self) -> int:
        """Pop the least recently freed block; it forgets the prefix it cached."""
        b, _ = self.free.popitem(last=False)
        if self.hash_of[b] != NO_HASH and self.cached.get(self.hash_of[b]) == b:
            del self.cached[self.hash_of[b]]
        self.hash_of[b], self.tokens_of[b] = NO_HASH, ()
        return b

    def allocate(self, seq_id, token_ids) -> int:
        """Give ``seq_id`` a block table for its prompt; return how many leading tokens are already cached.

        Full blocks whose chained key is cached (computed by an earlier sequence) are shared (reference
        count + 1). At least the last prompt token is always left uncached, so the model computes the
        logits of the next token. The other blocks are registered by ``mark_computed`` once computed."""
        tokens = [int(t) for t in token_ids]
        if seq_id in self.seqs:
            raise ValueError(f"seq_id={seq_id!r} is already allocated")
        if not tokens:
            raise ValueError("token_ids is empty: a sequence needs at least one token")
        self._check_length(len(tokens), "prompt")
        bs, n_blocks = self.block_size, self.blocks_needed(len(tokens))
        # Plan first (no state changes), so a failure leaves the manager untouched.
        plan, parent, hit = [], NO_HASH, self.prefix_caching
        for i in range(n_blocks):
            chunk = tuple(tokens[i * bs : (i + 1) * bs])
            key = block_hash(chunk, parent) if len(chunk) == bs else NO_HASH
            b = self.cached.get(key) if hit and key != NO_HASH and (i + 1) * bs < len(tokens) else None
            if b is None or self.tokens_of[b] != chunk:
                hit, b = False, None
            plan.append((b, key, chunk))
            parent = key
        fresh = sum(b is None for b, _, _ in plan)
        revived = sum(b is not None and self.ref_count[b] == 0 for b, _, _ in plan)
        if fresh + revived > len(self.free):
            raise OutOfBlocksError(
                f"prompt of {len(tokens)} tokens needs {fresh + revived} free blocks, "
                f"{len(self.free)} of num_blocks={self.num_blocks} are free"
            )
        seq = _Seq(tokens)
        for b, _, _ in plan:  # revive cached blocks nobody was using before taking fresh ones
            if b is not None:
                self.free.pop(b, None)
                seq.cached_tokens += bs
        seq.hashed = seq.cached_tokens // bs
        for b, _, _ in plan:
            if b is None:
                b = self._take_free()
            self.ref_count[b] += 1
            seq.table.append(b)
        self.seqs[seq_id] = seq
        self.stats["prompt_tokens"] += len(tokens)
        self.stats["cached_tokens"] += seq.cached_tokens
        return seq.cached_tokens

    def _register(self, b: int, key: int, chunk: tuple) -> None:
        self.hash_of[b], self.tokens_of[b] = key, chunk
        self.cached.setdefault(key, b)  # an equal block computed twice: the first stays the cached one

    def mark_computed(self, seq_id, num_computed_tokens: int) -> None:
        """The first ``num_computed_tokens`` tokens of ``seq_id`` now have their K/V in the cache: register
        every full block among them in the prefix cache (call after the forward that computed them).

        This is the only place a block becomes a prefix-cache hit, so a block whose K/V were never
        written (chunked prefill not there yet, a preempted sequence) cannot be found by another request."""
        s = self._seq(seq_id)
        n = check_int(f"num_computed_tokens of seq_id={seq_id!r}", num_computed_tokens, 0, len(s.tokens))
        bs = self.block_size
        while self.prefix_caching and s.hashed < n // bs:
            i = s.hashed
            parent = self.hash_of[s.table[i - 1]] if i else NO_HASH
            chunk = tuple(s.tokens[i * bs : (i + 1) * bs])
            key, b = block_hash(chunk, parent), s.table[i]
            if self.hash_of[b] == NO_HASH:
                self._register(b, key, chunk)
            elif self.hash_of[b] != key:  # a shared block (fork, hit) is registered by the first owner
                raise AssertionError(f"block {b} of seq_id={seq_id!r} is registered under another key")
            s.hashed += 1
        if self.events is not None:
            self.events.append(("computed", tuple(s.table[: n // bs])))

    def forget_prefixes(self) -> None:
        """Empty the prefix cache (e.g. new weights make every cached K/V stale); blocks stay allocated.

        Sequences alive now keep their K/V but never register them: they were computed before the cut."""
        self.cached.clear()
        self.hash_of = [NO_HASH] * self.num_blocks
        self.tokens_of = [()] * self.num_blocks
        for s in self.seqs.values():
            s.hashed = self.num_blocks  # past any block index: ``mark_computed`` registers nothing more

    def append_token(self, seq_id, token_id: int) -> tuple[int, int] | None:
        """Reserve the slot of one more token of ``seq_id``.

        Returns ``(src, dst)`` when the last block was shared and had to be copied first
        (copy-on-write: the caller copies the K/V of block ``src`` to ``dst``), else ``None``."""
        s = self._seq(seq_id)
        n, bs = len(s.tokens), self.block_size
        self._check_length(n + 1, "sequence")
        copy = None
        if n % bs == 0:  # the last block is full (or there is none): start a new one
            if not self.free:
                raise OutOfBlocksError(
                    f"seq_id={seq_id!r} needs a new block at {n + 1} tokens, 0 of num_blocks={self.num_blocks} are free"
                )
            b = self._take_free()
            self.ref_count[b] += 1
            s.table.append(b)
        elif self.ref_count[s.table[-1]] > 1:  # shared, partly filled last block: copy before writing
            if not self.free:
                raise OutOfBlocksError(
                    f"seq_id={seq_id!r} must copy its shared last block, 0 of num_blocks={self.num_blocks} are free"
                )
            src, dst = s.table[-1], self._take_free()
            self.ref_count[src] -= 1
            self.ref_count[dst] += 1
            s.table[-1] = dst
            copy = (src, dst)
        s.tokens.append(int(token_id))  # its block is registered by ``mark_computed`` once its K/V exist
        return copy

    def truncate(self, seq_id, num_tokens: int) -> None:
        """Keep the first ``num_tokens`` tokens of ``seq_id``: drop the slots after them (speculative
        decoding's rollback of rejected drafts); blocks the cut empties lose this sequence's reference
        (back to the free list when nobody else holds them). A block registered in the prefix cache
        cannot be cut into (rejected tokens are never registered: ``mark_computed`` comes after)."""
        s = self._seq(seq_id)
        n = check_int(f"num_tokens of seq_id={seq_id!r}", num_tokens, 1, len(s.tokens))
        bs, keep = self.block_size, self.blocks_needed(n)
        for i in range(n // bs, min(s.hashed, len(s.table))):
            if self.hash_of[s.table[i]] != NO_HASH:
                raise ValueError(
                    f"num_tokens={n} cuts into block {i} of seq_id={seq_id!r}, already in the prefix cache"
                )
        del s.tokens[n:]
        while len(s.table) > keep:
            b = s.table.pop()
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free_block(b)

    def fork(self, parent_id, child_id) -> None:
        """``child_id`` shares every block of ``parent_id`` (parallel sampling, beam search)."""
        p = self._seq(parent_id)
        if child_id in self.seqs:
            raise ValueError(f"child_id={child_id!r} is already allocated")
        for b in p.table:
            self.ref_count[b] += 1
        self.seqs[child_id] = _Seq(list(p.tokens), list(p.table), p.cached_tokens, p.hashed)

    def free_seq(self, seq_id) -> None:
        """Drop ``seq_id``'s references; blocks nobody references go back to the free list."""
        s = self._seq(seq_id)
        for b in reversed(s.table):  # tail blocks first, so shared prefixes are the last to be reused
            self.ref_count[b] -= 1
            if self.ref_count[b] == 0:
                self.free_block(b)
        del self.seqs[seq_id]

    def free_block(self, block_id: int) -> None:
        """Return one unreferenced block to the free list (it keeps its cached prefix until reused)."""
        check_int(f"block_id (num_blocks={self.num_blocks})", block_id, 0, self.num_blocks - 1)
        if self.ref_count[block_id] > 0:
            users = [sid for sid, s in self.seqs.items() if block_id in s.table]
            raise ValueError(
                f"block {block_id} is still referenced: ref_count={self.ref_count[block_id]} "
                f"(block tables of seq_ids {users}); free those sequences first"
            )
        if block_id in self.free:
            raise ValueError(f"block {block_id} is already free (double free)")
        self.free[block_id] = None
        if self.events is not None:
            self.events.append(("freed", (block_id,)))

    def take_events(self) -> list[tuple[str, tuple[int, ...]]]:
        """What happened to blocks since the last call, oldest first, and forget it (vLLM's ``BlockPool.take_events``).

        ``("computed", block ids)``: after ``mark_computed``, the sequence's blocks that are full of computed
        tokens; ``("freed", (block id,))``: a block went back to the free list. Always empty unless the manager
        was made with ``record_events=True``. The manager knows nothing of who reads them (``PagedKVCache``'s
        quantized pool does: it quantizes the K of computed full blocks and frees the K residual of freed ones)."""
        if self.events is None:
            return []
        events = self.events[:]
        del self.events[: len(events)]  # one list operation: an event appended meanwhile (another thread) stays
        return events

    # ---- checks --------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """Recount everything from the block tables; raise ``AssertionError`` naming the first broken rule."""
        counts = [0] * self.num_blocks
        for sid, s in self.seqs.items():
            assert len(set(s.table)) == len(s.table), f"seq {sid!r}: a block appears twice in {s.table}"
            need = self.blocks_needed(len(s.tokens))
            assert len(s.table) == need, f"seq {sid!r}: {len(s.table)} blocks for {len(s.tokens)} tokens (need {need})"
            for b in s.table:
                counts[b] += 1
            for i, b in enumerate(s.table):
                if self.hash_of[b] != NO_HASH:
                    chunk = tuple(s.tokens[i * self.block_size : (i + 1) * self.block_size])
                    assert self.tokens_of[b] == chunk, f"seq {sid!r}: cached block {b} holds other tokens"
        for b in range(self.num_blocks):
            assert counts[b] == self.ref_count[b], (
                f"block {b}: ref_count={self.ref_count[b]} but {counts[b]} block-table references"
            )
            assert (b in self.free) == (counts[b] == 0), (
                f"block {b}: {'free' if b in self.free else 'not free'} with {counts[b]} references"
            )
        assert len(self.free) + sum(c > 0 for c in counts) == self.num_blocks, "free + used != num_blocks"
        for key, b in self.cached.items():
            assert self.hash_of[b] == key, f"prefix cache maps key to block {b}, which holds another key"


def fragmentation(lengths, *, block_size: int, max_seq_len: int) -> dict:
    """Allocate sequences of ``lengths`` tokens in a ``BlockManager`` and count reserved vs used slots.

    Returns token slots used, slots reserved by paging (whole blocks), slots a contiguous allocator
    reserving ``max_seq_len`` per sequence would hold, and the per-sequence paging waste (each
    <= block_size - 1)."""
    lengths = [int(n) for n in lengths]
    num_blocks = sum(math.ceil(n / block_size) for n in lengths)
    m = BlockManager(num_blocks, block_size, max_seq_len=max_seq_len, prefix_caching=False)
    for i, n in enumerate(lengths):
        m.allocate(i, range(n))
    m.check_invariants()
    waste = [m.waste(i) for i in range(len(lengths))]
    used = sum(lengths)
    paged = sum(len(m.block_table(i)) for i in range(len(lengths))) * block_size
    contiguous = max_seq_len * len(lengths)
    return {
        "tokens": used,
        "paged_slots": paged,
        "contiguous_slots": contiguous,
        "waste_per_seq": waste,
        "paged_utilization": used / paged,
        "contiguous_utilization": used / contiguous,
    }
