"""The server's protocol: OpenAI's request fields checked into the engine's parameters, as pure functions.

Nothing here starts a server or touches the engine: each function takes the parsed JSON body (a dict) or
one of its values and returns what the engine needs, or raises ``APIError`` (an HTTP status, a message and
``param``, the field it names). ``routes`` calls them; ``tests/test_server_protocol.py`` tests them alone.

- ``HONOURED`` / ``REFUSED``: the fields each endpoint honours or refuses; ``check_fields`` applies them (an
  unknown field is refused too, as OpenAI does).
- ``Limits``: what one request may ask (samples, logprobs, stop strings, prompt and body bytes, waiting
  requests); ``check_content_length``, ``check_prompt_size``, ``queue_full`` (the 429), ``retry_after_seconds``.
- ``decode_body`` (bytes -> the JSON object; 400 when malformed or nested too deeply), ``check_model`` (404).
- ``parse_sampling(body, chat, limits, vocab)`` -> ``(SamplingParams, options)``: every sampling field with
  strict types (``"stream": "false"`` is a 400) and ranges, and the combinations refused; the field parsers
  ``int_field``, ``number_field``, ``bool_field``, ``str_field`` each raise ``bad_value`` naming the field.
- ``parse_prompt`` (completions), ``parse_messages`` and ``chat_prompt`` (chat).
"""

from __future__ import annotations

import dataclasses
import json
import math

from ...config import check_int, check_number
from ..sampling_params import SamplingParams

# the request fields each endpoint honours (``/v1/completions`` and ``/v1/chat/completions``)
COMMON_FIELDS = (
    "model max_tokens temperature top_p top_k min_p n seed stop stop_token_ids ignore_eos presence_penalty "
    "frequency_penalty repetition_penalty logit_bias min_tokens stream stream_options user response_format regex choice"
).split()
HONOURED = {
    "completions": tuple(COMMON_FIELDS + ["prompt", "logprobs", "echo", "best_of"]),
    "chat": tuple(COMMON_FIELDS + ["messages", "logprobs", "top_logprobs", "max_completion_tokens"]),
}
# known OpenAI fields this server cannot honour: a non-null value is a 400 naming the field
REFUSED = {
    "completions": {"suffix": "inserting text (suffix) is not supported"},
    "chat": {
        **{
            f: "tool and function calling is not supported"
            for f in ("tools", "tool_choice", "functions", "function_call", "parallel_tool_calls")
        },
        "audio": "audio output is not supported",
        "modalities": "only text output is supported",
        "prediction": "predicted outputs are not supported",
        "reasoning_effort": "this model does not reason",
        "web_search_options": "web search is not supported",
        "service_tier": "service tiers are not supported",
        "store": "stored completions are not supported",
        "metadata": "stored completions (metadata) are not supported",
    },
}
MESSAGE_ROLES = ("system", "developer", "user", "assistant")
FLOAT_FIELDS = ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty")
INT_FIELDS = (("top_k", -1), ("min_tokens", 0), ("seed", None))  # (field, lowest value or None)
RESPONSE_FORMATS = (
    "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
    "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}"
)


@dataclasses.dataclass
class Limits:
    """What one request may ask: ``max_n`` samples, ``max_logprobs`` top log-probabilities,
    ``max_stop`` stop strings, ``max_prompt_bytes`` of prompt text (UTF-8; None: 64 x the context, at
    least 64 KiB), ``max_request_bytes`` of body (413 beyond); ``max_waiting_requests`` waiting at once
    (429 beyond). ``max_grammar_states`` is the engine's (``LLMEngine(max_grammar_states=...)``)."""

    max_n: int = 64
    max_logprobs: int = 20
    max_stop: int = 16
    max_prompt_bytes: int | None = None
    max_request_bytes: int = 32 * 2**20
    max_waiting_requests: int = 256

    def prompt_bytes(self, max_model_len: int) -> int:
        """``max_prompt_bytes``, or its default for a context of ``max_model_len`` tokens."""
        return self.max_prompt_bytes or max(2**16, 64 * max_model_len)


