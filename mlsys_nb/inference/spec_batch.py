"""Speculative decoding inside continuous batching (``LLMEngine`` with ``speculative_model``): ``BatchSpeculator``
drafts for every running decode (``propose``), the engine feeds each decode and its drafts as one (k+1)-token
verify chunk (``VerifyView``, ``verify_feed``) in its one batched forward, and ``accept`` applies the
rejection rule (``speculative.verify``) per sequence and rolls the rejected slots back. The rule and the
reference loop at batch 1 are ``speculative.py``'s.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import check_choice, check_int
from .loading import resolve_model
from .model_runner import ModelRunner
from .paged import PagedKVCache
from .sampler import apply_mask, filter_probs
from .speculative import SpecDecodingCounters, ngram_propose, sample_inverse_cdf, to_probs, verify

__all__ = [
    "BatchSpeculator",
    "Draft",
    "build_speculator",
    "VerifyView",
    "draw_uniform",
    "grammar_allows",
    "split_verify",
    "target_dist",
    "verify_feed",
]


class VerifyView:
    """What ``model_runner.StepBatch`` reads of a sequence, for a verify chunk or a draft-model row:
    its ``seq_id`` (block table), ``token_ids`` (here with the drafted tokens appended),
    ``num_computed_tokens`` and ``num_logits`` (rows of logits wanted at the end of the chunk)."""

    __slots__ = ("seq_id", "token_ids", "num_computed_tokens", "num_logits")

    def __init__(self, seq_id, token_ids, num_computed_tokens: int, num_logits: int = 1):
        self.seq_id, self.token_ids = seq_id, token_ids
        self.num_computed_tokens, self.num_logits = num_computed_tokens, num_logits

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


@dataclass
class Draft:
    """One sequence's proposal in one engine step: ``length`` tokens known before drafting (L), the
    drafted ``tokens`` d_1..d_k and their draft distributions ``q`` [k, V] (one-hot for n-gram)."""

    seq: object
    length: int
    tokens: list[int]
    q: list[torch.Tensor]


class BatchSpeculator:
    """Speculative decoding for every running decode of ``LLMEngine`` (vLLM v1's design in small).

    Per engine step: ``propose`` drafts up to ``k`` tokens for each decode sequence (a draft
    ``Transformer`` over its OWN paged pool, one packed draft forward per drafted position, or
    ``"ngram"``) and reserves their slots in the target's pool; the engine feeds each as a (k+1)-token
    verify chunk (``VerifyView``) in the ONE batched target forward, next to the prefill chunks and
    plain decodes; ``accept`` applies ``verify`` (the rejection rule) per sequence and rolls back the
    rejected tokens' slots (``BlockManager.truncate``: ``num_computed_tokens`` back to L + accepted,
    blocks the cut empties freed) BEFORE ``mark_computed``, so the prefix cache never registers a
    rejected token. The draft pool is rolled back the same way.

    Target and draft distributions are the engine sampler's (``filter_probs``: temperature, top_k,
    top_p, min_p; one-hot argmax at temperature 0) after the request's grammar mask, so drafts are
    checked against the grammar too. Requests with logit processors (penalties, logit_bias,
    min_tokens) are not speculated: they decode one token per step through the sampler."""

    def __init__(self, draft, k: int, target_kv, *, max_model_len: int, max_num_seqs: int):
        self.k, self.target_kv = check_int("num_speculative_tokens", k, 1), target_kv
        self.max_model_len = max_model_len  # tokens of context: no draft beyond it
        # vLLM's speculative-decoding counters (verified drafts, drafted and accepted tokens, accepted per
        # position), counted by the acceptance rule; /metrics exports them (``LLMEngine.spec_counters``)
        self.counters = SpecDecodingCounters(self.k)
        self.ngram = isinstance(draft, str)
        if self.ngram:
            check_choice("speculative_model (or a Transformer)", draft, ("ngram",))
            return
        if draft.cfg.seq_len < max_model_len:
            raise ValueError(
                f"speculative_model context cfg.seq_len={draft.cfg.seq_len} is shorter than the target's "
                f"max_model_len={max_model_len}"
            )
        p = next(draft.parameters())
        m = target_kv.manager  # as many blocks as the target, plus k slots' worth per sequence
        self.kv = PagedKVCache(
            draft.cfg,
            num_blocks=m.num_blocks + max_num_seqs * m.blocks_needed(k),
            block_size=m.block_size,
            dtype=p.dtype,
            device=p.device,
            prefix_caching=False,
            max_seq_len=max_model_len,
        )
        self.runner = ModelRunner(draft, self.kv)
        self.views: dict[int, VerifyView] = {}  # seq_id -> the draft's view (its tokens, K/V computed)

    # ---- bookkeeping of the draft pool ---------------------------------------------------------
    def release(self, keep_ids) -> None:
        """Free the draft state of sequences no longer running (finished, preempted, aborted)."""
        if self.ngram:
            return
        for sid in [s for s in self.views if s not in keep_ids]:
            self.kv.manager.free_seq(sid)
            del self.views[sid]

    def _draft_view(self, seq) -> VerifyView | None:
        """The draft's view of ``seq`` with slots for all its tokens (None when the draft pool is full)."""
        m, sid, toks = self.kv.manager, seq.seq_id, seq.token_ids
        v = self.views.get(sid)
        try:
            if v is None:
                m.allocate(sid, toks)
                v = self.views[sid] = VerifyView(sid, list(toks), 0)
            else:
                for t in toks[m.num_tokens(sid) :]:
                    self.kv.append_tokens({sid: t})
                v.token_ids = list(toks)
        except Exception:  # the draft pool is full: this sequence is not drafted now (restarts later)
            if sid in m.seqs:
                m.free_seq(sid)
            self.views.pop(sid, None)
            return None
        return v

    # ---- one step ------------------------------------------------------------------------------
    def propose(self, scheduled, token_budget: int, generator) -> dict[int, Draft]:
        """Drafts (seq_id -> ``Draft``) for the scheduled decodes [(sequence, new tokens)] that can take them:
        k_i = min(k, tokens the request may still produce − 1, context left − 1, ``token_budget`` left, in
        tokens); none for requests with logit processors. ``generator``: the engine's, for unseeded requests."""
        wants = []
        for seq, n in scheduled:
            p = seq.params
            if n != 1 or seq.num_uncomputed != 1 or not seq.output_token_ids or p.processes_logits:
                continue
            ki = min(self.k, p.max_tokens - len(seq.output_token_ids) - 1, self.max_model_len - seq.num_tokens - 1)
            ki = min(ki, token_budget)
            if ki > 0:
                wants.append((seq, ki))
                token_budget -= ki
        drafts = self._draft(wants, generator) if wants else {}
        for d in drafts.values():
            if d.seq.spec is not None:
                d.seq.spec.drafted += len(d.tokens)
                d.seq.spec.draft_forwards += 0 if self.ngram else len(d.tokens)
        return drafts

    @torch.no_grad()
    def _draft(self, wants: list[tuple[object, int]], generator) -> dict[int, Draft]:
        """Drafts for ``wants`` = [(sequence, k_i)], each token drawn from the draft's distribution after the
        sequence's grammar mask (``target_dist``). Reserves the drafted tokens' slots in the target's pool
        (fewer tokens where the pool runs out)."""
        out = {s.seq_id: Draft(s, s.num_tokens, [], []) for s, _ in wants}
        if self.ngram:
            for seq, ki in wants:
                d = out[seq.seq_id]
                for t in ngram_propose(seq.token_ids, ki):
                    if not grammar_allows(seq, d.tokens, t):  # the grammar refuses it: stop there
                        break
                    d.tokens.append(t)
                V = self.target_kv.cfg.vocab_size
                d.q = [torch.nn.functional.one_hot(torch.tensor(t), V).float() for t in d.tokens]
        else:
            todo = {}
            for seq, ki in wants:
                v = self._draft_view(seq)
                if v is not None:
                    todo[seq.seq_id] = (seq, v, ki)
            while todo:
                sched = [(v, v.num_tokens - v.num_computed_tokens) for _, v, _ in todo.values()]
                logits, batch = self.runner.run(sched)
                for row, v in zip(logits, batch.sample_seqs):
                    seq, _, ki = todo[v.seq_id]
                    d = out[v.seq_id]
                    v.num_computed_tokens = v.num_tokens
                    q = target_dist(seq, row, d.tokens)
                    t = int(sample_inverse_cdf(q, draw_uniform(seq, generator)))
                    d.tokens.append(t)
                    d.q.append(q)
                    if len(d.tokens) == ki:  # the last draft is never fed to the draft model
                        del todo[v.seq_id]
                        continue
                    try:
                        self.kv.append_tokens({v.seq_id: t})
                        v.token_ids.append(t)
                    except Exception:  # draft pool full: propose what we have
                        del todo[v.seq_id]
        for sid, d in list(out.items()):  # slots for the drafts in the target's pool
            for i, t in enumerate(d.tokens):
                try:
                    self.target_kv.append_tokens({sid: t})
                except Exception:
                    del d.tokens[i:], d.q[i:]
                    break
            if not d.tokens:
                del out[sid]
        return out

    def undo(self, drafts: dict[int, Draft]) -> None:
        """The verify forward failed: give back every drafted slot (target and draft pools)."""
        for d in drafts.values():
            self.rollback(d, 0)
            d.seq.num_computed_tokens = d.length - 1  # the last known token is not computed either

    def rollback(self, d: Draft, n_accepted: int) -> None:
        """Keep L + n_accepted tokens' slots (the last known token and the accepted drafts) in both pools."""
        keep = d.length + n_accepted
        self.target_kv.manager.truncate(d.seq.seq_id, keep)
        d.seq.num_computed_tokens = keep
        v = None if self.ngram else self.views.get(d.seq.seq_id)
        if v is not None:
            valid = min(v.num_computed_tokens, keep)
            self.kv.manager.truncate(v.seq_id, max(valid, 1))
            del v.token_ids[max(valid, 1) :]
            v.num_computed_tokens = valid

    def accept(self, d: Draft, logits: torch.Tensor, generator) -> list[int]:
        """The rejection rule on one sequence: ``logits`` [k+1, V] of its verify chunk, the target's
        distributions ``target_dist``, uniform draws from the sequence's generator (else ``generator``).
        Rolls back the rejected slots, counts the result (``counters``, ``seq.spec``) and returns the emitted
        tokens: the accepted drafts and one more."""
        k, seq = len(d.tokens), d.seq
        p = torch.stack([target_dist(seq, logits[j], d.tokens[:j]) for j in range(k + 1)])
        q = torch.stack(d.q)
        u_acc = torch.stack([draw_uniform(seq, generator) for _ in range(k)])[None]
        n_acc, nxt = verify(p[None], q[None], torch.tensor([d.tokens]), u_acc, draw_uniform(seq, generator)[None])
        n = int(n_acc[0])
        self.rollback(d, n)
        self.counters.observe(k, n)
        s = seq.spec
        if s is not None:
            s.target_forwards += 1
            s.tested += n + (n < k)
            s.accepted += n
            s.accepted_per_step.append(n)
        return d.tokens[:n] + [int(nxt[0])]


