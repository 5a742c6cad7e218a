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


class ByteTokenizer:
    """UTF-8 bytes as token ids (0-255) plus an end-of-sequence id 256 if ``vocab_size > 256``."""

    n_bytes = 256

    def __init__(self, vocab_size: int = 257):
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 256:
            raise ValueError(f"vocab_size={vocab_size!r} is out of range: a byte tokenizer needs >= 256")
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