class APIError(Exception):
    """An OpenAI-style error: HTTP ``status``, ``message``, ``param`` (the field at fault, or None), ``type_``,
    ``code`` and extra response ``headers``; ``body()`` is the JSON ``{"error": {...}}``."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code
        self.headers = headers

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def retry_after_seconds(waiting: int, left_times, now: float, window: float = 10.0, lo: int = 1, hi: int = 60) -> int:
    """Seconds a client refused with 429 should wait (``Retry-After``): the time the ``waiting`` requests
    ahead of it need to drain at the recent rate, ``ceil(waiting / rate)`` with ``rate`` = requests that left
    the engine (finished, failed or aborted) in the last ``window`` seconds / ``window`` (requests/s;
    ``left_times`` in seconds on the clock of ``now``), clamped to [``lo``, ``hi``]; ``hi`` when none left
    in the window. A model of the wait, not a promise: the rate changes."""
    check_number("window", window, 0, lo_open=True, unit="seconds")
    check_int("hi", hi, check_int("lo", lo, 1))
    rate = sum(1 for t in left_times if now - window <= t <= now) / window
    if rate == 0:
        return hi
    return int(min(hi, max(lo, math.ceil(waiting / rate))))


def queue_full(max_waiting_requests: int, retry_after: int) -> APIError:
    """The 429 of a request refused because ``max_waiting_requests`` already wait (``Retry-After`` seconds)."""
    return APIError(
        429,
        f"too many requests waiting (max_waiting_requests={max_waiting_requests}); retry later",
        type_="rate_limit_error",
        code="queue_full",
        headers={"Retry-After": str(retry_after)},
    )


# ---- the body --------------------------------------------------------------------------------------------
def check_content_length(size: str | None, max_request_bytes: int) -> None:
    """413 when the ``content-length`` header (a string, or None) announces more than ``max_request_bytes``."""
    if size is not None and size.isdigit() and int(size) > max_request_bytes:
        raise APIError(413, f"the body has {size} bytes, above max_request_bytes={max_request_bytes}")


def decode_body(raw: bytes) -> dict:
    """The request's JSON object; 400 when it is malformed, nested too deeply or not an object."""
    try:
        body = json.loads(raw)
    except RecursionError:
        raise APIError(400, "malformed JSON body: nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
        raise APIError(400, f"malformed JSON body: {e}") from None
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    return body


def check_model(body: dict, model_name: str) -> dict:
    """``body``, or 404 (``model_not_found``) when it asks for a model other than ``model_name``."""
    if body.get("model") not in (model_name, None):
        raise APIError(
            404,
            f"The model `{body.get('model')}` does not exist (served: {model_name!r}).",
            "model",
            code="model_not_found",
        )
    return body


def check_fields(body: dict, kind: str) -> dict:
    """The non-null fields of ``body``, each honoured or refused (400 naming it); ``kind``: "completions" or "chat"."""
    for field, value in body.items():
        if field in REFUSED[kind] and value is not None:
            raise APIError(400, f"{field}: {REFUSED[kind][field]} by this server", field)
        if field not in HONOURED[kind] and field not in REFUSED[kind]:
            raise APIError(400, f"Unrecognized request argument supplied: {field}", field)
    return {k: v for k, v in body.items() if v is not None and k in HONOURED[kind]}


# ---- strict field parsers: each returns the value or raises a 400 naming the field -----------------------
def bad_value(field: str, allowed: str, value) -> APIError:
    """The 400 for ``field=value``: ``allowed`` says what it must be (the value shown up to 80 characters)."""
    shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
    return APIError(400, f"{field}={shown}: {allowed}", field)


def int_field(body: dict, field: str, lo: int | None = None, hi: int | None = None) -> int:
    """``body[field]``, an integer (not a boolean) in [``lo``, ``hi``] (either bound may be None)."""
    v = body[field]
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}" if lo is not None else ""
        raise bad_value(field, f"must be an integer {rng}".strip(), v)
    return v


