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

This file holds the rule and the reference loop. The closed forms are ``spec_math.py`` (no torch; re-exported
here); speculation inside the engine's continuous batch (``BatchSpeculator``, ``VerifyView``, ``Draft``) is
``spec_batch.py``, which builds on this one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import check_choice, check_int, check_number
from ..runtime.timing import Laps
from .kv_cache import KVCache
from .sampler import apply_mask, filter_probs
from .spec_math import best_k, expected_speedup, expected_tokens_per_step


__all__ = [
    "CachedModel",
    "SpecDecodingCounters",
    "SpecStats",
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


class CachedModel:
    """The reference loop's view of a model: its own contiguous ``KVCache`` (batch 1), the tokens not yet in
    it (``pending``), ``forward(tokens)`` -> fp32 logits [len(tokens), V] and ``rollback(n)``, which drops the
    last ``n`` cached positions (rejected drafts; later writes overwrite them)."""

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
    tgt = CachedModel(target, max_len)
    drf = CachedModel(draft, max_len) if isinstance(draft, torch.nn.Module) else None
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
