"""Speculative decoding: a cheap proposer guesses k tokens, the target checks them in ONE forward.

Why it pays: at batch 1 a decode step reads every weight of the target to produce one token
(memory-bound), so a forward over k+1 tokens costs about the same as over 1. A draft proposes
``d_1..d_k``; the target's forward over ``[last, d_1..d_k]`` gives its distributions
``p_1..p_{k+1}``; the accepted prefix plus one more token is kept; the rejected tokens' KV-cache
entries are rolled back (``cache.lengths -= k - n``: later writes overwrite them).

The acceptance rule (Leviathan et al., 2023, arXiv:2211.17192, Algorithm 1; Chen et al., 2023,
arXiv:2302.01318, Algorithm 2) keeps the output distributed exactly as the target's:

- accept ``d_i`` with probability ``min(1, p_i(d_i) / q_i(d_i))`` (``accept_prob``), in order;
- at the first rejection, sample the replacement from ``normalize(max(0, p_i - q_i))`` (``residual``);
- if all k are accepted, sample a bonus token from ``p_{k+1}``.

So one step yields 1..k+1 tokens. With a per-token acceptance probability α (Leviathan et al.'s
β, expectation of ``sum(min(p, q))``), the expected tokens per target forward are
``(1 - α^(k+1)) / (1 - α)`` (``expected_tokens_per_step``; their Eq. 1), and with a draft forward
costing ``c`` target forwards the wall-clock speed-up is that divided by ``k·c + 1``
(``expected_speedup``; their Theorem 3.8). ``best_k`` maximises it. These are models: the
benchmark ``benchmarks/speculative.py`` measures α, tokens per forward and the speed-up beside them.

Temperature 0 uses one-hot distributions (argmax), with which the rule reduces to "accept while
the draft's token is the target's argmax, then emit the target's argmax": the output equals the
target's greedy output token for token.

Proposers: a ``Transformer`` draft model (its own ``KVCache``, rolled back the same way), or
``"ngram"``: prompt lookup (Saxena, 2023, github.com/apoorvumang/prompt-lookup-decoding): find the
latest earlier occurrence of the last n tokens of the context (n = 3, 2, 1) and propose what
followed it. A deterministic proposer is a one-hot q: accept ``d`` with probability ``p(d)``, on
rejection sample from p with ``d`` removed.

``speculative_generate(target, prompt_ids, draft=..., k=4, max_new_tokens=..., temperature=...)``
is the reference loop (batch 1, contiguous caches) returning tokens and statistics.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import check_choice, check_int, check_number, check_probability
from ..runtime.timing import Laps
from .kv_cache import KVCache
from .sampler import apply_mask, filter_probs


__all__ = [
    "BatchSpeculator",
    "Draft",
    "SpecDecodingCounters",
    "SpecStats",
    "VerifyView",
    "accept_prob",
    "best_k",
    "expected_speedup",
    "expected_tokens_per_step",
    "ngram_propose",
    "residual",
    "sample_inverse_cdf",
    "speculative_generate",
    "to_probs",
    "verify",
]


# ---- closed forms (models, Leviathan et al., 2023) ---------------------------------------------
def _check_alpha_k(alpha, k):
    check_probability("alpha", alpha)
    check_int("k", k, 0)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per target forward, (1 − α^(k+1)) / (1 − α) (k + 1 when α = 1)."""
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Wall-clock speed-up over the target alone: tokens per step / (k · c + 1), c = draft forward
    time / target forward time (a model: verification of k+1 tokens assumed to cost one forward)."""
    check_number("cost_ratio", cost_ratio, 0)
    return expected_tokens_per_step(alpha, k) / (k * cost_ratio + 1.0)


def best_k(alpha: float, cost_ratio: float, k_max: int = 16) -> int:
    """The k in 0..k_max maximising ``expected_speedup`` (0 = do not speculate)."""
    _check_alpha_k(alpha, k_max)
    return max(range(k_max + 1), key=lambda k: expected_speedup(alpha, k, cost_ratio))


# ---- the acceptance rule ------------------------------------------------------------------------
def to_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) in fp32, or one-hot argmax when T == 0 (greedy)."""
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    return filter_probs(logits.float(), temperature)  # the engine sampler's distribution


