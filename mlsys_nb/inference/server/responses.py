"""The server's answers in OpenAI's shapes, built from the engine's ``RequestOutput``s: pure functions and two
small classes that start no server (``tests/test_server_protocol.py`` tests them alone).

- ``completion_response``: the JSON of a finished request (``text_completion`` or ``chat.completion``), with
  ``completion_usage``; ``models_response`` for ``/v1/models``.
- ``StreamWriter``: the server-sent events of one streamed request (``data: {...}`` chunks, then ``DONE``).
  Each chunk holds the new part of the text decoded so far (*incremental detokenization*), holding back an
  unfinished UTF-8 character (decoded as U+FFFD) and the last ``len(stop) - 1`` characters while a stop string
  could still be completing (``visible_text``), so the deltas concatenate exactly to the non-streamed text;
  each chunk carries the logprobs of the tokens it adds.
- ``TokenText`` (a token's bytes and its name in a logprobs entry) and ``LogprobCursor`` (the logprobs of one
  choice, at once or chunk by chunk, with ``text_offset`` by incremental decoding).
- ``output_error``: the 500 of a request the engine failed, or whose structured answer fails its schema.
- ``sse``, ``error_event``, ``DONE``: the event wire format.
"""

from __future__ import annotations

import dataclasses
import json
import time

from .protocol import APIError

DONE = "data: [DONE]\n\n"  # the last event of every stream


def sse(obj: dict) -> str:
    """One server-sent event carrying ``obj`` as JSON."""
    return f"data: {json.dumps(obj)}\n\n"


def error_event(err: APIError) -> str:
    """The event that ends a stream whose request failed (the openai client raises it as an ``APIError``)."""
    return sse(err.body())


def visible_text(text: str, finished: bool, stops: list[str]) -> str:
    """The part of ``text`` that can be streamed now: all of it once finished; else without the last
    ``max(len(stop)) - 1`` characters (a stop string may be completing) and without a trailing U+FFFD (an
    unfinished UTF-8 character). A text shorter than that hold shows nothing yet."""
    if finished:
        return text
    hold = max((len(s) - 1 for s in stops), default=0)
    text = text[: max(0, len(text) - hold)] if hold else text
    return text.rstrip("\ufffd")


def completion_usage(out) -> dict:
    """OpenAI's ``usage`` of a ``RequestOutput``: prompt, completion (all choices) and total tokens."""
    n_out = sum(len(c.token_ids) for c in out.outputs)
    n_in = len(out.prompt_token_ids)
    return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}


def schema_failure(out, params) -> str | None:
    """Why a finished structured answer fails its JSON schema (the first choice that does), or None."""
    if params.json_schema is None:
        return None
    from ..structured import schema_errors

    for c in out.outputs:
        err = schema_errors(c.text, params.json_schema)
        if err:
            return f"choice {c.index}: the output failed its JSON schema ({err}); nothing is returned"
    return None


def output_error(out, params, prefix: str = "") -> APIError | None:
    """The 500 for ``out``: the engine failed the request (``prefix`` + its error), or it finished with an
    answer that fails its schema (``param`` response_format); None when it is good."""
    if out.error is not None:
        return APIError(500, prefix + out.error, type_="internal_error")
    if out.finished and (fail := schema_failure(out, params)):
        return APIError(500, fail, "response_format", type_="internal_error")
    return None


def models_response(model_name: str, created: int, max_model_len: int) -> dict:
    """``/v1/models``: the one model served, with its context length."""
    model = {"id": model_name, "object": "model", "created": created, "owned_by": "mlsys_nb"}
    return {"object": "list", "data": [{**model, "max_model_len": max_model_len}]}


def completion_response(rid: str, model_name: str, out, chat: bool, head: str = "", logprobs=None) -> dict:
    """The JSON of finished request ``rid``: one choice per sample (``head``, the echoed prompt, before each
    completion's text), ``logprobs[i]`` the choice's logprobs (``LogprobCursor.take``) or None, and usage."""
    choices = []
    for c, lp in zip(out.outputs, logprobs or [None] * len(out.outputs)):
        common = {"logprobs": lp, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
        if chat:
            choices.append({"index": c.index, "message": {"role": "assistant", "content": c.text}, **common})
        else:
            choices.append({"index": c.index, "text": head + c.text, **common})
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": completion_usage(out),
    }


class TokenText:
    """A token's exact bytes and its name in a logprobs entry, for one tokenizer (cached, up to 2^16 tokens).

    ``tokenizer``: a ``ByteTokenizer``, a ``transformers`` tokenizer or None; ``vocab``: the vocabulary size;
    ``decode(ids) -> str``: the engine's decoder, the fallback for a token without known bytes."""

    def __init__(self, tokenizer, vocab: int, decode):
        self.tokenizer, self.vocab, self.decode = tokenizer, vocab, decode
        self.cache: dict[int, bytes] = {}

    def bytes_of(self, t: int) -> bytes:
        """Token ``t``'s bytes (b"" for the byte tokenizer's end of sequence and unused ids)."""
        if t in self.cache:
            return self.cache[t]
        from ..tokenizer import ByteTokenizer, token_bytes

        if isinstance(self.tokenizer, ByteTokenizer):
            b = bytes([t]) if t < 256 else b""
        else:
            try:
                b = token_bytes(self.tokenizer, self.vocab)[0].get(t)
            except ValueError:
                b = None
            b = self.decode([t]).encode() if b is None else b
        if len(self.cache) < 2**16:
            self.cache[t] = b
        return b

    def name(self, t: int) -> str:
        """A token as text: its UTF-8, ``bytes:\\xNN`` for part of a character, ``token_id:N`` for a token
        without text (end of sequence, unused ids), so that no two tokens of a top-k share a key."""
        b = self.bytes_of(t)
        if not b:
            return f"token_id:{t}"
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: vLLM's convention
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)


