"""Evaluating a language model: held-out loss, perplexity, bits per token, their bounds, and a split that leaks.

- ``perplexity(loss) = exp(loss)`` for a mean cross-entropy ``loss`` in nats/token: the number of equally
  likely tokens the model is as unsure as. ``bits_per_token(loss) = loss / ln 2``.
- On a language with a known entropy rate H (``MarkovLanguage``), every model's expected held-out loss is
  at least H (nats/token; the true model reaches it), and a model that learned anything beats the unigram
  model (the token frequencies alone, ``NGramModel(0)``; its loss is about the unigram entropy). A held-out
  loss **below** H is not a good model: it is a leak.
- The leak here: training rows are windows cut from long documents with a stride shorter than the window,
  so neighbouring windows share tokens. Splitting the *windows* at random (``split_windows``) puts windows
  of the same stretch of text on both sides; splitting the *documents* first (``split_documents``) does not.
  A model that memorised its training windows then scores a too-good number on the leaky held-out set.
- ``NGramModel(order)``: counts of each next token after each context of ``order`` tokens, add-``alpha``
  smoothed: order 0 is the unigram model; a high order memorises its training text.
"""

from __future__ import annotations

import math

import numpy as np

from ..config import check_int, check_number

__all__ = [
    "NGramModel",
    "bits_per_token",
    "model_loss",
    "perplexity",
    "split_documents",
    "split_windows",
    "windows",
]


def perplexity(loss: float) -> float:
    """exp(``loss``), ``loss`` a mean cross-entropy in nats/token."""
    return math.exp(loss)


def bits_per_token(loss: float) -> float:
    """``loss`` (nats/token) in bits/token: loss / ln 2."""
    return loss / math.log(2)


def model_loss(model, tokens, *, skip: int = 0) -> float:
    """Mean next-token cross-entropy (nats/token) of ``model`` (a ``Transformer``) on ``tokens`` [n, s + 1]
    (int64 array or tensor), over the targets at positions ``>= skip`` (``skip = order`` of a Markov language:
    the positions that see their full context, where the entropy rate is the floor)."""
    import torch
    import torch.nn.functional as F

    x = torch.as_tensor(np.asarray(tokens))
    was_training = model.training
    model.eval()
    with torch.no_grad():
        logits = model(x[:, :-1])
    model.train(was_training)
    start = max(skip - 1, 0)
    v = logits.shape[-1]
    return float(F.cross_entropy(logits[:, start:].reshape(-1, v), x[:, start + 1 :].reshape(-1)))


class NGramModel:
    """A count-based language model of the next token given the previous ``order`` tokens, add-``alpha``
    smoothed over ``vocab`` symbols. ``fit(tokens)`` counts; ``loss(tokens, skip)`` is the mean cross-entropy
    (nats/token) over targets at positions ``>= max(skip, order)``."""

    def __init__(self, order: int, vocab: int, alpha: float = 0.1):
        check_int("order", order, 0, 12)
        check_int("vocab", vocab, 2)
        check_number("alpha", alpha, 0, lo_open=True)
        self.order, self.vocab, self.alpha = order, vocab, alpha
        self.counts: dict[tuple, np.ndarray] = {}

    def fit(self, tokens) -> NGramModel:
        for row in np.asarray(tokens):
            row = [int(t) for t in row]
            for t in range(self.order, len(row)):
                ctx = tuple(row[t - self.order : t])
                self.counts.setdefault(ctx, np.zeros(self.vocab))[row[t]] += 1
        return self

    def loss(self, tokens, *, skip: int = 0) -> float:
        nll, n = 0.0, 0
        for row in np.asarray(tokens):
            row = [int(t) for t in row]
            for t in range(max(skip, self.order), len(row)):
                c = self.counts.get(tuple(row[t - self.order : t]))
                p = (
                    self.alpha / (self.vocab * self.alpha)
                    if c is None
                    else (c[row[t]] + self.alpha) / (c.sum() + self.vocab * self.alpha)
                )
                nll -= math.log(p)
                n += 1
        return nll / n


def windows(doc, length: int, stride: int) -> np.ndarray:
    """Windows [n, length] of one document (a 1-D token array), starting every ``stride`` tokens."""
    check_int("length", length, 2)
    check_int("stride", stride, 1)
    doc = np.asarray(doc)
    starts = range(0, len(doc) - length + 1, stride)
    return np.stack([doc[s : s + length] for s in starts])


def split_documents(docs, length: int, stride: int, held_fraction: float, *, seed: int):
    """Split the documents (a [n_docs, doc_len] array), then cut windows: ``(train, held)`` share no text."""
    check_number("held_fraction", held_fraction, 0, 1, lo_open=True, hi_open=True)
    order = np.random.default_rng(seed).permutation(len(docs))
    n_held = max(1, round(held_fraction * len(docs)))
    held, train = order[:n_held], order[n_held:]
    cut = lambda ids: np.concatenate([windows(docs[i], length, stride) for i in sorted(ids)])  # noqa: E731
    return cut(train), cut(held)


def split_windows(docs, length: int, stride: int, held_fraction: float, *, seed: int):
    """Cut every document into windows, then split the windows at random: with ``stride < length`` a held-out
    window overlaps the training windows beside it (the leak)."""
    check_number("held_fraction", held_fraction, 0, 1, lo_open=True, hi_open=True)
    every = np.concatenate([windows(d, length, stride) for d in docs])
    order = np.random.default_rng(seed).permutation(len(every))
    n_held = max(1, round(held_fraction * len(every)))
    return every[np.sort(order[n_held:])], every[np.sort(order[:n_held])]