def accept_prob(p_tok: torch.Tensor, q_tok: torch.Tensor) -> torch.Tensor:
    """min(1, p(d) / q(d)) for the drafted tokens d (q(d) > 0 since d was drawn from q)."""
    return torch.where(q_tok > 0, (p_tok / q_tok.clamp_min(1e-30)).clamp(max=1.0), torch.ones_like(p_tok))


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """normalize(max(0, p − q)) over the last dim; falls back to p where p == q (rejection then has
    probability 0, so the row is never used)."""
    r = (p - q).clamp_min(0.0)
    s = r.sum(-1, keepdim=True)
    return torch.where(s > 0, r / s.clamp_min(1e-30), p)


def sample_inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One index per row of ``weights`` [..., V] (a distribution: non-negative, summing to 1) for
    uniforms ``u`` [...] in [0, 1): the first index whose cumulative probability exceeds u (inverse
    CDF). Never returns a zero-probability index (rounding at the top goes to the last positive one).
    Weights that do not sum to 1 are NOT renormalised: that is ``residual``'s job."""
    cdf = weights.cumsum(-1)
    idx = torch.searchsorted(cdf, u.unsqueeze(-1).to(cdf.dtype), right=True).squeeze(-1)
    V = weights.shape[-1]
    last_pos = V - 1 - (weights > 0).flip(-1).float().argmax(-1)
    return torch.minimum(idx, last_pos)


def verify(p: torch.Tensor, q: torch.Tensor, draft: torch.Tensor, u_accept: torch.Tensor, u_sample: torch.Tensor):
    """Rejection sampling for a batch of independent steps.

    ``p`` [N, k+1, V] target probabilities, ``q`` [N, k, V] draft probabilities, ``draft`` [N, k]
    the drafted tokens, ``u_accept`` [N, k] and ``u_sample`` [N] uniforms in [0, 1). Returns
    ``(n_accepted [N], next_token [N])``: row i emits ``draft[i, :n_accepted[i]]`` then
    ``next_token[i]`` (the residual sample at the first rejection, or the bonus from p_{k+1})."""
    N, k = draft.shape
    rows = torch.arange(N)
    if k == 0:
        return torch.zeros(N, dtype=torch.long), sample_inverse_cdf(p[:, 0], u_sample)
    p_tok = p[:, :k].gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    q_tok = q.gather(-1, draft.unsqueeze(-1)).squeeze(-1)
    ok = u_accept < accept_prob(p_tok, q_tok)  # [N, k]
    n_acc = ok.long().cumprod(-1).sum(-1)  # accepted prefix: up to the first rejection
    at = n_acc.clamp(max=k - 1)
    dist = torch.where((n_acc < k)[:, None], residual(p[rows, at], q[rows, at]), p[:, k])
    return n_acc, sample_inverse_cdf(dist, u_sample)


# ---- proposers ----------------------------------------------------------------------------------
def ngram_propose(context: list[int], k: int, n_max: int = 3) -> list[int]:
    """Prompt lookup: the k tokens that followed the latest earlier occurrence of the context's last
    n tokens (n = n_max .. 1); [] when nothing matches."""
    L = len(context)
    for n in range(min(n_max, L - 1), 0, -1):
        tail = context[L - n :]
        for start in range(L - n - 1, -1, -1):
            if context[start : start + n] == tail:
                return context[start + n : start + n + k]
    return []


# ---- the generation loop ------------------------------------------------------------------------
@dataclass
class SpecStats:
    """Counts of one speculative run (measured)."""

    target_forwards: int = 0
    draft_forwards: int = 0
    drafted: int = 0  # tokens proposed
    tested: int = 0  # drafted tokens that reached the accept/reject test (up to the first rejection)
    accepted: int = 0
    emitted: int = 0  # tokens produced (accepted + corrections/bonuses)
    accepted_per_step: list[int] = field(default_factory=list)
    seconds: float = 0.0
    logprobs: list = field(default_factory=list)  # per emitted token: the target's raw log-softmax row (if asked)

    @property
    def alpha(self) -> float:
        """Per-token acceptance rate: accepted / tested (the geometric model's maximum-likelihood α)."""
        return self.accepted / self.tested if self.tested else 0.0

    @property
    def tokens_per_forward(self) -> float:
        return self.emitted / self.target_forwards if self.target_forwards else 0.0


