"""Structured outputs: a grammar turned into a token mask, applied to the logits before sampling.

``Grammar.compile(json_schema=... | regex=... | choice=[...], vocab_size=257, eos_id=256)`` builds a
deterministic automaton over TOKENS with outlines-core (a JSON schema becomes a regex first, with
``whitespace_pattern=""`` so JSON is compact: no free whitespace). The parameters are a deliberate
simplification of vLLM's structured-output options (``guided_json``/``guided_regex``/
``guided_choice``, now ``StructuredOutputsParams``): one constraint per request, no grammar (CFG)
option, no backend choice.

Why outlines-core (0.2.14) rather than llguidance or xgrammar: it exposes the token automaton
(``Index.get_transitions()``), and the budget-aware mask below needs, for every state, the shortest
number of tokens to a match: a breadth-first search over that automaton. llguidance (Earley parser,
CFGs and JSON schema, fast lazy masks) hides its states behind a matcher, so the shortest completion
cannot be read off; xgrammar pulls triton (~1 GB). Neither outlines-core nor llguidance has runtime
dependencies; outlines-core handles regular languages only (JSON schema with bounded recursion),
which covers ``json_schema``/``regex``/``choice``.

Tokens are byte strings: ``token_bytes={id: bytes}`` (default the byte tokenizer's ids 0-255). A
``transformers`` tokenizer of a converted model works too: ``tokenizer.token_bytes`` derives each
token's exact bytes from its decoder (byte-level BPE: invert GPT-2's ``bytes_to_unicode``;
SentencePiece: '▁' is a space and ``<0xNN>`` is one byte), leaves out special/added tokens, and checks
every token against the tokenizer's own ``decode``. outlines-core's ``Vocabulary`` takes those bytes
as keys, multi-byte and partial UTF-8 tokens included, and its automaton steps over whole tokens, so
the shortest completion below counts tokens, not bytes. A tokenizer whose decode drops the first
space (SentencePiece's ``Strip``) gets ``no_leading_space=True``: a separate start state without
space-initial tokens, so the decoded text is exactly the concatenated bytes.

JSON-schema keywords the regex does not enforce (outlines-core ignores ``minimum``, ``maximum``,
``multipleOf``, ``uniqueItems``...; ``oneOf``/``allOf`` are not exact) are refused with a ``GrammarError``
naming the keyword (``enforceable_schema``; ``SCHEMA_KEYWORDS`` lists the enforced ones); formats become
exact ASCII patterns (``FORMAT_PATTERNS``: date, time, date-time, uuid), and ``\\d``/``\\w`` mean ASCII
as in JSON Schema (``ascii_classes``). ``schema_errors`` validates a finished answer (the server's
post-check). These front ends live in ``json_schema.py`` (torch-free), re-exported here. ``max_states``
bounds the automaton (``GrammarError`` naming ``max_grammar_states``), first by a count made before compiling
(``regex_states.dfa_states``), then exactly.

The mask (written here, not by the library):

- ``allowed_mask(state, remaining)``: token t is allowed iff the automaton has a transition on t
  AND the shortest completion from the next state fits in ``remaining - 1`` tokens; EOS is allowed in
  a matching state. So when ``remaining`` equals the shortest completion only tokens on a shortest
  path survive, and the output always matches within ``max_tokens`` (``Grammar.min_tokens`` is the
  shortest match; a smaller ``max_tokens`` is rejected before generation). Masks are cached per
  (state, budget-if-binding).
- ``apply_mask(logits, mask)``: masked logits set to −inf BEFORE the softmax (multiplying
  probabilities by the mask after softmax underflows to 0/0 = NaN when the allowed tokens have tiny
  probability); with one allowed token the softmax is exactly one-hot, never NaN.

``generate_structured(model, prompt_ids, grammar, max_tokens, temperature, seed, draft=None, k=4)``
decodes with ``speculative.speculative_generate`` (the same loop; ``draft=None`` is plain decoding,
a draft or ``"ngram"`` gives structured + speculative decoding: drafted tokens are masked too).

Known limitation (outlines-core 0.2.14): from a state where the match could end, the index keeps no edge into
a state where it could not, so the longer branch of ``x(yz)?`` or of the choices ``["b", "bba"]`` is never
generated. Outputs still always match; they only miss such continuations
(``tests/test_structured.py`` pins it with a strict xfail).
"""

from __future__ import annotations

from collections import deque

import torch

from ..runtime.timing import Timer
from .json_schema import (
    FORMAT_PATTERNS,
    SCHEMA_KEYWORDS,
    GrammarError,
    ascii_classes,
    choice_regex,
    enforceable_schema,
    schema_errors,
    schema_regex,
)
from .regex_states import dfa_states
from .sampler import apply_mask  # the mask is applied where logits are processed; re-exported here

