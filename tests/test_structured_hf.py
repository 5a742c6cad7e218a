"""Structured outputs with real ``transformers`` tokenizers of converted models (built locally, no
download, ``tokenizer.train_tokenizer``): a byte-level BPE (GPT-2 style), a SentencePiece-style BPE
('▁' + <0xNN> byte fallback, Llama 2 as converted) and a Metaspace one, each trained on a few KB of
text and paired with a random-weight transformers Qwen2/Llama model.
Every token's bytes are derived from the tokenizer; json_schema / regex / choice outputs decoded by
the tokenizer always match, at temperature 0 and 1, within max_tokens equal to the shortest
completion; through ``LLM.generate`` and through the FastAPI server with the openai client. A wrong
byte derivation (no GPT-2 byte inversion) is caught."""

import functools
import json
import random
import re
import socket
import threading
import time

import jsonschema
import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

from mlsys_nb.inference import LLM, SamplingParams  # noqa: E402
from mlsys_nb.inference import tokenizer as tk  # noqa: E402
from mlsys_nb.inference.structured import GrammarError  # noqa: E402

SCHEMA = {
    "type": "object",
    "required": ["name", "age", "tags"],
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "age": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["red", "blue", "ünï"]}, "maxItems": 3},
    },
}
REGEX = r"(the|a) [a-z]{2,8} (is|was) \d{1,3}(\.\d)?"
CHOICES = ["positive", "negative", "neutral ünïcode", "a.b (c)"]


def corpus() -> str:
    """A few KB of text with JSON objects, words, digits and non-ASCII characters."""
    rng = random.Random(0)
    words = "the a name age tags red blue green is was value city river number ünï café naïve".split()
    words += ["positive", "negative", "neutral"]
    lines = []
    for _ in range(120):
        obj = {"name": rng.choice(words), "age": rng.randint(0, 999), "tags": rng.sample(["red", "blue", "ünï"], 2)}
        lines.append(json.dumps(obj, separators=(",", ":"), ensure_ascii=False))
        lines.append(" ".join(rng.choice(words) for _ in range(8)) + f" {rng.randint(0, 99)}.{rng.randint(0, 9)}")
    return "\n".join(lines)


def byte_level_bpe():
    return tk.train_tokenizer(corpus(), 420, "byte_level")


def hf_model(kind: str, vocab_size: int, eos: int):
    cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
    }[kind]
    torch.manual_seed(0)
    cfg = cls[0](
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        eos_token_id=eos,
        tie_word_embeddings=False,
        initializer_range=0.5,  # peaked random distributions: the mask must override confident logits
    )
    return cls[1](cfg).eval()


@pytest.fixture(scope="module", params=tk.STYLES)
def setup(request):
    tok = tk.train_tokenizer(corpus(), 420 if request.param == "byte_level" else 300, request.param)
    model = hf_model("qwen2" if request.param == "byte_level" else "llama", len(tok), tok.eos_token_id)
    return request.param, tok, LLM(model, tokenizer=tok, max_num_seqs=8)


def test_token_bytes_match_the_tokenizer(setup):
    """Independent reference: the tokenizer's own encode. Concatenating the derived bytes of the ids of
    a text gives the text's UTF-8 bytes (SentencePiece: with the prepended space)."""
    kind, tok, llm = setup
    tb, strips = tk.token_bytes(tok, len(tok))
    assert strips == (kind != "byte_level")
    assert tk.token_bytes(tok, len(tok))[0] is tb  # cached per tokenizer: derived once, not per request
    assert tok.eos_token_id not in tb and max(len(b) for b in tb.values()) >= 4  # multi-byte tokens
    rng = random.Random(1)
    for text in [corpus()[i : i + 80] for i in range(0, 4000, 400)] + ['{"ünï":"€ 𝄞\\n"}', "naïve café ☃ 12.5"]:
        ids = tok.encode(text, add_special_tokens=False)
        got = b"".join(tb[i] for i in ids)
        want = (
            [text.encode()]
            if kind == "byte_level"
            else [b" " + text.encode()] + [text.encode()] * (kind == "metaspace")
        )
        assert got in want, (text, ids)  # SentencePiece prepends a space (Metaspace 'first': unless there is one)
        assert tok.decode(ids).encode() == got.removeprefix(b" " if strips else b"")
        rng.shuffle(ids)  # any sequence that is valid UTF-8: decode gives exactly the concatenated bytes
        got = b"".join(tb[i] for i in ids)
        if tk.utf8_text(got) is not None:
            assert tok.decode(ids).encode() == (got.removeprefix(b" ") if strips else got)
    if kind != "byte_level":
        assert tb[tok.convert_tokens_to_ids("<0x0A>")] == b"\n"