class SpecDecodingCounters:
    """The engine's speculative-decoding counters, as vLLM v1 exposes them on ``/metrics`` (measured).

    Counted once per verified draft (a draft of one sequence that reached the target's batched verify
    forward and the acceptance rule): ``num_drafts`` (verified drafts), ``num_draft_tokens`` (their
    drafted tokens), ``num_accepted_tokens`` (accepted drafted tokens; corrections and bonus tokens are
    not counted) and ``accepted_per_pos[i]`` (drafts whose token at position i was accepted, i.e. at
    least i + 1 accepted). Acceptance rate = accepted / draft tokens (vLLM's definition: every drafted
    token counts, also those after the first rejection, which ``SpecStats.alpha`` leaves out); vLLM's mean
    acceptance length = 1 + accepted / drafts, the tokens a verified draft yields."""

    NAMES = ("num_drafts", "num_draft_tokens", "num_accepted_tokens")

    def __init__(self, k: int):
        check_int("k", k, 1)
        self.num_drafts = self.num_draft_tokens = self.num_accepted_tokens = 0
        self.accepted_per_pos = [0] * k

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        """One verified draft of ``num_draft_tokens`` tokens of which the first ``num_accepted`` were accepted."""
        if not 0 <= num_accepted <= num_draft_tokens <= len(self.accepted_per_pos):
            raise ValueError(
                f"num_accepted={num_accepted}, num_draft_tokens={num_draft_tokens}: need "
                f"0 <= num_accepted <= num_draft_tokens <= k={len(self.accepted_per_pos)}"
            )
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted tokens (dimensionless; 0 before any draft)."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    def prometheus(self, prefix: str) -> str:
        """Prometheus text: ``{prefix}spec_decode_num_drafts_total`` and the others (vLLM's names after
        its ``vllm:`` prefix), ``..._num_accepted_tokens_per_pos_total{position="i"}`` per draft position."""
        out = []
        for n in self.NAMES:
            name = f"{prefix}spec_decode_{n}_total"
            out.append(f"# TYPE {name} counter\n{name} {getattr(self, n)}\n")
        name = f"{prefix}spec_decode_num_accepted_tokens_per_pos_total"
        out.append(f"# TYPE {name} counter\n")
        out += [f'{name}{{position="{i}"}} {v}\n' for i, v in enumerate(self.accepted_per_pos)]
        return "".join(out)


class _Model:
    """A model with its own contiguous cache and the tokens not yet in it (``pending``)."""

    def __init__(self, model, max_len: int):
        self.model, self.cache, self.pending = model, KVCache(model, 1, max_len), []
        self.device = next(model.parameters()).device

    def forward(self, tokens: list[int]) -> torch.Tensor:
        x = torch.tensor([tokens], dtype=torch.long, device=self.device)
        return self.model(x, cache=self.cache)[0].float()  # [len(tokens), V]

    def rollback(self, n: int) -> None:
        if n:
            self.cache.lengths[0] -= n