def build_speculator(config, model, target_kv, max_model_len: int) -> BatchSpeculator | None:
    """The engine's speculator: ``config.speculative_model`` (an ``EngineConfig``'s: a draft model, a preset name
    or "ngram"; a preset's random weights from ``seed + 1``) drafting ``num_speculative_tokens`` for ``model``,
    whose pool is ``target_kv``; None without one."""
    draft = config.speculative_model
    if draft is None:
        return None
    if draft != "ngram":
        draft = resolve_model(draft, config.seed + 1).eval()
        if draft.cfg.vocab_size != model.cfg.vocab_size:
            raise ValueError(
                f"speculative_model vocab_size={draft.cfg.vocab_size} differs from the target's {model.cfg.vocab_size}"
            )
    return BatchSpeculator(
        draft, config.num_speculative_tokens, target_kv, max_model_len=max_model_len, max_num_seqs=config.max_num_seqs
    )


def verify_feed(scheduled, drafts: dict[int, Draft]) -> list:
    """What the target's forward computes: the scheduled ``[(sequence, new tokens)]``, a decode with k drafts
    as a (k+1)-token verify chunk (a ``VerifyView`` wanting k+1 rows of logits)."""
    feed = []
    for seq, n in scheduled:
        d = drafts.get(seq.seq_id)
        if d is None:
            feed.append((seq, n))
        else:
            m = 1 + len(d.tokens)
            feed.append((VerifyView(seq.seq_id, seq.token_ids + d.tokens, seq.num_computed_tokens, m), m))
    return feed