def test_bytes_to_unicode_is_gpt2s_alphabet():
    """Against the tokenizers library's ByteLevel pre-tokenizer: same 256 characters, and a text's
    UTF-8 bytes mapped one by one give what the pre-tokenizer writes."""
    pre = tokenizers.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    m = tk.bytes_to_unicode()
    assert sorted(m.values()) == sorted(tokenizers.pre_tokenizers.ByteLevel.alphabet())
    text = "".join(chr(i) for i in range(1, 0x800)) + "€ 𝄞 \t\n\r"
    assert "".join(m[b] for b in text.encode()) == "".join(p for p, _ in pre.pre_tokenize_str(text))


def run(llm, tok, kw, temperature, seeds, max_tokens):
    params = [SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=s, **kw) for s in seeds]
    outs = llm.generate(["Q: give an answer.\nA:"] * len(seeds), params, use_tqdm=False)
    return [o.outputs[0] for o in outs]


def check(kw, text):
    if "json_schema" in kw:
        jsonschema.validate(json.loads(text), kw["json_schema"])
    elif "regex" in kw:
        assert re.fullmatch(kw["regex"], text), (kw["regex"], text)
    else:
        assert text in kw["choice"], text


@pytest.mark.parametrize(
    "kw", [{"json_schema": SCHEMA}, {"regex": REGEX}, {"choice": CHOICES}], ids=["json", "regex", "choice"]
)
def test_outputs_always_match(setup, kw):
    kind, tok, llm = setup
    ids = tok.encode("Q: give an answer.\nA:")
    g = llm.engine.prepare(ids, SamplingParams(max_tokens=200, **kw)).grammar
    multi = 0
    tb, _ = tk.token_bytes(tok, len(tok))
    for temperature, seeds in ((0.0, [0]), (1.0, range(6))):
        for max_tokens in (g.min_tokens, g.min_tokens + 25):  # the shortest completion exactly: budget-aware
            for c in run(llm, tok, kw, temperature, seeds, max_tokens):
                toks = [t for t in c.token_ids if t != tok.eos_token_id]
                assert len(toks) <= max_tokens
                text = tok.decode(c.token_ids, skip_special_tokens=True)
                assert c.text == text  # the engine's incremental detokenization agrees
                check(kw, text)
                multi += sum(len(tb[t]) > 1 for t in toks)
    assert multi > 0  # multi-byte tokens were generated


def test_wrong_byte_derivation_is_caught(monkeypatch):
    """Without the GPT-2 byte inversion ('Ġ' read as its own UTF-8, not a space) the derived bytes
    disagree with decode: the verification rejects it, and unverified the outputs stop matching."""
    tok = byte_level_bpe()
    model = hf_model("qwen2", len(tok), tok.eos_token_id)
    monkeypatch.setattr(tk, "bytes_rule", lambda t: lambda s: s.encode("utf-8"))
    with pytest.raises(tk.TokenBytesError, match=type(tok).__name__ + ": token .* decodes to"):
        tk.token_bytes(tok, len(tok))
    monkeypatch.setattr(tk, "token_bytes", functools.partial(tk.token_bytes, verify=False))
    llm = LLM(model, tokenizer=tok)
    rx = r"[^ \n]{3,12}"  # no spaces: 'Ġred' is read as b'\xc4\xa0red' (allowed) but writes ' red'
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in run(llm, tok, {"regex": rx}, 1.0, range(6), 12)]
    assert any(re.fullmatch(rx, t) is None for t in texts), texts
    monkeypatch.undo()  # the right rule: the same requests always match
    llm = LLM(model, tokenizer=tok)
    texts = [tok.decode(c.token_ids, skip_special_tokens=True) for c in run(llm, tok, {"regex": rx}, 1.0, range(6), 12)]
    assert all(re.fullmatch(rx, t) for t in texts), texts


