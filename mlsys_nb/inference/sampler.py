"""Sampling the next token of each sequence from its logits (one row per sequence).

Per row, with that sequence's ``SamplingParams``: temperature 0 -> argmax (greedy); otherwise
softmax(logits / temperature) restricted to the top-k tokens and then to the top-p nucleus (the
smallest set of most likely tokens whose probability reaches p; the most likely token always stays),
renormalised, and one draw from it with the sequence's own ``torch.Generator`` when the request has a
``seed`` (reproducible whatever else is batched with it), else with the engine's generator.

First the grammar mask of a structured request (``grammar_masks``, a logits processor: the tokens its
grammar forbids after the sequence's output so far get −inf; its logprobs and its greedy argmax come from
the masked logits). Then the request's logit processors (``process_logits``: min_tokens, logit_bias, repetition,
frequency and presence penalties; vLLM's order), and after the temperature ``min_p``; a greedy request
with processors takes the argmax of the processed logits. The most likely token always survives top-p
(even at ``top_p = 1e-320``, which float32 rounds to 0).

Each row is sampled on its own: with ``errors`` (a dict) a row that raises is recorded there
(row -> exception, its token ``None``) and the other rows are sampled as usual, so one request's
failure never costs the others theirs.

Log-probabilities are the model's: log_softmax of the raw logits (before temperature and
filtering), the convention of vLLM v1 (``raw_logprobs``); rank 1 is the most likely token.
"""

from __future__ import annotations

import torch

from .sequence import Logprob, Sequence


def filter_probs(
    logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0, min_p: float = 0.0
) -> torch.Tensor:
    """The sampling distribution of one row of logits [vocab] (probabilities summing to 1)."""
    logits = logits / temperature
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if min_p > 0:
        probs = probs.masked_fill(probs < min_p * probs.max(), 0.0)
        probs = probs / probs.sum()
    if top_p < 1.0:
        sorted_p, idx = probs.sort(descending=True)
        drop = sorted_p.cumsum(-1) - sorted_p >= top_p  # mass strictly before this token already >= p
        drop[0] = False  # the most likely token always stays (top_p may round to 0 in float32)
        probs = probs.scatter(-1, idx, sorted_p.masked_fill(drop, 0.0))
        probs = probs / probs.sum()
    return probs


def process_logits(logits: torch.Tensor, seq: Sequence, eos_token_ids=()) -> torch.Tensor:
    """One row of logits [vocab] after the request's logit processors (module docstring), a new tensor."""
    p, out = seq.params, seq.output_token_ids
    logits = logits.clone()
    vocab = logits.shape[-1]
    if p.min_tokens and len(out) < p.min_tokens:
        ends = [t for t in (*(() if p.ignore_eos else eos_token_ids), *p.stop_token_ids) if 0 <= t < vocab]
        logits[ends] = float("-inf")
    if p.logit_bias:
        ids = torch.tensor(list(p.logit_bias), dtype=torch.long)
        logits[ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype)
    if p.repetition_penalty != 1.0:
        seen = torch.tensor(sorted(set(seq.prompt_token_ids) | set(out)), dtype=torch.long)
        x = logits[seen]
        logits[seen] = torch.where(x > 0, x / p.repetition_penalty, x * p.repetition_penalty)
    if (p.frequency_penalty or p.presence_penalty) and out:
        counts = torch.bincount(torch.tensor(out, dtype=torch.long), minlength=vocab)[:vocab].to(logits.dtype)
        logits -= p.frequency_penalty * counts + p.presence_penalty * (counts > 0).to(logits.dtype)
    return logits