def split_verify(batch, logits: torch.Tensor, drafts: dict[int, Draft]):
    """The logits [rows, vocab] of a batch built from ``verify_feed`` split into (one row per sampled sequence,
    [(draft, its k+1 rows)]); the verify chunks leave ``batch.sample_seqs``."""
    verify_rows, rows, off = [], [], 0
    for seq, m in zip(batch.sample_seqs, batch.num_logits):
        if isinstance(seq, VerifyView):
            verify_rows.append((drafts[seq.seq_id], logits[off : off + m]))
        else:
            rows.append(off)
        off += m
    if verify_rows:
        logits = logits[rows]
        batch.sample_seqs = [s for s in batch.sample_seqs if not isinstance(s, VerifyView)]
    return logits, verify_rows


def target_dist(seq, logits: torch.Tensor, extra: list[int]) -> torch.Tensor:
    """The distribution [V] the engine's sampler draws ``seq``'s next token from after ``extra`` more
    tokens: the grammar mask, then temperature/top_k/top_p/min_p (one-hot argmax when greedy)."""
    if seq.allowed is not None:
        mask = seq.allowed(seq.output_token_ids + extra)
        if mask is not None:
            logits = apply_mask(logits, mask)
    p = seq.params
    if p.greedy:
        return to_probs(logits, 0)
    return filter_probs(logits.float(), p.temperature, p.top_k, p.top_p, p.min_p)


def grammar_allows(seq, extra: list[int], tok: int) -> bool:
    """Whether ``seq``'s grammar lets ``tok`` follow its output and ``extra`` (True without a grammar)."""
    if seq.allowed is None:
        return True
    mask = seq.allowed(seq.output_token_ids + extra)
    return mask is None or bool(mask[tok])


def draw_uniform(seq, generator) -> torch.Tensor:
    """One uniform draw in [0, 1) from the sequence's generator (a seeded request's), else ``generator``."""
    return torch.rand((), generator=seq.generator or generator)