@torch.no_grad()
def speculative_generate(
    target,
    prompt_ids,
    *,
    draft=None,
    k: int = 4,
    max_new_tokens: int = 32,
    temperature: float = 0.0,
    seed: int = 0,
    eos_id: int | None = None,
    allowed=None,
    top_k: int = -1,
    top_p: float = 1.0,
    stop=None,
    keep_logprobs: bool = False,
) -> tuple[list[int], SpecStats]:
    """Generate up to ``max_new_tokens`` tokens after ``prompt_ids`` with speculative decoding.

    ``draft``: a ``Transformer`` with the target's vocabulary, ``"ngram"`` (prompt lookup), or
    None (the target alone: one token per forward, the reference). ``k`` >= 1 tokens drafted per
    step. ``allowed``: optional callback ``allowed(tokens_so_far) -> bool mask [V] or None`` (a
    grammar, ``structured.py``) applied to every distribution of draft and target, so drafted tokens
    are checked against it. ``temperature``/``top_k``/``top_p`` shape both distributions as the
    engine's sampler does (``sampler.filter_probs``): the output follows the target's filtered
    distribution. ``stop``: optional callback ``stop(tokens_so_far) -> bool`` checked after every
    emitted token (stop strings, stop token ids). ``keep_logprobs``: keep the target's raw
    log-softmax row of every emitted token in ``SpecStats.logprobs`` (vLLM's raw logprobs).
    Returns ``(tokens, SpecStats)``."""
    check_int("k", k, 1)
    check_int("max_new_tokens", max_new_tokens, 1)
    check_number("temperature", temperature, 0)
    prompt = [int(t) for t in prompt_ids]
    if not prompt:
        raise ValueError("prompt_ids is empty: give at least one token")
    V = target.cfg.vocab_size
    if isinstance(draft, torch.nn.Module):
        if draft.cfg.vocab_size != V:
            raise ValueError(f"draft vocab_size={draft.cfg.vocab_size} differs from the target's {V}")
    else:
        check_choice("draft (or a Transformer)", draft, (None, "ngram"))
    kk = 0 if draft is None else k
    max_len = len(prompt) + max_new_tokens + kk + 1
    for m in (target, draft) if isinstance(draft, torch.nn.Module) else (target,):
        if max_len > m.cfg.seq_len:
            raise ValueError(
                f"prompt ({len(prompt)}) + max_new_tokens ({max_new_tokens}) + k + 1 = {max_len} "
                f"exceeds the context cfg.seq_len={m.cfg.seq_len}"
            )
    gen = torch.Generator().manual_seed(seed)
    tgt = _Model(target, max_len)
    drf = _Model(draft, max_len) if isinstance(draft, torch.nn.Module) else None
    tgt.pending = list(prompt)
    if drf:
        drf.pending = list(prompt)
    out: list[int] = []
    stats = SpecStats()
    clock = Laps()

    def dist(logits, prefix):
        if allowed is not None:
            m = allowed(prefix)
            if m is not None:  # the grammar: disallowed logits to -inf BEFORE the softmax
                logits = apply_mask(logits, m)
        if temperature == 0:
            return to_probs(logits, temperature)
        return filter_probs(logits.float(), temperature, top_k, top_p)

    while len(out) < max_new_tokens:
        context = prompt + out
        # 1. propose
        props, qs = [], []
        if drf is not None:
            feed = drf.pending
            for _ in range(k):
                logits = drf.forward(feed)[-1]
                stats.draft_forwards += 1
                q = dist(logits, out + props)
                d = int(sample_inverse_cdf(q, torch.rand((), generator=gen)))
                props.append(d)
                qs.append(q)
                feed = [d]
        elif draft == "ngram":
            props = ngram_propose(context, k)
            if allowed is not None:  # keep the grammar-valid prefix of the lookup
                ok = []
                for d in props:
                    m = allowed(out + ok)
                    if m is not None and not bool(m[d]):
                        break
                    ok.append(d)
                props = ok
            qs = [torch.nn.functional.one_hot(torch.tensor(d), V).float() for d in props]
        kd = len(props)
        # 2. verify: one target forward over pending + drafts
        logits = tgt.forward(tgt.pending + props)[len(tgt.pending) - 1 :]
        stats.target_forwards += 1
        p = torch.stack([dist(logits[i], out + props[:i]) for i in range(kd + 1)])
        q = torch.stack(qs) if kd else torch.zeros(0, V)
        u_acc = torch.rand(1, kd, generator=gen)
        u_s = torch.rand(1, generator=gen)
        n_acc, nxt = verify(p[None], q[None], torch.tensor([props], dtype=torch.long).view(1, kd), u_acc, u_s)
        n, t = int(n_acc[0]), int(nxt[0])
        stats.drafted += kd
        stats.tested += n + (1 if n < kd else 0)
        stats.accepted += n
        stats.accepted_per_step.append(n)
        new = props[:n] + [t]
        # 3. roll back the rejected drafts' cache entries
        tgt.rollback(kd - n)
        tgt.pending = [t]
        if drf is not None:
            if n < kd:
                drf.rollback(kd - 1 - n)
                drf.pending = [t]
            else:
                drf.pending = [props[-1], t]
        done = False
        for i, tok in enumerate(new):
            if len(out) >= max_new_tokens:
                break
            out.append(tok)
            stats.emitted += 1
            if keep_logprobs:
                stats.logprobs.append(torch.log_softmax(logits[i].float(), -1))
            if (eos_id is not None and tok == eos_id) or (stop is not None and stop(out)):
                done = True
                break
        if done:
            break
    stats.seconds = clock.elapsed()
    return out, stats


# ---- speculation inside continuous batching (LLMEngine) ------------------------------------------
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
        from .model_runner import ModelRunner
        from .paged import PagedKVCache

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
