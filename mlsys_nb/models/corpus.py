"""A synthetic language with a known entropy rate, generated offline from a seed.

``MarkovLanguage(vocab=16, order=2, concentration=0.3, seed=0)`` is an order-k Markov chain over
``vocab`` symbols: each of the ``vocab**order`` contexts has its own next-token distribution drawn
from a symmetric Dirichlet(``concentration``) (small concentration = peaked, low-entropy rows).
Its entropy rate is exact, not estimated::

    H = sum_c pi(c) * H(P[c, :])   (nats/token)

with ``pi`` the stationary distribution over contexts (power iteration on the context chain).
Sequences start from a context drawn from ``pi``, so every window is stationary: the expected
cross-entropy of the *true* model on positions ``t >= order`` (full context visible) is exactly
``H``. No model can do better on those positions, which makes ``H`` the irreducible loss ``E``
a scaling-law fit should find.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


from ..config import check_int, check_number


@dataclass
class MarkovLanguage:
    vocab: int = 16
    order: int = 2
    concentration: float = 0.3
    seed: int = 0
    probs: np.ndarray = field(init=False, repr=False)  # [vocab**order, vocab]
    stationary: np.ndarray = field(init=False, repr=False)  # [vocab**order]

    def __post_init__(self):
        check_int("vocab", self.vocab, 2, 256)
        # the transition table has vocab**order rows: at most 65536
        check_int(
            f"order (vocab={self.vocab}: vocab**order <= 65536)",
            self.order,
            1,
            max(o for o in range(1, 5) if self.vocab**o <= 2**16),
        )
        check_number("concentration", self.concentration, 0, lo_open=True)
        rng = np.random.default_rng(self.seed)
        n_ctx = self.vocab**self.order
        p = rng.dirichlet(np.full(self.vocab, float(self.concentration)), size=n_ctx)
        p = np.clip(p, 1e-12, None)
        self.probs = p / p.sum(axis=1, keepdims=True)
        self.stationary = self._stationary()

    # context index of (x_{t-k}, ..., x_{t-1}) = sum x_{t-k+i} * vocab**(k-1-i)
    def _next_context(self, ctx, tok):
        return (ctx * self.vocab + tok) % (self.vocab**self.order)

    def _stationary(self, iters: int = 10_000, tol: float = 1e-13) -> np.ndarray:
        n_ctx = self.vocab**self.order
        pi = np.full(n_ctx, 1.0 / n_ctx)
        nxt = self._next_context(np.arange(n_ctx)[:, None], np.arange(self.vocab)[None, :])
        for _ in range(iters):
            new = np.bincount(nxt.ravel(), weights=(pi[:, None] * self.probs).ravel(), minlength=n_ctx)
            if np.abs(new - pi).sum() < tol:
                return new
            pi = new
        return pi

    @property
    def entropy_rate(self) -> float:
        """Exact entropy rate in nats/token (the irreducible loss)."""
        row_h = -(self.probs * np.log(self.probs)).sum(axis=1)
        return float((self.stationary * row_h).sum())

    @property
    def unigram_entropy(self) -> float:
        """Entropy of the stationary symbol distribution (what a context-free model achieves)."""
        sym = (self.stationary[:, None] * self.probs).sum(axis=0)
        return float(-(sym * np.log(sym)).sum())

    def sample(self, n_seqs: int, seq_len: int, *, seed: int) -> np.ndarray:
        """``n_seqs`` stationary sequences of ``seq_len`` tokens, int64 array [n_seqs, seq_len]."""
        rng = np.random.default_rng(seed)
        n_ctx = self.vocab**self.order
        ctx = rng.choice(n_ctx, size=n_seqs, p=self.stationary)
        out = np.empty((n_seqs, seq_len), dtype=np.int64)
        # the first `order` tokens are the context's digits
        digits = [(ctx // self.vocab ** (self.order - 1 - i)) % self.vocab for i in range(self.order)]
        cdf = np.cumsum(self.probs, axis=1)
        for t in range(seq_len):
            if t < self.order:
                out[:, t] = digits[t]
                continue
            u = rng.random(n_seqs)[:, None]
            tok = np.minimum((u > cdf[ctx]).sum(axis=1), self.vocab - 1)
            out[:, t] = tok
            ctx = self._next_context(ctx, tok)
        return out

    def true_loss(self, tokens: np.ndarray) -> float:
        """Mean ``-log P_true(x_t | context)`` over positions ``t >= order`` of ``tokens``."""
        k = self.order
        ctx = np.zeros(tokens.shape[0], dtype=np.int64)
        for i in range(k):
            ctx = ctx * self.vocab + tokens[:, i]
        nll = []
        for t in range(k, tokens.shape[1]):
            nll.append(-np.log(self.probs[ctx, tokens[:, t]]))
            ctx = self._next_context(ctx, tokens[:, t])
        return float(np.mean(nll))
