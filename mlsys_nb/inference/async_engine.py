"""Async scheduling (vLLM v1's; ``EngineConfig.async_scheduling=True``): ``AsyncScheduling``, the step of
``AsyncLLMEngine`` (``engine.py``: ``class AsyncLLMEngine(AsyncScheduling, LLMEngine)``), and its worker.

While step t's forward runs on the caller's thread, a worker thread (``LookAhead``) schedules step t+1 and
builds its input tensors, as if each sequence that samples at step t already had its token (a
``PLACEHOLDER``); when step t has sampled, the real tokens are written where the placeholders are
(``fill_in``). A sequence that finished at step t loses the slot reserved for it and its prepared batch is
built again without it. Outputs are those of the synchronous engine. Not with ``speculative_model`` (drafting
needs the sampled token). ``close()`` joins the thread; the engine then goes on synchronously.

Its ``step`` is ``LLMEngine.step`` with the schedule and the batch usually taken ready from the look-ahead and
the next look-ahead started beside the forward; scheduling, sampling, the outputs and the fault isolation are
``LLMEngine``'s parts (this file imports nothing of the engine: the engine imports it).

No copy races a forward: the look-ahead only DECIDES (``scheduler.SchedulerOutput``; the block manager's
bookkeeping, no tensor), and every K/V copy it decides (swap out, copy-on-write, swap in) is done by the
runner's ``move_blocks`` on the engine's thread at the start of the step that runs it, after the previous
forward has returned. The pool syncs with its block manager only there (``kv.sync()`` inside
``move_blocks``), never at the end of a step: the look-ahead has already freed blocks whose K/V the next
step copies out first.
``LLMEngine(..., async_scheduling=True)`` builds an ``AsyncLLMEngine``.
"""

from __future__ import annotations

import time
import weakref
from concurrent.futures import ThreadPoolExecutor

import torch

from ..runtime.profiling import ranged
from ..runtime.timing import Laps
from .scheduler import SchedulerOutput
from .sequence import RequestOutput, Sequence, SequenceStatus

__all__ = ["LOOKAHEAD_TIMEOUT_S", "PLACEHOLDER", "AsyncScheduling", "LookAhead"]

PLACEHOLDER = -1  # async scheduling: the input id of a token the step in flight has not sampled yet
LOOKAHEAD_TIMEOUT_S = 120.0  # the longest one thread of async scheduling waits for the other


class LookAhead:
    """Async scheduling's worker: one thread that prepares step t+1 while the engine's thread runs step t's
    forward (torch's operators release the GIL while they compute).

    ``start(fn, *args)`` runs ``fn`` on the worker. ``result(future)`` waits for it (at most
    ``LOOKAHEAD_TIMEOUT_S`` seconds) and, if it raised, stops the worker and raises a ``RuntimeError`` from
    its exception: a look-ahead that failed half-way leaves the engine's state half-updated, so the engine
    refuses further steps. ``close()`` joins the thread; it also runs when the engine is garbage-collected."""

    def __init__(self, owner):
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="mlsys-lookahead")
        self.next = None  # (scheduled, batch, worker seconds) prepared for the next step, or None
        self.error: BaseException | None = None
        self._finalizer = weakref.finalize(owner, self.pool.shutdown, True)  # no reference to the engine

    def start(self, fn, *args):
        return self.pool.submit(fn, *args)

    def result(self, future):
        try:
            return future.result(timeout=LOOKAHEAD_TIMEOUT_S)
        except BaseException as e:
            self.error, self.next = e, None
            timed_out = not future.done()
            self._finalizer.detach()
            self.pool.shutdown(wait=not timed_out, cancel_futures=True)  # a stuck worker cannot be joined
            raise RuntimeError(
                f"async scheduling: preparing the next step failed ({type(e).__name__}: {e}); the engine is stopped"
            ) from e

    def close(self) -> None:
        self._finalizer()