def sample(
    logits: torch.Tensor,
    seqs: list[Sequence],
    generator: torch.Generator | None = None,
    tokenizer=None,
    *,
    eos_token_ids=(),
    errors: dict | None = None,
) -> tuple[list[int | None], list[dict[int, Logprob] | None]]:
    """Next token of each row of ``logits`` [batch, vocab] (fp32), and its log-probability entries.

    ``errors``: if given, a row whose sampling raises is recorded as ``errors[row] = exception`` with
    token ``None``; otherwise the exception propagates."""
    tokens, entries = [], []
    logits = grammar_masks(logits, seqs, errors)
    need_lp = any(s.params.logprobs is not None for s in seqs)
    logp = torch.log_softmax(logits, dim=-1) if need_lp else None
    greedy = logits.argmax(dim=-1).tolist()
    for i, seq in enumerate(seqs):
        try:
            tok = sample_row(logits[i], seq, greedy[i], generator, eos_token_ids)
            entry = None if seq.params.logprobs is None else logprob_entry(logp[i], tok, seq.params.logprobs, tokenizer)
        except Exception as e:
            if errors is None:
                raise
            errors.setdefault(i, e)
            tok, entry = None, None
        tokens.append(tok)
        entries.append(entry)
    return tokens, entries


def grammar_masks(logits: torch.Tensor, seqs: list[Sequence], errors: dict | None = None) -> torch.Tensor:
    """The grammar logits processor: ``logits`` [batch, vocab] with each structured row masked (tokens its
    grammar forbids after the sequence's output so far set to −inf; ``seq.allowed``, structured.py); the same
    tensor when no row has a grammar. A row whose mask raises is recorded in ``errors`` (row -> exception)
    and left unmasked (its request fails; the other rows go on), or the exception propagates without it."""
    if all(getattr(s, "allowed", None) is None for s in seqs):
        return logits
    logits = logits.clone()
    for i, seq in enumerate(seqs):
        try:
            mask = None if seq.allowed is None else seq.allowed(seq.output_token_ids)
            if mask is not None:
                logits[i] = apply_mask(logits[i], mask)
        except Exception as e:
            if errors is None:
                raise
            errors[i] = e
    return logits


def sample_row(row: torch.Tensor, seq: Sequence, argmax: int, generator, eos_token_ids) -> int:
    """One sequence's next token from its logits ``row`` [V]: its logit processors, then ``argmax`` (the
    row's argmax, computed for the batch) when greedy, else a draw from ``filter_probs`` with the sequence's
    generator (else ``generator``)."""
    p = seq.params
    if p.processes_logits:
        row = process_logits(row, seq, eos_token_ids)
        argmax = int(row.argmax())
    if p.greedy:
        return argmax
    probs = filter_probs(row, p.temperature, p.top_k, p.top_p, p.min_p)
    if not bool(torch.isfinite(probs).all()) or not float(probs.sum()) > 0:
        raise ValueError(f"request {seq.request_id}: the sampling distribution is not finite (no token can be drawn)")
    return int(torch.multinomial(probs, 1, generator=seq.generator or generator))


def apply_mask(logits: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """logits with disallowed tokens (``mask`` False) set to −inf; raises if nothing is allowed."""
    if not bool(mask.any()):
        raise RuntimeError("the grammar mask allows no token (a bug: budgeted masks always allow one)")
    return logits.float().masked_fill(~mask.to(logits.device), float("-inf"))


def logprob_entry(row: torch.Tensor, tok: int, k: int, tokenizer) -> dict[int, Logprob]:
    """One position's logprobs: the sampled token ``tok`` and the ``k`` most likely ones, from the
    log-probability ``row`` (natural log), each with its rank (1 = most likely) and decoded text."""
    lp = float(row[tok])
    rank = int((row > row[tok]).sum()) + 1
    out = {tok: Logprob(lp, rank, _decode(tokenizer, tok))}
    if k:
        vals, idx = torch.topk(row, min(k, row.shape[-1]))
        for r, (v, t) in enumerate(zip(vals.tolist(), idx.tolist()), start=1):
            out.setdefault(t, Logprob(v, r, _decode(tokenizer, t)))
    return out


def _decode(tokenizer, tok: int) -> str | None:
    return None if tokenizer is None else tokenizer.decode([tok])
