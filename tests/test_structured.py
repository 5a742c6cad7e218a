"""Structured outputs: the budget-aware token mask always yields a match within max_tokens (random
weights, any temperature); the mask is applied before the softmax (no NaN); bad input fails early."""

import json
import re

import jsonschema
import pytest
import torch

from mlsys_nb.config import ModelConfig
from mlsys_nb.inference import speculative as spec
from mlsys_nb.inference import structured as st
from mlsys_nb.models.transformer import Transformer

SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
    },
    {
        "type": "object",
        "required": ["ok", "tags"],
        "properties": {
            "ok": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "bc"]}, "maxItems": 3},
        },
    },
    {"type": "array", "items": {"type": "number"}, "minItems": 1, "maxItems": 4},
]
REGEXES = [r"\d{3}-\d{4}", r"(ab|cd)+x", r"[a-z]+@[a-z]+\.(com|org)"]
PROMPT = list(b"answer: ")


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Transformer(ModelConfig(n_layers=1, hidden=32, n_heads=2, vocab_size=257, seq_len=512)).eval()
    with torch.no_grad():
        m.lm_head.weight.mul_(30)  # peaked random distributions: the mask must override confident logits
    return m


@pytest.mark.parametrize("schema", SCHEMAS)
def test_json_schema_always_validates(model, schema):
    g = st.Grammar.compile(json_schema=schema)
    for seed, temperature in ((0, 0.0), (1, 1.0), (2, 4.0)):
        for extra in (0, 30):
            out, _ = st.generate_structured(
                model, PROMPT, g, max_tokens=g.min_tokens + extra, temperature=temperature, seed=seed
            )
            assert len(out) <= g.min_tokens + extra
            text = bytes(out).decode("utf-8")
            assert free_whitespace(text) == [], f"{text!r}: whitespace outside strings (JSON must be compact)"
            jsonschema.validate(json.loads(text), schema)


def free_whitespace(text):
    """Positions of whitespace outside JSON string literals (where a compact JSON has none)."""
    out, in_string, escaped = [], False, False
    for i, ch in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in " \t\n\r":
            out.append(i)
    return out


def test_compact_check_catches_free_whitespace(model):
    """The compactness check above can fail: it sees whitespace between tokens but not inside strings, and a
    grammar built with an optional space between JSON tokens produces some for an object schema."""
    assert free_whitespace('{"name":"a b \\" c","age":0}') == []
    assert free_whitespace('{"name": "x","age":0}') == [8]
    assert free_whitespace("[1, 2]\n") == [3, 6]
    from outlines_core.json_schema import build_regex_from_schema

    loose = st.Grammar.compile(regex=build_regex_from_schema(json.dumps(SCHEMAS[0]), whitespace_pattern="[ ]?"))
    texts = [
        bytes(st.generate_structured(model, PROMPT, loose, max_tokens=40, temperature=4.0, seed=s)[0]).decode()
        for s in range(4)
    ]
    assert any(free_whitespace(t) for t in texts), texts


def test_regex_and_choice_always_match(model):
    for rx in REGEXES:
        g = st.Grammar.compile(regex=rx)
        for seed, temperature in ((0, 0.0), (1, 2.0)):
            out, _ = st.generate_structured(
                model, PROMPT, g, max_tokens=g.min_tokens + 5 * seed, temperature=temperature, seed=seed
            )
            assert re.fullmatch(rx, bytes(out).decode()), (rx, bytes(out))
    choices = ["yes", "no", "a.b (c)", "ünïcode"]
    g = st.Grammar.compile(choice=choices)
    seen = {
        bytes(st.generate_structured(model, PROMPT, g, max_tokens=12, temperature=3.0, seed=s)[0]).decode()
        for s in range(8)
    }
    assert seen <= set(choices) and len(seen) >= 2