class AsyncScheduling:
    """The step of an engine whose next step is prepared on a worker thread during this step's forward
    (module docstring), mixed into ``LLMEngine`` as ``AsyncLLMEngine``: it overrides ``step`` (and
    ``close``) and calls ``LLMEngine``'s parts. Its ``step_times`` gain ``lookahead`` (the worker's
    seconds, overlapped with the previous forward), ``wait`` (seconds the worker outlasted this forward)
    and ``overlapped`` (the share of the worker's time that ran beside the forward, in [0, 1]).
    ``lookahead``: its ``LookAhead`` worker (``lookahead.next``: what it prepared for the next step), None
    once closed."""

    def __init__(self, model, tokenizer=None, config=None, **options):
        super().__init__(model, tokenizer, config, **options)
        self.lookahead = LookAhead(self)

    @ranged("engine.step")
    def step(self) -> list[RequestOutput]:
        """``LLMEngine.step`` with step t+1's schedule and batch prepared on the worker during the forward."""
        ahead = self.lookahead
        if ahead is None:  # closed: the synchronous step
            return super().step()
        if ahead.error is not None:
            raise RuntimeError("async scheduling failed in an earlier step: the engine is stopped") from ahead.error
        t = Laps()  # wall seconds of the phases of this step
        out, batch, extra = self._take_prepared()  # 1. schedule: usually decided by the look-ahead
        if not out.scheduled:  # nothing prepared (or all of it finished since): schedule now
            self.runner.move_blocks(out)
            out, batch = self._schedule(), None
        self.runner.move_blocks(out)  # the copies it decided, here: no forward is running
        t("schedule")
        scheduled = out.scheduled
        if not scheduled:
            return self._idle()
        batch = batch if batch is not None else self.runner.prepare(scheduled)
        t("prepare")
        future = ahead.start(self._look_ahead, scheduled, list(batch.sample_seqs))  # step t+1, on the worker
        f0 = time.perf_counter()
        try:  # 2. run: this step's forward, beside the worker
            logits = self.runner.forward(batch)
        except Exception as e:
            self._undo_look_ahead(future, scheduled, batch.sample_seqs)
            return self._isolate_forward(scheduled, e)
        t("model")
        self._join(future, (f0, time.perf_counter()), batch.sample_seqs)
        t("wait")
        tokens, logprobs, failed = self._sample(logits, batch.sample_seqs)  # 3. sample
        t("sample")
        for seq, _ in scheduled:  # 4. update: the look-ahead advanced the computed counts; the blocks are hits now
            if seq.status is SequenceStatus.RUNNING:
                self.manager_mark(seq)
        outputs = self._outputs(batch.sample_seqs, tokens, logprobs, [], failed)  # 5. outputs
        self.fill_in(batch.sample_seqs)
        t("postprocess")
        self.metrics.record_step(t.times, scheduled, batch.num_decodes, **extra)
        return outputs

    def _join(self, future, forward: tuple[float, float], sampling: list[Sequence]) -> None:
        """Wait for the look-ahead (raises what the worker raised), keep what it prepared and the share of its
        time spent inside ``forward`` (start, end; perf_counter seconds); take its placeholders back out:
        the real tokens come from this step's sampler."""
        ahead = self.lookahead
        ahead.next = ahead.result(future)
        (w0, w1), (f0, f1) = ahead.next[2].pop("span"), forward
        ahead.next[2]["overlapped"] = max(0.0, min(w1, f1) - max(w0, f0)) / max(w1 - w0, 1e-12)
        for seq in sampling:
            seq.output_token_ids.pop()

    def _look_ahead(self, scheduled, sampling: list[Sequence]):
        """On the worker, while step t's forward runs: step t+1's ``SchedulerOutput`` and batch, as if step t
        were done (every scheduled token computed, a ``PLACEHOLDER`` token for each sequence that samples); it
        touches the block manager only, no tensor of the pool. Returns (output, batch or None, {"lookahead":
        worker seconds, "span": its start and end, perf_counter})."""
        t0 = time.perf_counter()
        for seq, n in scheduled:
            seq.num_computed_tokens += n
        for seq in sampling:
            seq.output_token_ids.append(PLACEHOLDER)
        nxt = self._schedule()
        batch = self.runner.prepare(nxt.scheduled) if nxt.scheduled else None
        t1 = time.perf_counter()
        return nxt, batch, {"lookahead": t1 - t0, "span": (t0, t1)}

    def fill_in(self, sampled: list[Sequence]) -> None:
        """After step t: its sampled tokens replace the placeholders in the block manager's token lists
        (their block hashes are computed from them) and in the prepared batch's input ids."""
        live = [s for s in sampled if not s.finished]
        seqs = self.kv.manager.seqs
        for seq in live:
            held = seqs.get(seq.seq_id)
            if held is not None and len(held.tokens) >= seq.num_tokens:  # its slot was reserved in step t+1
                held.tokens[seq.num_tokens - 1] = seq.output_token_ids[-1]
        nxt = self.lookahead.next
        if nxt is None or nxt[1] is None:
            return
        want, rows, toks, off = {s.seq_id: s for s in live}, [], [], 0
        for seq, n in nxt[1].scheduled:  # packed order: a decode's one input id at its offset
            if seq.seq_id in want:
                rows.append(off)
                toks.append(seq.output_token_ids[-1])
            off += n
        if rows:
            nxt[1].tokens[0, rows] = torch.tensor(toks, dtype=nxt[1].tokens.dtype, device=nxt[1].tokens.device)

    def _take_prepared(self):
        """The look-ahead's ``SchedulerOutput`` and batch for this step, without the sequences that finished (or
        were aborted) since: their batch is built again (its block moves stay). An empty output when there is
        none."""
        nxt, self.lookahead.next = self.lookahead.next, None
        if nxt is None:
            return SchedulerOutput(), None, {}
        out, batch, extra = nxt
        live = [(s, n) for s, n in out.scheduled if s.status is SequenceStatus.RUNNING]
        if len(live) < len(out.scheduled):
            out.scheduled, batch = live, self.runner.prepare(live) if live else None
        return out, batch, extra

    def _undo_look_ahead(self, future, scheduled, sampling) -> None:
        """Step t's forward raised: take back what the look-ahead assumed (placeholders, their reserved
        slots, the advanced computed counts); sequences it admitted stay admitted, and the block moves it
        decided are done (a swapped-out sequence's blocks are already free)."""
        self.runner.move_blocks(self.lookahead.result(future)[0])
        self.lookahead.next = None
        mgr = self.kv.manager
        for seq in sampling:
            seq.output_token_ids.pop()
            if seq.seq_id in mgr.seqs and mgr.num_tokens(seq.seq_id) > seq.num_tokens:
                mgr.truncate(seq.seq_id, seq.num_tokens)
        for seq, n in scheduled:
            if seq.status is not SequenceStatus.WAITING:  # a preempted (recompute) one starts from 0 anyway
                seq.num_computed_tokens -= n

    def close(self) -> None:
        """Join the worker thread (also done when the engine is garbage-collected); the engine goes on
        synchronously (a batch the worker prepared is dropped: its sequences keep their reserved slots and
        are scheduled again)."""
        if self.lookahead is not None:
            self.lookahead.close()
            if self.lookahead.next is not None:  # its block moves were decided: do them
                self.runner.move_blocks(self.lookahead.next[0])
            self.lookahead = None
