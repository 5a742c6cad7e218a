"""A request before it is queued: ``InputProcessor.prepare`` validates it fully and does its long work
(tokenising, compiling a grammar) without touching the engine's state, so the server runs it on another
thread while ``LLMEngine.step()`` runs (vLLM v1's ``Processor``). The result is a ``Prepared``, which
``LLMEngine.add_request(..., prepared=...)`` queues all at once.

Every refusal is a ``ParamError`` (a ``ValueError``) or a ``structured.GrammarError`` naming the request
parameter and its allowed range: an empty or too long prompt, token ids outside the vocabulary, ``max_tokens``
beyond the context (``strict_context``, the server's rule), ``logprobs`` above the vocabulary size, a grammar
whose shortest match cannot end within the tokens the request can still produce.
"""

from __future__ import annotations

import dataclasses
import threading

import torch

from .sampling_params import ParamError, SamplingParams

__all__ = ["InputProcessor", "Prepared"]

_GRAMMAR_LOCK = threading.Lock()


@dataclasses.dataclass
class Prepared:
    """A validated request ready to queue (``LLMEngine.prepare``): prompt text (or None), its token ids,
    the final ``SamplingParams`` (``max_tokens`` resolved), the compiled grammar or None, one torch
    generator (or None) per sample, and ``budget``: the tokens it can really still produce,
    min(max_tokens, context − prompt), the budget its grammar mask plans for."""

    prompt: str | None
    ids: list[int]
    params: SamplingParams
    grammar: object
    generators: list
    budget: int


class InputProcessor:
    """Validates and prepares requests for one engine: its ``tokenizer`` (or None: token ids only), the
    model's ``vocab_size``, the context ``max_model_len`` (tokens), its ``eos_token_ids`` and the largest
    grammar it compiles (``max_grammar_states``)."""

    def __init__(self, tokenizer, vocab_size: int, max_model_len: int, eos_token_ids, max_grammar_states: int):
        self.tokenizer, self.vocab_size, self.max_model_len = tokenizer, vocab_size, max_model_len
        self.eos_token_ids, self.max_grammar_states = eos_token_ids, max_grammar_states

    def prepare(self, prompt, params: SamplingParams | None = None, *, strict_context: bool = False) -> Prepared:
        """Validate a request fully and do its long work (tokenising, compiling its grammar) WITHOUT touching
        the engine's state: safe to call from another thread while ``step()`` runs (the server does).

        ``params.max_tokens=None`` becomes the rest of the context. ``strict_context``: a ``max_tokens``
        beyond the context is an error (the server's rule, as vLLM's), else generation stops at the end of
        the context (finish reason "length"). Raises ``ParamError`` (a ValueError) naming the parameter."""
        params = params or SamplingParams()
        if not isinstance(params, SamplingParams):
            raise ParamError("params", f"params must be a SamplingParams, got {type(params).__name__}")
        ids = self.encode(prompt)
        vocab = self.vocab_size
        if not ids:
            raise ParamError("prompt", "prompt is empty: a request needs at least one token")
        if any(not 0 <= t < vocab for t in ids):
            raise ParamError("prompt", f"prompt token ids must be in [0, {vocab}) (the model's vocab_size)")
        if len(ids) >= self.max_model_len:
            raise ParamError(
                "prompt",
                f"prompt of {len(ids)} tokens is too long: the context is max_model_len="
                f"{self.max_model_len} tokens, including at least one generated token",
            )
        rest = self.max_model_len - len(ids)
        if params.max_tokens is None:
            params = dataclasses.replace(params, max_tokens=rest)
        elif strict_context and params.max_tokens > rest:
            raise ParamError(
                "max_tokens",
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{len(ids) + params.max_tokens} tokens ({len(ids)} in the prompt, {params.max_tokens} in the "
                f"completion): max_tokens must be <= {rest}",
            )
        if params.logprobs is not None and params.logprobs > vocab:
            raise ParamError("logprobs", f"logprobs={params.logprobs}: must be <= the vocabulary size {vocab}")
        for name, toks in (("stop_token_ids", params.stop_token_ids), ("logit_bias", params.logit_bias or {})):
            if any(not 0 <= t < vocab for t in toks):
                raise ParamError(name, f"{name}: token ids must be in [0, {vocab}) (the model's vocab_size)")
        gens = []
        for i in range(params.n):  # every sample's generator before anything is queued (add_request is atomic)
            seed = params.sample_seed(i)
            gens.append(None if seed is None else torch.Generator(device="cpu").manual_seed(seed))
        budget = min(params.max_tokens, rest)  # generation stops at whichever comes first
        grammar = self._grammar(params, ids, budget) if params.structured else None
        return Prepared(prompt if isinstance(prompt, str) else None, ids, params, grammar, gens, budget)

    def _grammar(self, params: SamplingParams, ids: list[int], budget: int):
        """Compile a request's json_schema/regex/choice into a budget-aware token mask (structured.py);
        ``budget``: the tokens the request can produce, so a match that cannot end within it is refused."""
        from .structured import Grammar, GrammarError

        vocab = self.vocab_size
        eos = min(self.eos_token_ids, default=None)
        if self.tokenizer is None or eos is None or not 0 <= eos < vocab:
            raise GrammarError(
                f"structured outputs need a tokenizer with an end-of-sequence id below vocab_size={vocab} "
                f"(got tokenizer {type(self.tokenizer).__name__}, eos {eos}); pass LLM(model, tokenizer=...)"
            )
        tb, strips = self._token_bytes()
        given = next(n for n in ("json_schema", "regex", "choice") if getattr(params, n) is not None)
        with _GRAMMAR_LOCK:  # one compilation at a time: bounded memory however many requests bring one
            try:
                g = Grammar.compile(
                    json_schema=params.json_schema,
                    regex=params.regex,
                    choice=params.choice,
                    vocab_size=vocab,
                    eos_id=eos,
                    token_bytes=tb,
                    no_leading_space=strips,
                    max_states=self.max_grammar_states,
                )
            except GrammarError as e:
                e.param = e.param or given  # the request parameter that brought the grammar
                raise
        if params.max_tokens < max(1, g.min_tokens):
            raise GrammarError(
                f"max_tokens={params.max_tokens} is out of range: the shortest match takes {g.min_tokens} tokens",
                param="max_tokens",
            )
        if budget < g.min_tokens:  # the context, not max_tokens, is the binding limit
            raise GrammarError(
                f"prompt of {len(ids)} tokens + the shortest match ({g.min_tokens}) exceeds "
                f"max_model_len={self.max_model_len}",
                param="prompt",
            )
        return g

    def _token_bytes(self):
        """Each token's bytes for grammar masks (``tokenizer.token_bytes``, cached per tokenizer)."""
        from .structured import GrammarError
        from .tokenizer import TokenBytesError, token_bytes

        try:
            return token_bytes(self.tokenizer, self.vocab_size)
        except TokenBytesError as e:
            raise GrammarError(str(e)) from None

    def encode(self, prompt) -> list[int]:
        if isinstance(prompt, str):
            if self.tokenizer is None:
                raise ValueError("a text prompt needs a tokenizer: pass tokenizer=... or a list of token ids")
            return list(self.tokenizer.encode(prompt))
        if not isinstance(prompt, (list, tuple)) or not all(isinstance(t, int) for t in prompt):
            raise ValueError(f"prompt must be a string or a list of int token ids, got {type(prompt).__name__}")
        return list(prompt)

    def decode(self, ids) -> str:
        try:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        except TypeError:
            return self.tokenizer.decode(ids)
