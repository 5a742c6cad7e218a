"""ByteTokenizer: round trip, EOS, incremental decoding that holds back incomplete UTF-8; the same
duck type for a transformers tokenizer (built locally, no download)."""

import pytest

from mlsys_nb.config import load_model_preset
from mlsys_nb.inference import ByteTokenizer
from mlsys_nb.inference.tokenizer import decode_stream

TEXTS = ["hello", "naïve café — 東京 🚀", "", "a\nb\tc", "ﬁ𝔘𝔫𝔦𝔠𝔬𝔡𝔢"]


@pytest.mark.parametrize("text", TEXTS)
def test_round_trip_and_stream(text):
    tok = ByteTokenizer(257)
    ids = tok.encode(text, add_eos=True)
    assert ids[-1] == tok.eos_id == 256 and all(0 <= i < 256 for i in ids[:-1])
    assert ids[:-1] == list(text.encode("utf-8"))
    assert tok.decode(ids) == text
    stream = tok.decode_stream()
    pieces = [stream.step(i) for i in ids]
    assert "".join(pieces) + stream.flush() == text
    # no piece ends in half a character: each is valid text on its own, and a multi-byte
    # character appears only when its last byte arrives
    assert "\ufffd" not in "".join(pieces)
    n_empty = sum(p == "" for p in pieces[:-1])
    assert n_empty == len(text.encode("utf-8")) - len(text)


def test_stream_check_fails_without_holding_back():
    """Decoding each byte on its own (no hold-back) produces replacement characters."""
    tok = ByteTokenizer(257)
    naive = "".join(tok.decode([i]) for i in tok.encode("東京"))
    assert "\ufffd" in naive


def test_no_eos_at_256_and_generation_presets():
    assert ByteTokenizer(256).eos_id is None
    with pytest.raises(ValueError, match="no end-of-sequence"):
        ByteTokenizer(256).encode("x", add_eos=True)
    with pytest.raises(ValueError, match="vocab_size"):
        ByteTokenizer(100)
    for name in ("tiny", "small"):
        assert load_model_preset(name).vocab_size >= 257


def test_transformers_tokenizer_duck_type():
    tokenizers = pytest.importorskip("tokenizers")
    transformers = pytest.importorskip("transformers")
    vocab = {"<unk>": 0, "</s>": 1, "hello": 2, "world": 3, "caf": 4, "é": 5}
    model = tokenizers.models.WordLevel(vocab, unk_token="<unk>")
    t = tokenizers.Tokenizer(model)
    t.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    hf = transformers.PreTrainedTokenizerFast(tokenizer_object=t, eos_token="</s>", unk_token="<unk>")
    ids = hf.encode("hello world")
    assert ids == [2, 3]
    stream = decode_stream(hf)
    text = "".join(stream.step(i) for i in ids + [hf.eos_token_id]) + stream.flush()
    assert text.split() == ["hello", "world"]
