"""``SamplingParams``: how one request is decoded (vLLM's names and defaults, so habits carry over).

- ``temperature`` 0 is greedy (argmax); otherwise logits are divided by it before softmax.
- ``top_k`` keeps the k most likely tokens (-1: all); ``top_p`` keeps the smallest set whose
  probability reaches p (nucleus sampling, Holtzman et al., 2019, arXiv:1904.09751).
- ``max_tokens`` new tokens at most (finish reason "length"); generation also stops ("stop") at the
  model's end-of-sequence id unless ``ignore_eos``, at any id in ``stop_token_ids``, or when the
  text contains one of the ``stop`` strings (the text is cut before it, as vLLM does).
- Logit processors (vLLM's, applied in this order to the raw logits before temperature): ``min_tokens``
  (end-of-sequence and ``stop_token_ids`` masked until that many tokens were generated), ``logit_bias``
  ({token id: bias in [-100, 100]} added to the logits), ``repetition_penalty`` (> 0; a logit of a token
  already in the prompt or the output is divided by it if positive, multiplied if negative: Keskar et al.,
  2019, arXiv:1909.05858), ``frequency_penalty`` and ``presence_penalty`` (in [-2, 2]; subtract
  penalty x count and penalty x [count > 0] for tokens of the output, OpenAI's definition). After the
  temperature: ``min_p`` (in [0, 1]; drop tokens whose probability is below min_p x the largest).
- ``temperature`` in (0, 0.01) is raised to 0.01 (vLLM's rule: logits / 1e-45 overflow to inf).
- ``logprobs``: ``None`` returns none; ``0`` the sampled token's log-probability at each step; ``k``
  also the k most likely tokens. Log-probabilities are the model's (log-softmax of the raw logits,
  before temperature, top-k and top-p: vLLM v1's default ``raw_logprobs``).
- ``seed`` (an int64, as vLLM's API): sample i of the request draws from its own generator seeded with
  ``(seed + i) mod 2**64`` (a valid torch seed for every i), so the request's samples do not depend on
  what else is in the batch; ``n`` completions per prompt (they share the prompt's KV blocks).
- Structured outputs (``structured.py``): ``json_schema`` (a dict or JSON string), ``regex`` or
  ``choice`` (a list of strings), at most one: every token is masked so the text matches, compact
  JSON, within ``max_tokens`` (a budget below the shortest match is rejected when the request is
  added). A deliberate simplification of vLLM's structured-output parameters
  (``StructuredOutputsParams(json=..., regex=..., choice=..., grammar=...)``): no CFG, no backend choice.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MIN_TEMPERATURE = 1e-2  # vLLM's _MAX_TEMP: a smaller positive temperature is raised to it
SEED_RANGE = (-(2**63), 2**63 - 1)  # int64, vLLM's API range


class ParamError(ValueError):
    """A request parameter out of range; ``param`` names it (the server's error ``param``)."""

    def __init__(self, param: str | None, message: str):
        super().__init__(message)
        self.param = param


def _real(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _integer(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int | None = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    seed: int | None = None
    n: int = 1
    json_schema: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    min_tokens: int = 0

    def __post_init__(self):
        def bad(name, allowed):
            raise ParamError(name, f"{name}={getattr(self, name)!r}: {allowed}")

        if not _real(self.temperature) or self.temperature < 0:
            bad("temperature", "must be a finite number >= 0 (0 = greedy)")
        if 0 < self.temperature < MIN_TEMPERATURE:
            self.temperature = MIN_TEMPERATURE
        if not _real(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "must be a number in (0, 1]")
        if not _integer(self.top_k) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (all tokens) or an integer >= 1")
        if self.max_tokens is not None and (not _integer(self.max_tokens) or self.max_tokens < 1):
            bad("max_tokens", "must be an integer >= 1 (None: the rest of the context)")
        if self.logprobs is not None and (not _integer(self.logprobs) or self.logprobs < 0):
            bad("logprobs", "must be None or an integer >= 0")
        if not _integer(self.n) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if self.seed is not None and (not _integer(self.seed) or not SEED_RANGE[0] <= self.seed <= SEED_RANGE[1]):
            bad("seed", f"must be None or an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}] (int64)")
        if not isinstance(self.ignore_eos, bool):
            bad("ignore_eos", "must be a bool")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not isinstance(self.stop, (list, tuple, type(None))) or not all(isinstance(s, str) for s in self.stop or []):
            bad("stop", "must be a string or a list of strings")
        self.stop = [s for s in (self.stop or []) if s]
        if not isinstance(self.stop_token_ids, (list, tuple, type(None))) or not all(
            _integer(t) and t >= 0 for t in self.stop_token_ids or []
        ):
            bad("stop_token_ids", "must be a list of integer token ids >= 0")
        self.stop_token_ids = list(self.stop_token_ids or [])
        if not _real(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "must be a number in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            if not _real(getattr(self, name)) or not -2 <= getattr(self, name) <= 2:
                bad(name, "must be a number in [-2, 2]")
        if not _real(self.repetition_penalty) or not 0 < self.repetition_penalty <= 100:
            bad("repetition_penalty", "must be a number in (0, 100] (1 = none)")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                bad("logit_bias", "must be a dict {token id: bias in [-100, 100]}")
            bias = {}
            for k, v in self.logit_bias.items():
                try:
                    t = int(k) if not isinstance(k, (bool, float)) else None
                except ValueError:
                    t = None
                if t is None or t < 0 or not _real(v) or not -100 <= v <= 100:
                    bad("logit_bias", f"entry {k!r}: {v!r}: keys are token ids >= 0, values numbers in [-100, 100]")
                bias[t] = float(v)
            self.logit_bias = bias or None
        if not _integer(self.min_tokens) or self.min_tokens < 0:
            bad("min_tokens", "must be an integer >= 0")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"must be <= max_tokens={self.max_tokens}")
        given = [n for n in ("json_schema", "regex", "choice") if getattr(self, n) is not None]
        if len(given) > 1:
            bad(given[1], f"give at most one of json_schema, regex, choice (got {given})")
        if self.regex is not None and (not isinstance(self.regex, str) or not self.regex):
            bad("regex", "must be a non-empty string")
        if self.choice is not None and (
            isinstance(self.choice, str)
            or not isinstance(self.choice, (list, tuple))
            or not self.choice
            or not all(isinstance(c, str) and c for c in self.choice)
        ):
            bad("choice", "must be a non-empty list of non-empty strings")
        if self.json_schema is not None and not isinstance(self.json_schema, (dict, str)):
            bad("json_schema", "must be a dict or a JSON string")
        if self.structured and self.min_tokens:
            bad("min_tokens", "cannot be combined with json_schema/regex/choice (the grammar decides when to end)")

    @property
    def structured(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.choice is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def processes_logits(self) -> bool:
        """Whether a logit processor (min_tokens, logit_bias, penalties) changes this request's logits."""
        return bool(
            self.min_tokens
            or self.logit_bias
            or self.presence_penalty
            or self.frequency_penalty
            or self.repetition_penalty != 1.0
        )

    def finish(
        self, tok: int, n_generated: int, text: str, *, eos_token_ids, at_context_end: bool = False
    ) -> tuple[str, int | str | None, int | None] | None:
        """The stop rules, the one implementation the engine and the speculative path share.

        Called after token ``tok`` became the ``n_generated``-th output token and ``text`` is the
        output's incremental text so far. Returns None (go on) or ``(finish_reason, stop_reason, cut)``:
        ``("stop", None, None)`` at an end-of-sequence id (unless ``ignore_eos``), ``("stop", tok, None)``
        at a ``stop_token_ids`` id, ``("stop", s, i)`` when stop string ``s`` appears in the text (after
        ``min_tokens``; the text is cut at ``i``, its first occurrence, the earliest of several), and
        ``("length", None, None)`` at ``max_tokens`` or at the end of the context (``at_context_end``).
        """
        if tok in eos_token_ids and not self.ignore_eos:
            return "stop", None, None
        if tok in self.stop_token_ids:
            return "stop", tok, None
        if self.stop and n_generated > self.min_tokens:
            found = [(text.find(s), s) for s in self.stop if s in text]
            if found:
                cut, s = min(found)
                return "stop", s, cut
        if (self.max_tokens is not None and n_generated >= self.max_tokens) or at_context_end:
            return "length", None, None
        return None

    def sample_seed(self, i: int) -> int | None:
        """The seed of sample ``i``'s generator: ``(seed + i) mod 2**64`` (a valid torch seed for every i)."""
        return None if self.seed is None else (self.seed + i) % 2**64
