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
post-check). ``max_states`` bounds the automaton (``GrammarError`` naming ``max_grammar_states``).

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

import json
import re._constants as _sre
import re._parser as _sre_parse
from collections import deque

import torch

from ..runtime.timing import Timer
from .sampler import apply_mask  # the mask is applied where logits are processed; re-exported here

__all__ = [
    "Grammar",
    "GrammarError",
    "apply_mask",
    "choice_regex",
    "enforceable_schema",
    "generate_structured",
    "schema_errors",
]

_META = set("\\.+*?()|[]{}^$#&-~")
_START = -1  # the start state when the output must not begin with a space (no outlines-core state is < 0)


class GrammarError(ValueError):
    """An invalid schema/regex, or a grammar that admits no output (raised before generation); ``param``
    names the request parameter at fault (None: the constraint itself)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


def choice_regex(choices) -> str:
    """A regex matching exactly one of the strings in ``choices`` (metacharacters escaped), longest first:
    outlines-core's automaton gives an alternation leftmost priority, so in ``(a|ab)`` the branch ``a``
    wins and ``ab`` could never be generated; ``(ab|a)`` keeps both."""
    if isinstance(choices, str) or not choices or not all(isinstance(c, str) and c for c in choices):
        raise GrammarError(f"choice={choices!r}: allowed a non-empty list of non-empty strings")
    ordered = sorted(dict.fromkeys(choices), key=len, reverse=True)  # stable: equal lengths keep their order
    return "(" + "|".join("".join("\\" + ch if ch in _META else ch for ch in c) for c in ordered) + ")"


# ---- a bounded count of states before compiling (max_grammar_states) ------------------------------------
_MAXCHAR = 0x110000
_SRE_CATEGORIES = {
    _sre.CATEGORY_DIGIT: [(48, 58)],
    _sre.CATEGORY_WORD: [(48, 58), (65, 91), (95, 96), (97, 123)],
    _sre.CATEGORY_SPACE: [(9, 14), (32, 33)],
}
_SRE_CATEGORIES[_sre.CATEGORY_NOT_DIGIT] = ("not", _sre.CATEGORY_DIGIT)
_SRE_CATEGORIES[_sre.CATEGORY_NOT_WORD] = ("not", _sre.CATEGORY_WORD)
_SRE_CATEGORIES[_sre.CATEGORY_NOT_SPACE] = ("not", _sre.CATEGORY_SPACE)


class _Unsupported(Exception):
    """Regex syntax the state count does not model."""


def _complement(ranges):
    out, lo = [], 0
    for a, b in sorted(ranges):
        if a > lo:
            out.append((lo, a))
        lo = max(lo, b)
    if lo < _MAXCHAR:
        out.append((lo, _MAXCHAR))
    return out


def _category(cat):
    v = _SRE_CATEGORIES.get(cat)
    if v is None:
        raise _Unsupported(cat)
    return _complement(_SRE_CATEGORIES[v[1]]) if isinstance(v, tuple) else v


def _charset(op, av):
    if op is _sre.LITERAL:
        return [(av, av + 1)]
    if op is _sre.NOT_LITERAL:
        return _complement([(av, av + 1)])
    if op is _sre.ANY:
        return _complement([(10, 11)])
    if op is _sre.IN:
        neg, rs = False, []
        for o, a in av:
            if o is _sre.NEGATE:
                neg = True
            elif o is _sre.LITERAL:
                rs.append((a, a + 1))
            elif o is _sre.RANGE:
                rs.append((a[0], a[1] + 1))
            elif o is _sre.CATEGORY:
                rs += _category(a)
            else:
                raise _Unsupported(o)
        return _complement(rs) if neg else rs
    raise _Unsupported(op)


def dfa_states(regex: str, limit: int, max_nfa: int = 5_000, max_work: int = 4_000_000) -> int | None:
    """The number of states of ``regex``'s character-level DFA (subset construction over a Thompson NFA built
    from Python's regex parser; the alphabet split into the intervals between range boundaries; ``\\d``,
    ``\\w``, ``\\s`` as ASCII), counting no further than ``limit + 1``: a bounded compilation, so that a
    grammar above ``max_grammar_states`` is refused before outlines-core builds its token automaton (seconds
    to minutes for an exponential one). outlines-core's automaton over bytes has at least as many states on
    the tests' regexes (it reports a match one byte late, which can double them), so this count refuses only
    grammars the exact check would refuse; those between the two pass it and meet the exact check.

    None (not counted: only the exact check applies) where the syntax is not modelled (look-arounds,
    back-references); where the count would cost more than ``max_work`` machine words ORed (about a second
    here) or the NFA more than ``max_nfa`` states (long chains of optional parts such as ``(a?b?){1200}``);
    and for alternations of more than single characters and lazy repeats: outlines-core's automaton follows
    leftmost-first priorities, which drop lower-priority branches once a higher one matches (``(x?|bxx1)``
    compiles to 2 states in 0.2.14, ``(a|ab)`` never allows ``ab``), so it can have fewer states than this
    count. Python's parser turns ``(a|b)`` into the class ``[ab]``, so such alternations are counted; JSON
    schemas and choice lists always bring longer ones."""
    try:
        tree = _sre_parse.parse(regex)
    except Exception:
        return None
    eps: list[list[int]] = []
    edges: list[list] = []  # per NFA state: [(ranges, target)]

    def new():
        if len(eps) >= max_nfa:
            raise _Unsupported("nfa too large")
        eps.append([])
        edges.append([])
        return len(eps) - 1

    def build(seq, start):  # returns end state
        cur = start
        for op, av in seq:
            if op in (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN):
                nxt = new()
                edges[cur].append((_charset(op, av), nxt))
                cur = nxt
            elif op is _sre.SUBPATTERN:
                cur = build(av[3], cur)
            elif op in (_sre.MAX_REPEAT, _sre.POSSESSIVE_REPEAT):  # greedy
                lo, hi, sub = av
                for _ in range(lo):
                    cur = build(sub, cur)
                if hi is _sre.MAXREPEAT:
                    loop = new()
                    eps[cur].append(loop)
                    eps[build(sub, loop)].append(loop)
                    cur = loop
                else:
                    end = new()
                    for _ in range(hi - lo):
                        eps[cur].append(end)
                        cur = build(sub, cur)
                    eps[cur].append(end)
                    cur = end
            elif op is _sre.AT and av in (_sre.AT_BEGINNING, _sre.AT_BEGINNING_STRING, _sre.AT_END, _sre.AT_END_STRING):
                continue  # outlines-core matches the whole output: anchors change nothing
            elif op is _sre.ATOMIC_GROUP:
                cur = build(av, cur)
            else:
                raise _Unsupported(op)
        return cur

    try:
        start = new()
        final = build(tree, start)
    except (_Unsupported, RecursionError):
        return None
    # the alphabet split into classes: intervals between every range boundary
    bounds = sorted({x for es in edges for rs, _ in es for a, b in rs for x in (a, b)} | {0, _MAXCHAR})
    pos = {b: i for i, b in enumerate(bounds)}
    n = len(eps)
    closure = [1 << s for s in range(n)]  # epsilon closures as bit sets: a fixed point, whole sets ORed at once
    for _ in range(64):  # one pass per nesting level of loops (their back edges); deeper: not counted
        changed = False
        for s in range(n - 1, -1, -1):
            c = closure[s]
            for t in eps[s]:
                c |= closure[t]
            if c != closure[s]:
                closure[s], changed = c, True
        if not changed:
            break
    else:
        return None
    live = sum(1 << s for s in range(n) if edges[s]) | 1 << final  # the DFA's states are sets of these
    moves: list[dict] = [{} for _ in range(n)]  # per NFA state: {class index: the set of live states reached}
    for s in range(n):
        m = moves[s]
        for rs, t in edges[s]:
            c = closure[t] & live
            for a, b in rs:
                for k in range(pos[a], pos[b]):
                    m[k] = m.get(k, 0) | c
    chunk_cache: dict = {}  # (chunk, its 8 bits) -> {class: set reached}: a DFA step is a few dict merges

    def chunk_moves(j, v):
        out: dict = {}
        for b in range(8):
            if v >> b & 1:
                for k, c in moves[8 * j + b].items():
                    out[k] = out.get(k, 0) | c
        chunk_cache[j, v] = out
        return out

    s0 = closure[start] & live
    seen, todo = {s0}, [s0]
    cost, words = 0, n // 64 + 1  # work in machine words ORed: bounded by max_work, else not counted
    while todo:
        mask = todo.pop()
        out: dict = {}
        while mask:  # over the non-zero 8-bit chunks only
            j = ((mask & -mask).bit_length() - 1) >> 3
            v = mask >> (8 * j) & 255
            mask ^= v << (8 * j)
            for k, c in (chunk_cache.get((j, v)) or chunk_moves(j, v)).items():
                out[k] = out.get(k, 0) | c
            cost += words
        if cost > max_work:
            return None
        for t in set(out.values()):
            if t not in seen:
                seen.add(t)
                if len(seen) > limit:
                    return limit + 1
                todo.append(t)
    return len(seen)


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


# JSON-schema keywords whose every output the regex enforces (or that only annotate); any other keyword is
# refused: outlines-core's regex ignores e.g. minimum/maximum/multipleOf/uniqueItems, and an ignored
# restriction would let through outputs that fail the schema. Keywords that only RELAX (additionalProperties)
# are safe to ignore: the regex then admits a subset of the valid documents.
SCHEMA_KEYWORDS = frozenset(
    "type properties required additionalProperties items prefixItems minItems maxItems minLength maxLength "
    "pattern enum const anyOf $ref $defs definitions format title description default examples $schema $id "
    "$comment deprecated readOnly writeOnly".split()
)
# formats as exact regexes (ASCII digits; a date's day within its month, February to 28 so every year is valid;
# times in UTC with 'Z', as RFC 3339 requires an offset); other formats are refused
_DATE = (
    "[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    "|02-(?:0[1-9]|1[0-9]|2[0-8]))"
)
_TIME = "(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?Z"
FORMAT_PATTERNS = {
    "date": _DATE,
    "time": _TIME,
    "date-time": _DATE + "T" + _TIME,
    "uuid": "[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
}


def enforceable_schema(schema, path: str = "") -> dict:
    """A copy of ``schema`` whose every keyword the regex enforces (``format`` turned into an exact
    ``pattern``), or ``GrammarError`` naming the first keyword it would ignore (and its place)."""
    if isinstance(schema, bool):
        return schema
    if not isinstance(schema, dict):
        raise GrammarError(f"json_schema{path} must be an object")
    out = {}
    for key, value in schema.items():
        where = f"json_schema{path}.{key}"
        if key not in SCHEMA_KEYWORDS:
            raise GrammarError(
                f"{where}: the keyword {key!r} cannot be enforced by the token grammar, so it is refused "
                f"(enforced keywords: {', '.join(sorted(SCHEMA_KEYWORDS))})"
            )
        if key == "format":
            if value not in FORMAT_PATTERNS:
                raise GrammarError(
                    f"{where}: format {value!r} is refused (enforced formats: {sorted(FORMAT_PATTERNS)})"
                )
            if "pattern" in schema:
                raise GrammarError(f"{where}: format together with pattern is refused (one regex per string)")
            out["pattern"] = FORMAT_PATTERNS[value]
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise GrammarError(f"{where} must be an object")
            out[key] = {k: enforceable_schema(v, f"{path}.{key}.{k}") for k, v in value.items()}
        elif key in ("anyOf", "prefixItems") or (key == "items" and isinstance(value, list)):
            if not isinstance(value, list):
                raise GrammarError(f"{where} must be a list")
            out[key] = [enforceable_schema(v, f"{path}.{key}[{i}]") for i, v in enumerate(value)]
        elif key in ("items", "additionalProperties") and isinstance(value, dict):
            out[key] = enforceable_schema(value, f"{path}.{key}")
        else:
            out[key] = value
    return out


def ascii_classes(regex: str) -> str:
    """``regex`` with ``\\d`` and ``\\w`` turned into ASCII classes, as JSON Schema's (ECMA 262) patterns
    mean them; the regex engine's ``\\d`` matches every Unicode digit (e.g. '٣')."""
    out, i, in_class = [], 0, False
    repl = {"d": ("[0-9]", "0-9"), "w": ("[A-Za-z0-9_]", "A-Za-z0-9_")}
    while i < len(regex):
        ch = regex[i]
        if ch == "\\" and i + 1 < len(regex):
            nxt = regex[i + 1]
            out.append(repl[nxt][in_class] if nxt in repl else regex[i : i + 2])
            i += 2
            continue
        if ch == "[" and not in_class:
            in_class = True
        elif ch == "]" and in_class:
            in_class = False
        out.append(ch)
        i += 1
    return "".join(out)


def schema_regex(json_schema) -> str:
    """The compact regex (no free whitespace) of a JSON schema; GrammarError if the schema is invalid or
    uses a keyword the regex cannot enforce (``enforceable_schema``)."""
    import jsonschema
    from outlines_core.json_schema import build_regex_from_schema

    try:
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        if not isinstance(schema, dict):
            raise TypeError("a JSON schema is an object")
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except Exception as e:
        raise GrammarError(f"json_schema is invalid: {str(e).splitlines()[0]}") from None
    schema = enforceable_schema(schema)
    try:
        return ascii_classes(build_regex_from_schema(json.dumps(schema), whitespace_pattern=""))
    except Exception as e:
        raise GrammarError(f"json_schema is invalid or unsupported: {str(e).splitlines()[0]}") from None


def schema_errors(text: str, json_schema) -> str | None:
    """None if ``text`` is a JSON document valid under ``json_schema`` (formats checked too), else why not:
    the server's post-check, so that no answer that fails its schema is ever returned."""
    import jsonschema

    try:
        schema = json.loads(json_schema) if isinstance(json_schema, str) else json_schema
        jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
    except (ValueError, jsonschema.ValidationError) as e:
        return str(e).splitlines()[0]
    return None


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