def test_mask_before_softmax_never_nan():
    logits = torch.tensor([60.0, -60.0, 10.0, 0.0])
    mask = torch.tensor([False, True, False, False])  # only a very unlikely token allowed
    probs = st.apply_mask(logits, mask).softmax(-1)
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    after = logits.softmax(-1) * mask  # masking probabilities after the softmax underflows to 0/0
    assert torch.isnan(after / after.sum()).any()
    with pytest.raises(RuntimeError, match="allows no token"):
        st.apply_mask(logits, torch.zeros(4, dtype=torch.bool))


def test_budget_aware_mask_is_what_makes_it_fit(model, monkeypatch):
    schema = SCHEMAS[0]
    g = st.Grammar.compile(json_schema=schema)
    assert g.min_tokens == len('{"name":"","age":0}')
    out, _ = st.generate_structured(model, PROMPT, g, max_tokens=g.min_tokens, temperature=4.0, seed=0)
    assert bytes(out) == b'{"name":"","age":0}' or json.loads(bytes(out))  # only shortest paths: fits exactly
    # a mask that ignores the budget runs out of tokens mid-value for some seed
    unaware = st.Grammar.allowed_mask
    monkeypatch.setattr(st.Grammar, "allowed_mask", lambda self, s, remaining: unaware(self, s, 10**6))
    bad = 0
    for seed in range(6):
        out, _ = st.generate_structured(model, PROMPT, g, max_tokens=g.min_tokens + 3, temperature=4.0, seed=seed)
        try:
            jsonschema.validate(json.loads(bytes(out).decode("utf-8", "replace")), schema)
        except (ValueError, jsonschema.ValidationError):
            bad += 1
    assert bad > 0


def test_structured_with_speculative(model):
    g = st.Grammar.compile(json_schema=SCHEMAS[1])
    ref, _ = st.generate_structured(model, PROMPT, g, max_tokens=40)
    draft = Transformer(ModelConfig(n_layers=1, hidden=16, n_heads=2, vocab_size=257, seq_len=512)).eval()
    for d in (draft, "ngram"):
        out, s = st.generate_structured(
            model, PROMPT + list(b'{"ok":true,"tags":["a"]}'), g, max_tokens=40, draft=d, k=3
        )
        jsonschema.validate(json.loads(bytes(out)), SCHEMAS[1])
        out, s = st.generate_structured(model, PROMPT, g, max_tokens=40, draft=d, k=3)
        assert out == ref  # greedy: token for token the same as without speculation
    for seed in range(3):
        out, _ = st.generate_structured(
            model, PROMPT, g, max_tokens=g.min_tokens + 4, draft=draft, k=4, temperature=2.0, seed=seed
        )
        jsonschema.validate(json.loads(bytes(out)), SCHEMAS[1])


def test_bad_input_rejected_before_generation(model, monkeypatch):
    with pytest.raises(st.GrammarError, match="json_schema"):
        st.Grammar.compile(json_schema={"type": "nope"})
    with pytest.raises(st.GrammarError, match="json_schema"):
        st.Grammar.compile(json_schema="{not json")
    with pytest.raises(st.GrammarError, match="regex"):
        st.Grammar.compile(regex="a{")
    with pytest.raises(st.GrammarError, match="regex"):  # an empty class: the grammar admits nothing
        st.Grammar.compile(regex="x[a&&b]y")
    with pytest.raises(st.GrammarError, match="choice"):
        st.Grammar.compile(choice=[])
    with pytest.raises(st.GrammarError, match="exactly one"):
        st.Grammar.compile(regex="a", choice=["a"])
    g = st.Grammar.compile(json_schema=SCHEMAS[0])

    def no_cache(*a, **k):
        raise AssertionError("a cache was allocated")

    monkeypatch.setattr(spec, "KVCache", no_cache)
    with pytest.raises(st.GrammarError, match="max_tokens"):
        st.generate_structured(model, PROMPT, g, max_tokens=g.min_tokens - 1)


