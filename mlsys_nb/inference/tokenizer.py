"""A byte-level tokenizer for the package's own models: prompts and outputs are text.

Ids 0-255 are the UTF-8 bytes; ``eos_id = 256`` exists when the model's ``vocab_size > 256`` (the
CPU generation presets ``tiny-gen``/``small`` have vocabularies >= 257). Any text round-trips.
Decoding a stream one token at a time must not print half a character: ``decode_stream`` holds back
an incomplete UTF-8 sequence until its last byte arrives.

Duck type shared with ``transformers`` tokenizers: ``encode(text) -> list[int]``,
``decode(ids) -> str``, ``eos_token_id``. ``as_tokenizer(tok)`` accepts either.
"""

from __future__ import annotations

import codecs
import weakref

from ..config import check_choice, check_int


class ByteTokenizer:
    """UTF-8 bytes as token ids (0-255) plus an end-of-sequence id 256 if ``vocab_size > 256``."""

    n_bytes = 256

    def __init__(self, vocab_size: int = 257):
        check_int("vocab_size (a byte tokenizer needs one id per byte)", vocab_size, 256)
        self.vocab_size = vocab_size
        self.eos_id = 256 if vocab_size > 256 else None

    @property
    def eos_token_id(self):  # the transformers name
        return self.eos_id

    def encode(self, text: str, *, add_eos: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise TypeError(f"text must be a str, got {type(text).__name__}")
        ids = list(text.encode("utf-8"))
        if add_eos:
            if self.eos_id is None:
                raise ValueError(f"vocab_size={self.vocab_size} has no end-of-sequence id (needs > 256)")
            ids.append(self.eos_id)
        return ids

    def decode(self, ids, *, skip_special_tokens: bool = True) -> str:
        """Bytes to text; ids >= 256 (EOS, unused ids) are dropped; invalid UTF-8 becomes U+FFFD."""
        return bytes(int(i) for i in ids if 0 <= int(i) < 256).decode("utf-8", errors="replace")

    def decode_stream(self):
        """An incremental decoder: ``step(token_id) -> str`` returns the text completed by this token
        ('' while a multi-byte character is incomplete); ``flush()`` returns what is held back."""
        return _ByteStream()

    def __repr__(self):
        return f"ByteTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


class _ByteStream:
    def __init__(self):
        self._dec = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def step(self, token_id: int) -> str:
        token_id = int(token_id)
        if not 0 <= token_id < 256:
            return ""
        return self._dec.decode(bytes([token_id]))

    def flush(self) -> str:
        return self._dec.decode(b"", final=True)


class _HFStream:
    """Incremental decoding for a subword tokenizer: decode the whole id list, emit the new suffix,
    and hold back text ending in U+FFFD (an incomplete byte-fallback character)."""

    def __init__(self, tok):
        self.tok, self.ids, self.sent = tok, [], ""

    def step(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        if text.endswith("\ufffd"):
            return ""
        new, self.sent = text[len(self.sent) :], text
        return new

    def flush(self) -> str:
        text = self.tok.decode(self.ids, skip_special_tokens=True)
        new, self.sent = text[len(self.sent) :], text
        return new


def decode_stream(tok):
    """An incremental decoder for a ByteTokenizer or a ``transformers`` tokenizer."""
    return tok.decode_stream() if hasattr(tok, "decode_stream") else _HFStream(tok)


# ---- token bytes: what each token id writes, for grammar masks (structured outputs) ----------------
def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte-level alphabet: each byte 0-255 as a printable character (Radford et al., 2019,
    the released GPT-2 tokenizer): printable Latin-1 bytes map to themselves, the other 68 to U+0100 on."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + n)
            n += 1
    return chars


_BYTE_OF_CHAR = {c: b for b, c in bytes_to_unicode().items()}


def _decoder_types(tok) -> tuple[list[dict], str]:
    import json

    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        return [], ""
    spec = json.loads(backend.to_str())
    flat, stack = [], [spec.get("decoder") or {}]
    while stack:
        d = stack.pop(0)
        if d.get("type") == "Sequence":
            stack[:0] = d.get("decoders", [])
        elif d:
            flat.append(d)
    return flat, (spec.get("model") or {}).get("type", "")


def bytes_rule(tok):
    """``rule(token_string) -> bytes`` from the decoder of a ``transformers`` fast tokenizer, or None:
    ByteLevel (GPT-2/Llama 3/Qwen: invert ``bytes_to_unicode``) or SentencePiece style (Metaspace or
    Replace '▁'->' ', with ByteFallback tokens ``<0xNN>``: Llama 2/Mistral)."""
    decs, _ = _decoder_types(tok)
    types = [d.get("type") for d in decs]
    if "ByteLevel" in types:
        return lambda s: bytes(_BYTE_OF_CHAR[c] for c in s)
    space = next((d.get("replacement", "▁") for d in decs if d.get("type") == "Metaspace"), None)
    space = space or next(
        (d["pattern"].get("String") for d in decs if d.get("type") == "Replace" and d.get("content") == " "), None
    )
    if space is None:
        return None
    fallback = "ByteFallback" in types

    def rule(s):
        if fallback and len(s) == 6 and s.startswith("<0x") and s.endswith(">"):
            return bytes([int(s[3:5], 16)])
        return s.replace(space, " ").encode("utf-8")

    return rule


class TokenBytesError(ValueError):
    """A tokenizer whose tokens' byte strings cannot be derived (structured outputs need them)."""


_TOKEN_BYTES_CACHE = weakref.WeakKeyDictionary()  # tokenizer -> {(vocab_size, verify): result}


def token_bytes(tok, vocab_size: int, *, verify: bool = True) -> tuple[dict[int, bytes], bool]:
    """``({token_id: the exact bytes it writes}, strips_leading_space)`` for a grammar vocabulary.

    ``ByteTokenizer``: ids 0-255 are bytes. A ``transformers`` fast tokenizer: each vocabulary token's
    string turned into bytes by its decoder's rule (``bytes_rule``); special and added tokens (BOS,
    EOS, pad, chat markers) and ids >= ``vocab_size`` (the model's) are left out: a grammar never
    emits them (EOS is handled by the grammar). ``strips_leading_space``: the tokenizer's ``decode``
    drops the first space of a text (SentencePiece's ``Strip``/``Metaspace`` decoders), so a grammar
    must not start the output with a space. With ``verify`` every token whose bytes are complete
    UTF-8 is decoded alone by the tokenizer and must give exactly those bytes (a wrong rule is caught
    here, not as unmatched outputs). Raises ``TokenBytesError`` naming the tokenizer class otherwise.
    Cached per tokenizer object."""
    if isinstance(tok, ByteTokenizer):
        return {i: bytes([i]) for i in range(256)}, False
    try:
        cache = _TOKEN_BYTES_CACHE.setdefault(tok, {})
    except TypeError:  # not weakly referenceable: no cache
        cache = {}
    if (vocab_size, verify) in cache:
        return cache[vocab_size, verify]
    name = type(tok).__name__
    rule = bytes_rule(tok) if hasattr(tok, "get_vocab") else None
    if rule is None:
        decs, model = _decoder_types(tok)
        raise TokenBytesError(
            f"cannot derive the byte string of each token of {name} (model {model or '?'}, decoder "
            f"{[d.get('type') for d in decs] or 'none'}): structured outputs need the byte tokenizer, a "
            f"byte-level BPE (GPT-2 style ByteLevel decoder) or a SentencePiece-style tokenizer (Metaspace/'▁' "
            f"with <0xNN> byte fallback)"
        )
    special = set(getattr(tok, "all_special_ids", []) or []) | set(getattr(tok, "added_tokens_decoder", {}) or {})
    out = {}
    for s, i in tok.get_vocab().items():
        if i in special or not 0 <= i < vocab_size:
            continue
        try:
            b = rule(s)
        except KeyError:
            raise TokenBytesError(f"{name}: token {i} {s!r} has a character outside the byte-level alphabet") from None
        if b:
            out[i] = b
    strips = False
    if verify:
        ids = [i for i, b in out.items() if utf8_text(b) is not None]
        texts = tok.batch_decode([[i] for i in ids], skip_special_tokens=True)
        for i, text in zip(ids, texts):
            want = out[i].decode("utf-8")
            if text != want:
                if want.startswith(" ") and text == want[1:]:
                    strips = True
                    continue
                raise TokenBytesError(
                    f"{name}: token {i} decodes to {text!r} but its derived bytes are {out[i]!r} (a decoder "
                    f"that rewrites text, e.g. clean_up_tokenization_spaces=True, cannot be constrained)"
                )
    cache[vocab_size, verify] = out, strips
    return out, strips


def utf8_text(b: bytes):
    """``b`` decoded as UTF-8, or None where it is not valid UTF-8 (a token cut inside a character)."""
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return None


STYLES = ("byte_level", "sentencepiece", "metaspace")


def train_tokenizer(text: str, vocab_size: int = 400, style: str = "byte_level"):
    """A small ``transformers`` tokenizer trained here on ``text`` (no download), with an EOS token.

    ``style``: ``"byte_level"`` (GPT-2/Llama 3/Qwen: BPE over GPT-2's byte alphabet, ByteLevel
    pre-tokenizer and decoder, EOS ``<|endoftext|>``); ``"sentencepiece"`` (Llama 2 as converted by
    ``transformers``: '▁' for spaces prepended to the text, 256 ``<0xNN>`` byte-fallback tokens, decoder
    Replace '▁'->' ' + ByteFallback + Fuse + Strip one leading space; ``<unk>``, ``<s>``, ``</s>``);
    ``"metaspace"`` (byte fallback with a Metaspace pre-tokenizer and decoder, prepend_scheme 'first',
    splitting at spaces as T5/ALBERT conversions do). ``vocab_size`` counts the learnt tokens (the byte
    tokens and specials come on top for the SentencePiece styles): ``len(tokenizer)`` is the model's
    vocabulary size to use."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    check_choice("style", style, STYLES)
    check_int("vocab_size", vocab_size, 300)
    if style == "byte_level":
        t = Tokenizer(models.BPE())
        t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        t.decoder = decoders.ByteLevel()
        alphabet = pre_tokenizers.ByteLevel.alphabet()
        t.train_from_iterator(
            [text],
            trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=alphabet),
        )
        return PreTrainedTokenizerFast(tokenizer_object=t, eos_token="<|endoftext|>")
    norm = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    t = Tokenizer(models.BPE())
    if style == "sentencepiece":
        t.normalizer = norm
    else:
        t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    t.train_from_iterator([text], trainers.BpeTrainer(vocab_size=vocab_size))
    spec = json.loads(t.to_str())["model"]
    specials = ["<unk>", "<s>", "</s>"]
    vocab = {s: i for i, s in enumerate(specials + [f"<0x{b:02X}>" for b in range(256)])}
    for s in sorted(spec["vocab"], key=spec["vocab"].get):
        vocab.setdefault(s, len(vocab))
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ")) for m in spec["merges"]]
    sp = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if style == "sentencepiece":
        sp.normalizer = norm
        steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    else:
        # split at '▁' (no token has one inside: tokenizers' Metaspace decoder drops every '▁' of the first token)
        sp.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
        steps = [decoders.ByteFallback(), decoders.Metaspace(replacement="▁", prepend_scheme="first")]
    sp.decoder = decoders.Sequence(steps)
    sp.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=sp, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
