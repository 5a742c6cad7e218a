"""Structured outputs with real transformers tokenizers (built here: no downloads): a GPT-2-style
byte-level BPE and a Llama-2-style SentencePiece BPE (``▁`` for spaces, ``<0xNN>`` byte fallback),
each with a random-weight transformers Llama of the same vocabulary, through ``LLM.generate`` and once
through the OpenAI-compatible server with the ``openai`` client."""

from __future__ import annotations

import json
import re
import socket
import threading
import time

import jsonschema
import pytest
import torch

from mlsys_nb.inference import SamplingParams, structured
from mlsys_nb.inference.engine import LLM

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

CORPUS = [
    '{"name": "Ada", "age": 36, "city": "London"}',
    '{"name": "Alan", "age": 41, "ok": true, "tags": ["a", "b"]}',
    "the quick brown fox jumps over the lazy dog 0123456789",
    "yes no maybe, red green blue; [1, 2, 3] {x: y}",
] * 20
SCHEMA = {
    "type": "object",
    "required": ["name", "age"],
    "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
}
REGEX = r"(yes|no) [0-9]{2,3}"
CHOICES = ["red", "green", "blue"]


def _byte_level():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<eos>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(CORPUS, trainer)
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _sentencepiece():
    """A Llama-2-style BPE: learned merges over ``▁``-prefixed words, plus the 256 ``<0xNN>`` tokens
    byte fallback uses for anything the merges do not cover."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    base = Tokenizer(models.BPE())
    base.pre_tokenizer = pre_tokenizers.Metaspace()
    base.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"]))
    spec = json.loads(base.to_str())
    vocab = dict(spec["model"]["vocab"])
    for b in range(256):
        vocab.setdefault(f"<0x{b:02X}>", len(vocab))
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in spec["model"]["merges"]]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.add_special_tokens(["<eos>"])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def _model(vocab_size: int):
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module", params=["byte_level", "sentencepiece"])
def llm(request):
    tok = _byte_level() if request.param == "byte_level" else _sentencepiece()
    return LLM(_model(len(tok)), tokenizer=tok, num_blocks=64)


def test_token_bytes_agree_with_the_tokenizers_decoder(llm):
    tok = llm.get_tokenizer()
    tb = structured.token_bytes(tok)
    assert tok.eos_token_id not in tb
    multi = [i for i, b in tb.items() if len(b) > 1]
    assert len(multi) > 20  # real merges, not only single bytes
    for i in multi[:200]:  # a token's bytes are what decoding a sequence holding it yields for it
        text = tok.decode([tb_id for tb_id in (tok.encode("x", add_special_tokens=False)[-1], i)])
        assert text.encode("utf-8").endswith(tb[i]) or b"\xef\xbf\xbd" in text.encode(), (i, tb[i], text)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_outputs_always_match(llm, temperature):
    for seed in range(3):
        common = dict(temperature=temperature, seed=seed, max_tokens=40)
        out = llm.generate(
            ["person:", "answer:", "color:"],
            [
                SamplingParams(json_schema=SCHEMA, **common),
                SamplingParams(regex=REGEX, **common),
                SamplingParams(choice=CHOICES, **common),
            ],
            use_tqdm=False,
        )
        data = json.loads(out[0].outputs[0].text)
        jsonschema.validate(data, SCHEMA)
        assert re.fullmatch(REGEX, out[1].outputs[0].text), out[1].outputs[0].text
        assert out[2].outputs[0].text in CHOICES


def test_budget_aware_at_the_shortest_completion(llm):
    eng = llm.engine
    g = eng._grammar(SamplingParams(json_schema=SCHEMA, max_tokens=200), [1])
    for seed in range(3):
        out = llm.generate(
            "p:",
            SamplingParams(json_schema=SCHEMA, max_tokens=g.min_tokens, temperature=1.0, seed=seed),
            use_tqdm=False,
        )
        jsonschema.validate(json.loads(out[0].outputs[0].text), SCHEMA)
    with pytest.raises(ValueError, match="max_tokens"):
        llm.generate("p:", SamplingParams(json_schema=SCHEMA, max_tokens=g.min_tokens - 1), use_tqdm=False)


def test_wrong_token_bytes_are_caught(monkeypatch):
    """Derive the byte-level tokens' bytes naively (the UTF-8 of the token string, without inverting
    GPT-2's byte alphabet): a space is then never a token's byte, and a grammar with spaces admits nothing."""
    tok = _byte_level()
    monkeypatch.setattr(structured, "_byte_level_decoder", lambda: {chr(i): i for i in range(128)})
    llm = LLM(_model(len(tok)), tokenizer=tok, num_blocks=32)
    with pytest.raises(structured.GrammarError, match="incompatible|admits no output"):
        llm.generate("answer:", SamplingParams(regex=REGEX, max_tokens=20), use_tqdm=False)


def test_unsupported_tokenizer_is_named():
    class Odd:
        pass

    with pytest.raises(structured.GrammarError, match="Odd"):
        structured.token_bytes(Odd())


def test_server_response_format_with_a_byte_level_tokenizer():
    import openai
    import uvicorn

    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.serve import build_app

    tok = _byte_level()
    app = build_app(LLMEngine(_model(len(tok)), tokenizer=tok, num_blocks=64), "bpe")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60, max_retries=0)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        for seed in range(2):
            r = client.chat.completions.create(
                model="bpe",
                messages=[{"role": "user", "content": "a person?"}],
                max_tokens=40,
                temperature=1.0,
                seed=seed,
                response_format=fmt,
            )
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
    finally:
        server.should_exit = True
        thread.join(timeout=15)