def test_mask_overhead_is_measured(model):
    g = st.Grammar.compile(json_schema=SCHEMAS[0])
    _, s = st.generate_structured(model, PROMPT, g, max_tokens=30, temperature=1.0)
    assert g.mask_calls >= len(_) and g.mask_seconds > 0
    print(
        f"mask: {g.mask_seconds / g.mask_calls * 1e6:.0f} µs per token vs {s.seconds / s.target_forwards * 1e3:.2f} "
        f"ms per step"
    )


def test_engine_structured_outputs():
    from mlsys_nb.inference import LLM, SamplingParams

    llm = LLM("tiny", seed=0)
    schema = SCHEMAS[0]
    free = llm.engine.kv.manager.num_free_blocks()
    params = [
        SamplingParams(json_schema=schema, max_tokens=m, temperature=t, seed=s)
        for m, t, s in ((19, 1.0, 0), (40, 3.0, 1), (40, 0.0, 2))
    ]
    params += [
        SamplingParams(regex=r"[a-c]{2}-\d", max_tokens=8, temperature=2.0, seed=3),
        SamplingParams(choice=["red", "green"], max_tokens=6, temperature=2.0, seed=4),
    ]
    outs = llm.generate(["a", "bb", "ccc", "d", "e"], params)
    for o in outs[:3]:
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    assert re.fullmatch(r"[a-c]{2}-\d", outs[3].outputs[0].text)
    assert outs[4].outputs[0].text in ("red", "green")
    for bad, match in (
        (dict(json_schema=schema, max_tokens=5), "max_tokens"),
        (dict(regex="a{", max_tokens=5), "regex"),
        (dict(json_schema={"type": "nope"}), "json_schema"),
    ):
        with pytest.raises(ValueError, match=match):
            llm.generate(["x"], SamplingParams(**bad))
    assert llm.engine.kv.manager.num_free_blocks() == free and not llm.engine.requests  # nothing left allocated
    with pytest.raises(ValueError, match="at most one"):
        SamplingParams(regex="a", choice=["a"])


def _accepts(g, text: str) -> bool:
    """Walk the byte tokenizer's automaton over ``text``: does it end in a final state?"""
    state = g.initial_state
    for b in text.encode():
        try:
            state = g.advance(state, b)
        except ValueError:
            return False
    return g.is_final(state)


def test_a_choice_one_character_longer_than_another_can_be_generated(monkeypatch):
    """outlines-core gives an alternation leftmost priority: in ``(a|ab)`` the ``ab`` branch is dropped, so
    choice_regex orders the choices longest first. In the order given, the longer choices are lost."""
    import random

    rng = random.Random(0)
    for _ in range(12):
        stem = "".join(rng.choice("ab") for _ in range(rng.randint(1, 3)))
        choices = rng.sample([stem, stem + "a", stem + "b", "b" + stem], rng.randint(2, 4))
        g = st.Grammar.compile(choice=choices)
        assert all(_accepts(g, c) for c in choices), choices
        assert not _accepts(g, stem + "ab") and not _accepts(g, "")
    monkeypatch.setattr(st, "choice_regex", lambda choices: "(" + "|".join(choices) + ")")  # as given (no escaping)
    g = st.Grammar.compile(choice=["a", "ab"])
    assert [_accepts(g, c) for c in ("a", "ab")] == [True, False]


@pytest.mark.xfail(strict=True, reason="outlines-core 0.2.14 drops a final state's edges into non-final states")
def test_known_limitation_a_longer_continuation_after_a_complete_match_is_lost():
    """``x(yz)?`` and the choice list ``["b", "bba"]``: after ``x`` (``b``) the match could end, and
    outlines-core's index keeps no edge from there to the unfinished ``xy`` (``bb``), so ``xyz`` (``bba``)
    can never be generated (what is generated still always matches). Strict xfail: an upgrade that fixes
    it turns this red, and the note in structured.py's docstring can go."""
    assert _accepts(st.Grammar.compile(regex="x(yz)?"), "xyz")
    assert _accepts(st.Grammar.compile(choice=["b", "bba"]), "bba")