def test_leading_space_and_a_decoder_that_strips_it(setup, monkeypatch):
    """SentencePiece's decode drops the text's first space, so a choice ' yes' could never come out as
    ' yes': the grammar starts without space-initial tokens (here only 'no' is possible). Ignoring that
    (monkeypatched) produces ' yes' bytes that decode to 'yes', outside the choices."""
    kind, tok, llm = setup
    kw = {"choice": [" yes", "no"]}
    texts = {c.text for c in run(llm, tok, kw, 1.0, range(8), 8)}
    want = {"no"} if kind != "byte_level" else {" yes", "no"}  # byte-level decode keeps the space
    assert texts <= want and (kind != "byte_level" or " yes" in texts), texts
    if kind == "sentencepiece":  # (Metaspace's decoder keeps a <0x20> byte token's space: ' yes' may come out)
        with pytest.raises(GrammarError, match="admits no output"):
            llm.generate(["x"], SamplingParams(max_tokens=8, regex=" [a-z]+"), use_tqdm=False)
        tb, _ = tk.token_bytes(tok, len(tok))
        monkeypatch.setattr(tk, "token_bytes", lambda *a, **k: (tb, False))
        texts = {c.text for c in run(llm, tok, kw, 1.0, range(8), 8)}
        assert "yes" in texts, texts


def test_underivable_tokenizer_is_named():
    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3}
    t = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>", unk_token="<unk>")
    llm = LLM(hf_model("llama", 8, 1), tokenizer=tok)
    with pytest.raises(GrammarError, match=type(tok).__name__ + ".*WordLevel"):
        llm.generate(["hello"], SamplingParams(max_tokens=8, regex="(hello)+"), use_tqdm=False)
    assert not llm.engine.has_unfinished_requests()


def test_server_response_format_with_a_converted_model(setup):
    """The FastAPI app (``serve.build_app``) over the converted model and its tokenizer, served by a real
    uvicorn on a free loopback port in a thread, driven by the openai client with ``response_format``."""
    openai = pytest.importorskip("openai")
    uvicorn = pytest.importorskip("uvicorn")
    from mlsys_nb.inference.serve import build_app

    kind, tok, llm = setup
    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build_app(llm.engine, kind), host="127.0.0.1", port=port, log_level="warning")
    )
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "server did not start within 60 s"
            time.sleep(0.05)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60, max_retries=0)
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
        for seed in range(3):
            r = client.chat.completions.create(
                model=kind,
                messages=[{"role": "user", "content": "a person?"}],
                max_tokens=60,
                temperature=1.0,
                seed=seed,
                response_format=fmt,
            )
            jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)
        with pytest.raises(openai.BadRequestError, match="max_tokens"):
            client.chat.completions.create(
                model=kind, messages=[{"role": "user", "content": "x"}], max_tokens=2, response_format=fmt
            )
    finally:
        server.should_exit = True
        thread.join(timeout=30)
    assert not thread.is_alive()


def test_structured_with_speculative_decoding(setup):
    """Drafted tokens (prompt lookup) are masked by the same grammar over the tokenizer's bytes."""
    kind, tok, llm = setup
    spec = LLM(llm.engine.model, tokenizer=tok, speculative_model="ngram", num_speculative_tokens=3)
    kw = {"json_schema": SCHEMA}
    prompt = 'Q: {"name":"red","age":12,"tags":["red"]}\nA:'
    for seed in range(3):
        params = SamplingParams(max_tokens=40, temperature=1.0, seed=seed, **kw)
        c = spec.generate([prompt], params, use_tqdm=False)[0].outputs[0]
        text = tok.decode(c.token_ids, skip_special_tokens=True)
        assert c.text == text
        check(kw, text)
    greedy = SamplingParams(max_tokens=40, temperature=0.0, **kw)
    assert (
        spec.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
        == llm.generate([prompt], greedy, use_tqdm=False)[0].outputs[0].token_ids
    )