__all__ = [  # the grammar and decoding here; the front ends (json_schema.py) and the state count re-exported
    "FORMAT_PATTERNS",
    "Grammar",
    "GrammarError",
    "SCHEMA_KEYWORDS",
    "apply_mask",
    "ascii_classes",
    "choice_regex",
    "dfa_states",
    "enforceable_schema",
    "generate_structured",
    "schema_errors",
    "schema_regex",
]

_START = -1  # the start state when the output must not begin with a space (no outlines-core state is < 0)


class Grammar:
    """A compiled constraint over a vocabulary of ``vocab_size`` tokens (``token_bytes`` and EOS).

    ``initial_state``; ``advance(state, token) -> state``; ``is_final(state)``;
    ``distance[state]``: fewest tokens (without EOS) to reach a match; ``min_tokens``: that from the
    start; ``allowed_mask(state, remaining) -> bool [vocab_size]``. ``mask_seconds``/``mask_calls``:
    measured time spent computing masks (cache hits included)."""

    def __init__(
        self,
        regex: str,
        *,
        vocab_size: int = 257,
        eos_id: int = 256,
        token_bytes=None,
        no_leading_space: bool = False,
        max_states: int | None = None,
    ):
        from outlines_core import Index, Vocabulary

        if eos_id is None or not 0 <= eos_id < vocab_size:
            raise GrammarError(f"eos_id={eos_id!r}: a constrained vocabulary needs an end token in [0, {vocab_size})")
        if max_states is not None and (n := dfa_states(regex, max_states)) is not None and n > max_states:
            raise GrammarError(  # counted before compiling: quick, and the compilation may take minutes
                f"the grammar has more than {max_states} automaton states (counted before compiling), above the "
                f"limit max_grammar_states={max_states}"
            )
        token_bytes = token_bytes or {i: bytes([i]) for i in range(256)}
        vocab = {}
        for tid, b in token_bytes.items():
            if tid != eos_id and b and 0 <= tid < vocab_size:
                vocab.setdefault(bytes(b), []).append(tid)  # outlines-core takes each token's bytes as the key
        try:
            self.index = Index(regex, Vocabulary(eos_id, vocab))
        except Exception as e:  # outlines-core raises ValueError on a regex it cannot build
            raise GrammarError(f"regex={regex!r} is invalid or unsupported: {e}") from None
        self.regex, self.vocab_size, self.eos_id = regex, vocab_size, eos_id
        self.token_bytes = token_bytes
        self.initial_state = self.index.get_initial_state()
        raw = self.index.get_transitions()
        if max_states is not None and len(raw) > max_states:  # before the Python-side tables (the costly part)
            raise GrammarError(
                f"the grammar has {len(raw)} automaton states, above the limit max_grammar_states={max_states}"
            )
        self.transitions = {s: {t: n for t, n in tr.items() if t != eos_id and t < vocab_size} for s, tr in raw.items()}
        self._start = None
        if no_leading_space:  # a decoder that strips the text's first space: the output must not start with one
            self._start = self.initial_state
            self.initial_state = _START  # a separate start state: the automaton may revisit its initial one
            self.transitions[_START] = {
                t: n for t, n in self.transitions.get(self._start, {}).items() if not token_bytes[t].startswith(b" ")
            }
        self.distance = self._distances()
        self.min_tokens = self.distance.get(self.initial_state)
        if self.min_tokens is None:
            raise GrammarError(f"regex={regex!r} admits no output over this vocabulary")
        # per state: allowed tokens, their next states' distances (tensors), and the largest distance
        self._edges = {}
        for s, tr in self.transitions.items():
            toks = [t for t, n in tr.items() if n in self.distance]
            self._edges[s] = (
                torch.tensor(toks, dtype=torch.long),
                torch.tensor([self.distance[tr[t]] for t in toks], dtype=torch.long),
            )
        self._cache: dict = {}
        self.mask_seconds, self.mask_calls = 0.0, 0

    def _distances(self) -> dict:
        """Breadth-first search from the matching states over reversed transitions."""
        rev: dict = {}
        states = set(self.transitions) | {n for tr in self.transitions.values() for n in tr.values()}
        for s, tr in self.transitions.items():
            for n in tr.values():
                rev.setdefault(n, set()).add(s)
        dist = {s: 0 for s in states | set(self.index.get_final_states()) if self.is_final(s)}
        queue = deque(dist)
        while queue:
            n = queue.popleft()
            for s in rev.get(n, ()):
                if s not in dist:
                    dist[s] = dist[n] + 1
                    queue.append(s)
        return dist

    @classmethod
    def compile(
        cls,
        *,
        json_schema=None,
        regex=None,
        choice=None,
        vocab_size: int = 257,
        eos_id: int = 256,
        token_bytes=None,
        no_leading_space: bool = False,
        max_states: int | None = None,
    ) -> Grammar:
        """Exactly one of ``json_schema`` (dict or JSON string), ``regex``, ``choice``. ``token_bytes``:
        ``{token_id: bytes it writes}`` (default: the byte tokenizer's 0..255; for a ``transformers``
        tokenizer ``tokenizer.token_bytes``); ``no_leading_space``: no first token starting with a space
        (the tokenizer's decode would drop it); ``max_states``: refuse an automaton with more states
        (``GrammarError`` naming the limit)."""
        given = [n for n, v in (("json_schema", json_schema), ("regex", regex), ("choice", choice)) if v is not None]
        if len(given) != 1:
            raise GrammarError(f"give exactly one of json_schema=, regex=, choice= (got {given or 'none'})")
        if json_schema is not None:
            regex = schema_regex(json_schema)
        elif choice is not None:
            regex = choice_regex(choice)
        elif not isinstance(regex, str) or not regex:
            raise GrammarError(f"regex={regex!r}: allowed a non-empty string")
        g = cls(
            regex,
            vocab_size=vocab_size,
            eos_id=eos_id,
            token_bytes=token_bytes,
            no_leading_space=no_leading_space,
            max_states=max_states,
        )
        g.source = {given[0]: json_schema if json_schema is not None else choice if choice is not None else regex}
        return g

    def advance(self, state, token: int):
        nxt = self.transitions.get(state, {}).get(int(token))
        if nxt is None:
            raise ValueError(f"token {token} is not allowed in state {state}")
        return nxt

    def is_final(self, state) -> bool:
        return bool(self.index.is_final_state(self._start if state == _START else state))

    def allowed_mask(self, state, remaining: int) -> torch.Tensor:
        """bool [vocab_size]: tokens allowed in ``state`` with ``remaining`` tokens of budget."""
        with Timer() as t:
            toks, dist = self._edges.get(state, (torch.zeros(0, dtype=torch.long),) * 2)
            binding = bool(dist.numel()) and int(dist.max()) > remaining - 1
            key = (state, remaining if binding else None)
            m = self._cache.get(key)
            if m is None:
                m = torch.zeros(self.vocab_size, dtype=torch.bool)
                m[toks[dist <= remaining - 1]] = True
                if self.is_final(state):
                    m[self.eos_id] = True
                self._cache[key] = m
        self.mask_seconds += t.seconds
        self.mask_calls += 1
        return m

    def walker(self, max_tokens: int):
        """``allowed(prefix_tokens) -> mask`` for ``speculative_generate``: the state of a prefix is
        found by advancing from the longest known prefix (memoised), the budget is max_tokens − len."""
        states = {(): self.initial_state}

        def allowed(prefix):
            key = tuple(int(t) for t in prefix)
            j = len(key)
            while key[:j] not in states:
                j -= 1
            s = states[key[:j]]
            for i in range(j, len(key)):
                if key[i] == self.eos_id:
                    return None
                s = self.advance(s, key[i])
                states[key[: i + 1]] = s
            return self.allowed_mask(s, max_tokens - len(key))

        return allowed


def generate_structured(
    model,
    prompt_ids,
    grammar: Grammar,
    *,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 0,
    draft=None,
    k: int = 4,
):
    """Decode ``max_tokens`` at most, every token masked by ``grammar`` (budget-aware). Returns
    ``(tokens without EOS, SpecStats)``; the tokens always match the grammar."""
    from .speculative import speculative_generate

    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < max(1, grammar.min_tokens):
        raise GrammarError(
            f"max_tokens={max_tokens!r} is out of range: the shortest match takes "
            f"{grammar.min_tokens} tokens, allowed an int >= {max(1, grammar.min_tokens)}"
        )
    if model.cfg.vocab_size != grammar.vocab_size:
        raise GrammarError(
            f"the grammar was compiled for vocab_size={grammar.vocab_size}, the model has {model.cfg.vocab_size}"
        )
    out, stats = speculative_generate(
        model,
        prompt_ids,
        draft=draft,
        k=k,
        max_new_tokens=max_tokens,
        temperature=temperature,
        seed=seed,
        eos_id=grammar.eos_id,
        allowed=grammar.walker(max_tokens),
    )
    return [t for t in out if t != grammar.eos_id], stats