def number_field(body: dict, field: str) -> float:
    """``body[field]``, a finite number (not a boolean); its range is ``SamplingParams``' to check."""
    v = body[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise bad_value(field, "must be a finite number", v)
    return v


def bool_field(body: dict, field: str) -> bool:
    """``body[field]``, a JSON boolean (``"false"`` is refused)."""
    if not isinstance(body[field], bool):
        raise bad_value(field, "must be true or false (a JSON boolean)", body[field])
    return body[field]


def str_field(body: dict, field: str) -> str:
    """``body[field]``, a string."""
    if not isinstance(body[field], str):
        raise bad_value(field, "must be a string", body[field])
    return body[field]


# ---- the sampling fields -----------------------------------------------------------------------------------
def parse_sampling(body: dict, chat: bool, limits: Limits, vocab: int) -> tuple[SamplingParams, dict]:
    """``SamplingParams`` from the checked fields of ``body`` (``check_fields``), and the server-side options
    ``{"stream", "echo", "include_usage"}``. ``vocab``: the vocabulary size (token ids are in [0, vocab)).
    Fields are checked in a fixed order; the first bad one is the 400's ``param``."""
    kw = numeric_fields(body, limits)
    kw.update(stop_fields(body, limits, vocab))
    kw.update(logprob_fields(body, chat, limits))
    kw.update(structured_fields(body))
    if kw.get("json_schema") is not None or "regex" in kw or "choice" in kw:
        for f in ("stop", "stop_token_ids"):
            if f in kw:
                raise bad_value(f, "cannot be combined with a structured output (it could cut the match)", kw[f])
    opts = server_options(body, logprobs="logprobs" in kw)
    try:
        return SamplingParams(**kw), opts
    except ValueError as e:
        raise APIError(400, str(e), param_name(getattr(e, "param", None), chat)) from None


def numeric_fields(body: dict, limits: Limits) -> dict:
    """The float and integer fields, ``n`` (<= ``limits.max_n``), ``best_of`` (only = n) and ``max_tokens``
    (``max_completion_tokens`` in chat; None: the rest of the context)."""
    kw: dict = {f: number_field(body, f) for f in FLOAT_FIELDS if f in body}
    kw.update({f: int_field(body, f, lo) for f, lo in INT_FIELDS if f in body})
    if "n" in body:
        kw["n"] = int_field(body, "n", 1, limits.max_n)
    if "best_of" in body and int_field(body, "best_of", 1) != kw.get("n", 1):
        raise bad_value(
            "best_of", f"must equal n={kw.get('n', 1)} (ranking extra samples is not supported)", body["best_of"]
        )
    max_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
    kw["max_tokens"] = int_field(body, max_field, 1) if max_field in body else None  # completions: <= 16 later
    return kw


def stop_fields(body: dict, limits: Limits, vocab: int) -> dict:
    """``stop`` (a string or <= ``limits.max_stop`` strings), ``stop_token_ids``, ``ignore_eos``, ``logit_bias``."""
    kw: dict = {}
    if "stop" in body:
        stop = body["stop"]
        if not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
            raise bad_value("stop", "must be a string or a list of strings", stop)
        if isinstance(stop, list) and len(stop) > limits.max_stop:
            raise bad_value("stop", f"at most max_stop={limits.max_stop} strings", stop)
        kw["stop"] = stop
    if "stop_token_ids" in body:
        ids = body["stop_token_ids"]
        if not isinstance(ids, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
        ):
            raise bad_value("stop_token_ids", f"must be a list of token ids in [0, {vocab})", ids)
        kw["stop_token_ids"] = ids
    if "ignore_eos" in body:
        kw["ignore_eos"] = bool_field(body, "ignore_eos")
    if "logit_bias" in body:
        kw["logit_bias"] = parse_logit_bias(body["logit_bias"], vocab)
    return kw


def parse_logit_bias(lb, vocab: int) -> dict[int, float]:
    """OpenAI's ``logit_bias`` ``{"token id": bias}`` -> ``{id: bias}``: ids in [0, vocab), biases in [-100, 100]."""
    if not isinstance(lb, dict):
        raise bad_value("logit_bias", "must be an object {token id: bias in [-100, 100]}", lb)
    for k, v in lb.items():
        if not k.lstrip("-").isdigit() or not 0 <= int(k) < vocab:
            raise bad_value("logit_bias", f"key {k!r}: token ids must be in [0, {vocab})", lb)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
            raise bad_value("logit_bias", f"value of {k!r}: a number in [-100, 100]", lb)
    return {int(k): v for k, v in lb.items()}


def logprob_fields(body: dict, chat: bool, limits: Limits) -> dict:
    """Completions: ``logprobs`` = how many top log-probabilities (0 to ``limits.max_logprobs``). Chat:
    ``logprobs`` true/false and ``top_logprobs`` (0 to ``max_logprobs``, only with ``logprobs=true``)."""
    if not chat:
        return {"logprobs": int_field(body, "logprobs", 0, limits.max_logprobs)} if "logprobs" in body else {}
    if "top_logprobs" in body:
        int_field(body, "top_logprobs", 0, limits.max_logprobs)
        if body.get("logprobs") is not True:
            raise bad_value("top_logprobs", "needs logprobs=true", body["top_logprobs"])
    if "logprobs" in body and bool_field(body, "logprobs"):
        return {"logprobs": body.get("top_logprobs", 0)}
    return {}


def structured_fields(body: dict) -> dict:
    """``regex``, ``choice`` and OpenAI's ``response_format`` (text, json_object, or json_schema with its schema)
    as ``SamplingParams``' ``regex``, ``choice``, ``json_schema``."""
    kw: dict = {}
    if "regex" in body:
        kw["regex"] = str_field(body, "regex")
    if "choice" in body:
        kw["choice"] = body["choice"]
    fmt = body.get("response_format")
    if fmt is not None:  # OpenAI's structured outputs: {"type": "json_schema", "json_schema": {"schema": ...}}
        kind = fmt.get("type") if isinstance(fmt, dict) else None
        spec = fmt.get("json_schema") if isinstance(fmt, dict) else None
        if kind == "json_schema" and isinstance(spec, dict) and isinstance(spec.get("schema"), dict):
            kw["json_schema"] = spec["schema"]
        elif kind == "json_object":
            kw["json_schema"] = {"type": "object"}
        elif kind != "text":
            raise APIError(400, RESPONSE_FORMATS, "response_format")
    return kw


def server_options(body: dict, logprobs: bool) -> dict:
    """``{"stream", "echo", "include_usage"}``: what the server does with the output. ``echo`` is refused with
    ``logprobs`` (prompt logprobs are not computed), ``stream_options`` without ``stream``; ``user`` is checked
    (a string) and ignored."""
    opts = {"stream": bool_field(body, "stream") if "stream" in body else False}
    opts["echo"] = bool_field(body, "echo") if "echo" in body else False
    if opts["echo"] and logprobs:
        raise bad_value("echo", "cannot be combined with logprobs (prompt logprobs are not computed)", True)
    so = body.get("stream_options")
    if so is not None:
        if not opts["stream"]:
            raise bad_value("stream_options", "is only allowed with stream=true", so)
        if not isinstance(so, dict) or set(so) - {"include_usage"}:
            raise bad_value("stream_options", "must be {'include_usage': bool} (other options are refused)", so)
        if "include_usage" in so:
            bool_field(so, "include_usage")
    opts["include_usage"] = bool(so and so.get("include_usage"))
    if "user" in body:
        str_field(body, "user")  # accepted (an end-user id for the caller's records); no effect here
    return opts


def param_name(param: str | None, chat: bool) -> str | None:
    """The request field behind a ``SamplingParams`` / ``LLMEngine.prepare`` parameter (its ``ValueError.param``)."""
    names = {"json_schema": "response_format", "prompt": "messages" if chat else "prompt"}
    if chat:
        names["logprobs"] = "top_logprobs"
    return names.get(param, param)


# ---- prompts -----------------------------------------------------------------------------------------------
def parse_prompt(prompt, max_model_len: int) -> str | list[int]:
    """A completions ``prompt``: one string or one list of token ids (a list holding one of them is unwrapped);
    a token list longer than ``max_model_len`` is a 400."""
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, list) and len(prompt) > max_model_len:
        raise APIError(400, f"prompt of {len(prompt)} tokens is too long: max_model_len={max_model_len}", "prompt")
    if not (
        isinstance(prompt, str)
        or (isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
    ):
        raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
    return prompt


def parse_messages(msgs) -> list[dict]:
    """Chat ``messages`` -> ``[{"role", "content"}]``: roles in ``MESSAGE_ROLES``, content a string or text parts
    (joined); the 400 names the message and key (``messages[1].role``)."""
    if not isinstance(msgs, list) or not msgs:
        raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
    clean = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise APIError(400, f"messages[{i}] must be an object {{role, content}}", f"messages[{i}]")
        for key in m:
            if key not in ("role", "content", "name"):
                raise APIError(400, f"messages[{i}].{key} is not supported", f"messages[{i}].{key}")
        if m.get("role") not in MESSAGE_ROLES:
            raise APIError(400, f"messages[{i}].role must be one of {MESSAGE_ROLES}", f"messages[{i}].role")
        clean.append({"role": m["role"], "content": message_content(m.get("content"), i)})
    return clean


def message_content(content, i: int) -> str:
    """Message ``i``'s content: a string, or a list of ``{"type": "text", "text": ...}`` parts joined."""
    if isinstance(content, list):  # content parts: text only
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise APIError(400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content")
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise APIError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
    return content


def chat_prompt(messages: list[dict], tokenizer) -> str:
    """The prompt text of ``messages``: the tokenizer's chat template if it has one, else ``<|role|>`` lines."""
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


def check_prompt_size(text: str, field: str, max_prompt_bytes: int, max_model_len: int) -> None:
    """400 naming ``field`` when ``text`` has more than ``max_prompt_bytes`` bytes of UTF-8 (checked before
    tokenising; ``max_model_len``, the context in tokens, is only quoted)."""
    if len(text) > max_prompt_bytes or len(text.encode("utf-8", "surrogatepass")) > max_prompt_bytes:
        raise APIError(
            400,
            f"{field} has more than max_prompt_bytes={max_prompt_bytes} bytes of text (the context is "
            f"{max_model_len} tokens)",
            field,
        )
