"""``SamplingParams``: how one request is decoded (vLLM's names and defaults, so habits carry over).

- ``temperature`` 0 is greedy (argmax); otherwise logits are divided by it before softmax.
- ``top_k`` keeps the k most likely tokens (-1: all); ``top_p`` keeps the smallest set whose
  probability reaches p (nucleus sampling, Holtzman et al., 2019, arXiv:1904.09751).
- ``max_tokens`` new tokens at most (finish reason "length"); generation also stops ("stop") at the
  model's end-of-sequence id unless ``ignore_eos``, at any id in ``stop_token_ids``, or when the
  text contains one of the ``stop`` strings (the text is cut before it, as vLLM does).
- ``logprobs``: ``None`` returns none; ``0`` the sampled token's log-probability at each step; ``k``
  also the k most likely tokens. Log-probabilities are the model's (log-softmax of the raw logits,
  before temperature, top-k and top-p: vLLM v1's default ``raw_logprobs``).
- ``seed``: a per-request random generator, so the request's samples do not depend on what else is
  in the batch; ``n`` completions per prompt (they share the prompt's KV blocks).
- Structured outputs (``structured.py``): ``json_schema`` (a dict or JSON string), ``regex`` or
  ``choice`` (a list of strings), at most one: every token is masked so the text matches, compact
  JSON, within ``max_tokens`` (a budget below the shortest match is rejected when the request is
  added). A deliberate simplification of vLLM's structured-output parameters
  (``StructuredOutputsParams(json=..., regex=..., choice=..., grammar=...)``): no CFG, no backend choice.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    logprobs: int | None = None
    seed: int | None = None
    n: int = 1
    json_schema: dict | str | None = None
    regex: str | None = None
    choice: list[str] | None = None

    def __post_init__(self):
        def bad(name, allowed):
            raise ValueError(f"{name}={getattr(self, name)!r}: {allowed}")

        if not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            bad("temperature", "must be a number >= 0 (0 = greedy)")
        if not isinstance(self.top_p, (int, float)) or not 0 < self.top_p <= 1:
            bad("top_p", "must be in (0, 1]")
        if not isinstance(self.top_k, int) or (self.top_k < 1 and self.top_k != -1):
            bad("top_k", "must be -1 (all tokens) or an integer >= 1")
        if not isinstance(self.max_tokens, int) or self.max_tokens < 1:
            bad("max_tokens", "must be an integer >= 1")
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or self.logprobs < 0):
            bad("logprobs", "must be None or an integer >= 0")
        if self.seed is not None and not isinstance(self.seed, int):
            bad("seed", "must be None or an integer")
        if not isinstance(self.n, int) or self.n < 1:
            bad("n", "must be an integer >= 1")
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        self.stop = [s for s in (self.stop or []) if s]
        if not all(isinstance(s, str) for s in self.stop):
            bad("stop", "must be a string or a list of strings")
        self.stop_token_ids = [int(t) for t in (self.stop_token_ids or [])]
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

    @property
    def structured(self) -> bool:
        return self.json_schema is not None or self.regex is not None or self.choice is not None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0
