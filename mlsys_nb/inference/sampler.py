"""Sampling the next token of each sequence from its logits (one row per sequence).

Per row, with that sequence's ``SamplingParams``: temperature 0 -> argmax (greedy); otherwise
softmax(logits / temperature) restricted to the top-k tokens and then to the top-p nucleus (the
smallest set of most likely tokens whose probability reaches p; the most likely token always stays),
renormalised, and one draw from it with the sequence's own ``torch.Generator`` when the request has a
``seed`` (reproducible whatever else is batched with it), else with the engine's generator.

Log-probabilities are the model's: log_softmax of the raw logits (before temperature and
filtering), the convention of vLLM v1 (``raw_logprobs``); rank 1 is the most likely token.
"""

from __future__ import annotations

import torch

from .sequence import Logprob, Sequence


def filter_probs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """The sampling distribution of one row of logits [vocab] (probabilities summing to 1)."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass strictly before this token already >= p
        probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum()
    return probs


def sample(
    logits: torch.Tensor, seqs: list[Sequence], generator: torch.Generator | None = None, tokenizer=None
) -> tuple[list[int], list[dict[int, Logprob] | None]]:
    """Next token of each row of ``logits`` [batch, vocab] (fp32), and its log-probability entries."""
    tokens, entries = [], []
    need_lp = any(s.params.logprobs is not None for s in seqs)
    logp = torch.log_softmax(logits, dim=-1) if need_lp else None
    greedy = logits.argmax(dim=-1).tolist()
    for i, seq in enumerate(seqs):
        p = seq.params
        if p.greedy:
            tok = greedy[i]
        else:
            probs = filter_probs(logits[i], p.temperature, p.top_k, p.top_p)
            tok = int(torch.multinomial(probs, 1, generator=seq.generator or generator))
        tokens.append(tok)
        entries.append(None if p.logprobs is None else _logprobs(logp[i], tok, p.logprobs, tokenizer))
    return tokens, entries


def _logprobs(row: torch.Tensor, tok: int, k: int, tokenizer) -> dict[int, Logprob]:
    lp = float(row[tok])
    rank = int((row > row[tok]).sum()) + 1
    out = {tok: Logprob(lp, rank, _decode(tokenizer, tok))}
    if k:
        vals, idx = torch.topk(row, k)
        for r, (v, t) in enumerate(zip(vals.tolist(), idx.tolist()), start=1):
            out.setdefault(t, Logprob(v, r, _decode(tokenizer, t)))
    return out


def _decode(tokenizer, tok: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([tok])
