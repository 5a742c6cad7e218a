"""A bounded count of a regex's automaton states, made before compiling it (``max_grammar_states``).

outlines-core builds a grammar's token automaton in seconds to minutes when the regex's DFA is exponential, so
``structured.Grammar`` first counts the states of the character-level DFA here (subset construction over a
Thompson NFA built from Python's own regex parser), stopping at ``limit + 1``, and refuses a grammar above
the limit before compiling it. Torch-free; ``dfa_states`` says what it does not count (then only the exact
check after compiling applies).
"""

from __future__ import annotations

import re._constants as _sre
import re._parser as _sre_parse

__all__ = ["dfa_states"]

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
