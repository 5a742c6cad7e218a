"""Text in, text out: a request's life with the KV cache (prefill once, then one token per step).

``generate(model, tokenizer, prompts, max_new_tokens=32, temperature=0.0, seed=0)`` runs a batch of
prompts of different lengths: ONE prefill forward (ragged rows via ``cache.plan``), then decode
steps of one token for the sequences still running (finished ones leave the batch). Greedy when
``temperature == 0``. Stops a sequence at the tokenizer's EOS id or after ``max_new_tokens``.
Returns ``Generation`` records with the text, the token ids and timings (time to first token,
time per output token), the two latencies serving systems report.

A teaching loop: the serving engine (``LLM``) is the real one; greedy outputs of the two are equal
(``tests/test_engine.py``) and sampling draws from the engine sampler's distribution (``filter_probs``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import check_int, check_number
from ..runtime.timing import Timer
from .kv_cache import KVCache
from .sampler import filter_probs
from .tokenizer import decode_stream


@dataclass
class Generation:
    prompt: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"  # "stop" (EOS) or "length"
    ttft_s: float = 0.0  # time to first token: the prefill forward (measured)
    tpot_s: float = 0.0  # mean time per output token after the first (measured)


def _sample(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> torch.Tensor:
    """Greedy at temperature 0, else one draw per row from the engine sampler's distribution."""
    if temperature == 0:
        return logits.argmax(-1)
    probs = filter_probs(logits.float(), temperature)  # the engine's sampler: softmax(logits / T)
    return torch.multinomial(probs, 1, generator=gen).squeeze(-1)


@torch.no_grad()
def generate(
    model, tokenizer, prompts, max_new_tokens: int = 32, *, temperature: float = 0.0, seed: int = 0, cache=None
) -> list[Generation]:
    """Generate continuations of ``prompts`` (a str or a list of str) with the KV cache."""
    if isinstance(prompts, str):
        prompts = [prompts]
    check_int("max_new_tokens", max_new_tokens, 1)
    check_number("temperature", temperature, 0)
    ids = [list(tokenizer.encode(p)) for p in prompts]
    if any(len(x) == 0 for x in ids):
        raise ValueError("an empty prompt has no token to condition on: give at least one character")
    limit = model.cfg.seq_len
    for p, x in zip(prompts, ids):
        if len(x) + max_new_tokens > limit:
            raise ValueError(
                f"prompt of {len(x)} tokens + max_new_tokens={max_new_tokens} exceeds the "
                f"context cfg.seq_len={limit} ({p[:30]!r}...)"
            )
    b, device = len(ids), next(model.parameters()).device
    cache = cache or KVCache(model, b, max(len(x) for x in ids) + max_new_tokens)
    gen = torch.Generator().manual_seed(seed)
    eos = getattr(tokenizer, "eos_token_id", None)
    outs = [Generation(prompt=p, text="") for p in prompts]
    streams = [decode_stream(tokenizer) for _ in prompts]

    # prefill: one forward over all prompts, padded on the right, each row with its own length
    s = max(len(x) for x in ids)
    tokens = torch.zeros(b, s, dtype=torch.long, device=device)
    for i, x in enumerate(ids):
        tokens[i, : len(x)] = torch.tensor(x)
    n_new = [len(x) for x in ids]
    with Timer() as prefill:
        cache.plan(list(range(b)), n_new)
        logits = model(tokens, cache=cache)[torch.arange(b), torch.tensor(n_new) - 1]
        nxt = _sample(logits, temperature, gen)
    ttft = prefill.seconds
    active = list(range(b))
    steps = Timer()
    for step in range(max_new_tokens):
        still = []
        for r, i in enumerate(active):
            t = int(nxt[r])
            if step == 0:
                outs[i].ttft_s = ttft
            if eos is not None and t == eos:
                outs[i].finish_reason = "stop"
                continue
            outs[i].token_ids.append(t)
            outs[i].text += streams[i].step(t)
            if step + 1 < max_new_tokens:
                still.append((r, i))
        if not still:
            break
        active = [i for _, i in still]
        with steps:
            cache.plan(active, [1] * len(active))  # decode: one new token for each running sequence
            logits = model(nxt[[r for r, _ in still]].view(-1, 1), cache=cache)[:, -1]
            nxt = _sample(logits, temperature, gen)
    step_times = steps.samples
    for i, o in enumerate(outs):
        o.text += streams[i].flush()
        o.tpot_s = sum(step_times) / len(step_times) if step_times else 0.0
    return outs
