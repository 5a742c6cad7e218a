"""Structured outputs always parse: the grammar plans for the tokens a request can really produce,
min(max_tokens, context − prompt), in the engine and the speculative path; a match that cannot end
within that budget is refused before decoding (``GrammarError`` naming the parameter)."""

import dataclasses
import json
import re

import pytest

from mlsys_nb.inference import LLM, GrammarError, LLMEngine, SamplingParams

SCHEMAS = [  # shapes the other structured tests do not use: unbounded integers, nested arrays
    {
        "type": "object",
        "properties": {"n": {"type": "integer"}, "k": {"type": "array", "items": {"type": "integer"}}},
        "required": ["n", "k"],
    },
    {
        "type": "object",
        "properties": {
            "a": {"type": "array", "items": {"type": "array", "items": {"type": "boolean"}}},
            "s": {"type": "string"},
        },
        "required": ["a", "s"],
    },
]
REGEX = r"[a-c]+x(yz)*q"


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_num_seqs=8)


def _conforms(schema, value) -> bool:
    """A hand check of the schemas above (types of every required property, recursively)."""
    kind = schema["type"]
    if kind == "object":
        return isinstance(value, dict) and all(
            k in value and _conforms(schema["properties"][k], value[k]) for k in schema["required"]
        )
    if kind == "array":
        return isinstance(value, list) and all(_conforms(schema["items"], v) for v in value)
    return {
        "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "boolean": lambda v: isinstance(v, bool),
        "string": lambda v: isinstance(v, str),
    }[kind](value)


def _prompt(llm, room):
    """A prompt that leaves ``room`` tokens of context (the byte tokenizer: one token per ASCII byte)."""
    return "x" * (llm.engine.max_model_len - room)


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_json_at_the_context_limit_parses(llm, temperature):
    for i, schema in enumerate(SCHEMAS):
        sp = SamplingParams(temperature=temperature, max_tokens=500, json_schema=schema, seed=i)  # context binds
        prompts = [_prompt(llm, 40), _prompt(llm, 25)]
        for out in llm.generate(prompts, sp, use_tqdm=False):
            text = out.outputs[0].text
            assert _conforms(schema, json.loads(text)), text
        sp = dataclasses.replace(sp, max_tokens=30)  # max_tokens binds
        out = llm.generate([_prompt(llm, 80)], sp, use_tqdm=False)[0]
        assert len(out.outputs[0].token_ids) <= 30 and _conforms(schema, json.loads(out.outputs[0].text))


def test_regex_at_the_context_limit_matches_and_the_speculative_path_too(llm):
    for temperature in (0.0, 1.5):
        sp = SamplingParams(temperature=temperature, max_tokens=500, regex=REGEX, seed=3)
        for out in llm.generate([_prompt(llm, 12), _prompt(llm, 30)], sp, use_tqdm=False):
            assert re.fullmatch(REGEX, out.outputs[0].text), out.outputs[0].text
    spec = LLM("tiny", speculative_model="ngram", num_speculative_tokens=3)
    sp = SamplingParams(temperature=1.5, max_tokens=500, json_schema=SCHEMAS[0], seed=5)
    out = spec.generate([_prompt(spec, 30)], sp, use_tqdm=False)[0]
    assert _conforms(SCHEMAS[0], json.loads(out.outputs[0].text))


def test_a_match_that_cannot_end_within_the_budget_is_refused_before_decoding(llm):
    with pytest.raises(GrammarError, match="exceeds max_model_len") as e:
        llm.engine.prepare(_prompt(llm, 3), SamplingParams(max_tokens=50, json_schema=SCHEMAS[0]))
    assert e.value.param == "prompt"
    with pytest.raises(GrammarError, match="max_tokens=3 is out of range") as e:
        llm.engine.prepare("hi", SamplingParams(max_tokens=3, json_schema=SCHEMAS[0]))
    assert e.value.param == "max_tokens"


def test_planning_for_max_tokens_instead_of_the_context_breaks_the_json(llm, monkeypatch):
    """The check bites: a grammar that plans for max_tokens when the context ends first leaves the JSON
    unfinished (the bug: an integer that never ends, cut by the context)."""
    prepare = LLMEngine.prepare

    def plan_for_max_tokens(self, prompt, params=None, **kw):
        return dataclasses.replace(prepare(self, prompt, params, **kw), budget=params.max_tokens)

    monkeypatch.setattr(LLMEngine, "prepare", plan_for_max_tokens)
    sp = SamplingParams(temperature=0.0, max_tokens=500, json_schema=SCHEMAS[0])
    texts = [o.outputs[0].text for o in llm.generate([_prompt(llm, 25)], sp, use_tqdm=False)]
    with pytest.raises(json.JSONDecodeError):
        json.loads(texts[0])
