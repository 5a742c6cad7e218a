"""Second routes of the topic ``training``: perplexity and bits from the definitions, the LSH probability summed
over the binomial count of agreeing bands, its threshold found by bisection, the SFT record's tokens counted from
the template by hand, greedy packing walked over the lengths, and the distillation loss from a softmax written in
plain Python; never ``mlsys_nb.training``."""

from __future__ import annotations

import math

from .registry import register_route

MARKERS_PER_MESSAGE = 2  # <|role|> and <|end|>, one token each


@register_route("training.perplexity")
def _(p):
    return math.e ** p["loss"]


@register_route("training.bits_per_token")
def _(p):
    return math.log2(p["ppl"])  # a bit is ln 2 nats: log2(perplexity) bits per token


@register_route("training.lsh_probability")
def _(p):
    """P[at least one of b bands agrees]: the binomial sum over k = 1..b agreeing bands."""
    q, b = p["j"] ** p["rows"], p["bands"]
    return sum(math.comb(b, k) * q**k * (1 - q) ** (b - k) for k in range(1, b + 1))


@register_route("training.lsh_threshold")
def _(p):
    """Bisection on the similarity where b bands of r rows expect one agreeing band: b·J^r = 1."""
    lo, hi = 0.0, 1.0
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if p["bands"] * mid ** p["rows"] < 1 else (lo, mid)
    return (lo + hi) / 2


@register_route("training.response_share")
def _(p):
    """The template's tokens counted by hand: each message's bytes plus its two markers."""
    messages = [n for n in (p["system"], p["prompt"], p["reply"]) if n]
    total = sum(messages) + MARKERS_PER_MESSAGE * len(messages)
    return (p["reply"] + 1) / total  # the reply and its closing <|end|>


@register_route("training.packing_fill")
def _(p):
    """Greedy packing walked over the lengths alone."""
    rows, used = 1, 0
    for n in p["lengths"]:
        if used + n > p["seq_len"]:
            rows, used = rows + 1, 0
        used += n
    return sum(p["lengths"]) / (rows * p["seq_len"])


@register_route("training.distill_loss")
def _(p):
    """Softmax and KL written out: T² · Σ p_t (ln p_t − ln p_s) at temperature T."""
    T = p["T"]

    def log_softmax(logits):
        z = [x / T for x in logits]
        top = max(z)
        log_norm = top + math.log(sum(math.exp(x - top) for x in z))
        return [x - log_norm for x in z]

    lt, ls = log_softmax(p["teacher"]), log_softmax(p["student"])
    return T**2 * sum(math.exp(a) * (a - b) for a, b in zip(lt, ls))