class LogprobCursor:
    """The logprobs of one choice in OpenAI's shapes, at once or chunk by chunk (``take`` returns those of the
    tokens not taken yet). Completions' ``text_offset`` counts characters from ``base`` (the echoed prompt's
    length) by incremental decoding, so offsets match the streamed text."""

    def __init__(self, token_text: TokenText, base: int = 0):
        from ..tokenizer import decode_stream

        self.token_text, self.sent, self.offset = token_text, 0, base
        tok = token_text.tokenizer
        self.detok = decode_stream(tok) if tok is not None else None

    def take(self, c, k: int, chat: bool, upto: int | None = None) -> dict | None:
        """Logprobs of ``c``'s (a ``CompletionOutput``) tokens from the last ``take`` up to ``upto`` (None: all):
        chat's ``{"content": [...]}`` with ``k`` top entries each, or completions' four lists; None without logprobs."""
        if c.logprobs is None:
            return None
        upto = len(c.token_ids) if upto is None else upto
        toks, entries = c.token_ids[self.sent : upto], c.logprobs[self.sent : upto]
        self.sent = upto
        if chat:
            return {"content": [self.chat_entry(t, e, k) for t, e in zip(toks, entries)]}
        offsets = []
        for t in toks:
            offsets.append(self.offset)
            if self.detok is not None:
                self.offset += len(self.detok.step(t))
        name = self.token_text.name
        return {
            "tokens": [name(t) for t in toks],
            "token_logprobs": [e[t].logprob for t, e in zip(toks, entries)],
            "top_logprobs": [{name(tid): lp.logprob for tid, lp in e.items()} for e in entries],
            "text_offset": offsets,
        }

    def chat_entry(self, t: int, entry: dict, k: int) -> dict:
        """Chat's entry of sampled token ``t``: token, logprob, bytes, and its top ``k`` (``entry``: id -> Logprob)."""
        name, raw = self.token_text.name, self.token_text.bytes_of
        top = sorted((lp.rank, tid, lp.logprob) for tid, lp in entry.items() if lp.rank <= k)
        return {
            "token": name(t),
            "logprob": entry[t].logprob,
            "bytes": list(raw(t)),
            "top_logprobs": [{"token": name(tid), "logprob": lp, "bytes": list(raw(tid))} for _, tid, lp in top],
        }


@dataclasses.dataclass
class StreamWriter:
    """The events of one streamed request ``rid``: ``opening()``, then ``deltas(out)`` for every output, then
    ``usage(out)`` if ``include_usage``. ``n`` samples, ``stops`` its stop strings, ``k`` top logprobs per token
    (None: no logprobs), ``head`` the echoed prompt (completions' ``echo``)."""

    rid: str
    model_name: str
    chat: bool
    n: int
    token_text: TokenText
    stops: list = dataclasses.field(default_factory=list)
    k: int | None = None
    head: str = ""
    include_usage: bool = False

    def __post_init__(self):
        self.sent = [""] * self.n  # the text streamed so far, per choice
        self.cursors = [LogprobCursor(self.token_text, len(self.head)) for _ in range(self.n)]

    @property
    def kind(self) -> str:
        return "chat.completion.chunk" if self.chat else "text_completion"

    def chunk(self, index: int, text: str, finish=None, role=False, lp=None, stop_reason=None) -> str:
        """One choice's event: its new ``text`` (chat: a ``delta``; ``role`` opens it), logprobs, finish reason."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
            choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
        if finish is not None:
            choice["stop_reason"] = stop_reason
        body = {"id": self.rid, "object": self.kind, "created": int(time.time()), "model": self.model_name}
        body["choices"] = [choice]
        if self.include_usage:
            body["usage"] = None
        return sse(body)

    def opening(self) -> list[str]:
        """The first events: chat's assistant role per choice, or the echoed prompt per choice."""
        if self.chat:
            return [self.chunk(i, "", role=True) for i in range(self.n)]
        return [self.chunk(i, self.head) for i in range(self.n)] if self.head else []

    def deltas(self, out) -> list[str]:
        """The events for ``out``: each choice whose visible text grew, or that finished."""
        events = []
        for c in out.outputs:
            text = visible_text(c.text, c.finish_reason is not None, self.stops)
            if len(text) > len(self.sent[c.index]) or c.finish_reason is not None:
                delta, self.sent[c.index] = text[len(self.sent[c.index]) :], text
                lp = self.cursors[c.index].take(c, self.k or 0, self.chat)
                events.append(self.chunk(c.index, delta, c.finish_reason, lp=lp, stop_reason=c.stop_reason))
        return events

    def usage(self, out) -> str:
        """The last data event with ``stream_options.include_usage``: no choices, the usage."""
        body = {"id": self.rid, "object": self.kind, "created": int(time.time()), "model": self.model_name}
        return sse({**body, "choices": [], "usage": completion_usage(out)})
