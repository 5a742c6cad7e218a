"""The server's protocol and response builders (``mlsys_nb.inference.server.protocol`` / ``responses``) tested
alone: no server, no engine, no model. Every request field's bad values are refused with a 400 whose ``param``
names the field; the builders give OpenAI's shapes; the stream's deltas concatenate to the final text.
Also the size of the server's code: an AST scan keeps every function <= 60 lines, every route handler <= 30
and every file <= 500 (issue 48: ``build_app`` was one 535-line closure)."""

import ast
import json
from pathlib import Path

import pytest

from mlsys_nb.inference.sampling_params import SamplingParams
from mlsys_nb.inference.sequence import CompletionOutput, Logprob, RequestOutput
from mlsys_nb.inference.server.protocol import (
    HONOURED,
    REFUSED,
    APIError,
    Limits,
    chat_prompt,
    check_content_length,
    check_fields,
    check_model,
    check_prompt_size,
    decode_body,
    param_name,
    parse_messages,
    parse_prompt,
    parse_sampling,
    queue_full,
)
from mlsys_nb.inference.server.responses import (
    DONE,
    LogprobCursor,
    StreamWriter,
    TokenText,
    completion_response,
    completion_usage,
    models_response,
    output_error,
    visible_text,
)
from mlsys_nb.inference.tokenizer import ByteTokenizer

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "mlsys_nb" / "inference" / "server"
VOCAB = 300
LIMITS = Limits()


def refused(fn, *args) -> APIError:
    with pytest.raises(APIError) as e:
        fn(*args)
    return e.value


def sampling(body: dict, chat: bool = False):
    return parse_sampling(body, chat, LIMITS, VOCAB)


# ---- the size of the server's code ---------------------------------------------------------------------------
ROUTE_DECORATORS = {"get", "post", "put", "delete", "patch", "api_route"}


def test_server_functions_routes_and_files_stay_short():
    """No function in inference/server/ or serve.py over 60 lines, no route handler over 30, no file over 500.
    Catches a route handler that grows back into a closure over the whole server."""
    files = sorted(SERVER.glob("*.py")) + [SERVER.parent / "serve.py"]
    long_files, long_funcs, long_routes, routes = [], [], [], []
    for path in files:
        text = path.read_text()
        if len(text.splitlines()) > 500:
            long_files.append(f"{path.name}: {len(text.splitlines())} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            n = node.end_lineno - node.lineno + 1
            if n > 60:
                long_funcs.append(f"{path.name}:{node.lineno} {node.name}: {n} lines")
            route = any(
                isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr in ROUTE_DECORATORS
                for d in node.decorator_list
            )
            if route:
                routes.append(node.name)
                if n > 30:
                    long_routes.append(f"{path.name}:{node.lineno} {node.name}: {n} lines")
    assert not long_files and not long_funcs and not long_routes, (long_files, long_funcs, long_routes)
    assert {"health", "models", "metrics", "completions", "chat_completions"} <= set(routes), routes


# ---- fields, body, prompts -------------------------------------------------------------------------------------
def test_fields_are_honoured_refused_or_unknown():
    assert check_fields({"prompt": "x", "max_tokens": None, "suffix": None}, "completions") == {"prompt": "x"}
    assert refused(check_fields, {"suffix": "x"}, "completions").param == "suffix"
    for field in REFUSED["chat"]:
        e = refused(check_fields, {field: [1]}, "chat")
        assert (e.status, e.param) == (400, field) and REFUSED["chat"][field] in e.message
    e = refused(check_fields, {"prompt": "x", "frobnicate": 1}, "completions")
    assert e.param == "frobnicate" and "Unrecognized" in e.message
    assert refused(check_fields, {"messages": []}, "completions").param == "messages"  # a chat field
    assert set(HONOURED["chat"]) - set(HONOURED["completions"]) >= {"messages", "top_logprobs"}


# (field, bad value, chat): each must be a 400 naming the field (extra fields in EXTRA make the case complete)
BAD = [
    ("temperature", "1", False),
    ("temperature", True, False),
    ("temperature", float("nan"), False),
    ("temperature", -1, False),  # SamplingParams' range
    ("top_p", 2, False),
    ("top_p", "0.5", False),
    ("top_k", 1.5, False),
    ("top_k", -2, False),
    ("min_p", 1.5, False),
    ("presence_penalty", 3, False),
    ("frequency_penalty", "0", False),
    ("repetition_penalty", 0, False),
    ("min_tokens", -1, False),
    ("seed", 1.5, False),
    ("seed", 2**64, False),
    ("n", 0, False),
    ("n", 65, False),  # above Limits.max_n
    ("best_of", 2, False),  # != n
    ("max_tokens", 0, False),
    ("max_tokens", "16", False),
    ("max_completion_tokens", 0, True),
    ("stop", 5, False),
    ("stop", ["a"] * 17, False),  # above Limits.max_stop
    ("stop", ["a", 1], False),
    ("stop_token_ids", [VOCAB], False),
    ("stop_token_ids", [True], False),
    ("stop_token_ids", "1", False),
    ("ignore_eos", "true", False),
    ("logit_bias", [1], False),
    ("logit_bias", {"x": 1}, False),
    ("logit_bias", {str(VOCAB): 1}, False),
    ("logit_bias", {"1": 101}, False),
    ("logit_bias", {"1": True}, False),
    ("logprobs", 21, False),  # above Limits.max_logprobs
    ("logprobs", -1, False),
    ("logprobs", "true", True),
    ("top_logprobs", 21, True),
    ("regex", 5, False),
    ("regex", "", False),
    ("choice", "yes", False),
    ("choice", [], True),
    ("response_format", {"type": "xml"}, False),
    ("response_format", "json", True),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x"}}, True),
    ("stream", "false", False),
    ("echo", "yes", False),
    ("stream_options", {"include_usage": True}, False),  # without stream
    ("user", 5, True),
]
EXTRA = {"stream_options": {}, "top_logprobs": {"logprobs": True}}


@pytest.mark.parametrize(("field", "value", "chat"), BAD, ids=[f"{f}={v!r}" for f, v, _ in BAD])
def test_each_bad_field_value_is_a_400_naming_the_field(field, value, chat):
    """Catches a parser that accepts a wrong type or range, or names another field (or none) in ``param``."""
    e = refused(sampling, {**EXTRA.get(field, {}), field: value}, chat)
    assert (e.status, e.param) == (400, field), e.message
    assert field in e.message, e.message


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"top_logprobs": 2}, "top_logprobs"),  # needs logprobs=true
        ({"logprobs": False, "top_logprobs": 2}, "top_logprobs"),
        ({"regex": "a+", "stop": "x"}, "stop"),  # a stop could cut the match
        ({"response_format": {"type": "json_object"}, "stop_token_ids": [1]}, "stop_token_ids"),
        ({"regex": "a+", "choice": ["a"]}, "choice"),  # at most one grammar
        ({"stream": True, "stream_options": {"include_usage": True, "x": 1}}, "stream_options"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "include_usage"),
        ({"min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ],
)
def test_refused_combinations_name_the_field(body, param):
    chat = "top_logprobs" in body
    assert refused(sampling, body, chat).param == param


def test_echo_with_logprobs_is_refused_in_completions():
    assert refused(sampling, {"echo": True, "logprobs": 1}).param == "echo"


def test_good_fields_become_sampling_params_and_options():
    body = {
        "temperature": 0,
        "top_p": 0.5,
        "top_k": 4,
        "n": 2,
        "best_of": 2,
        "seed": 7,
        "max_tokens": 9,
        "stop": "END",
        "stop_token_ids": [3],
        "ignore_eos": True,
        "logit_bias": {"5": -100},
        "logprobs": 3,
        "echo": True,
        "stream": True,
        "stream_options": {"include_usage": True},
        "user": "u1",
    }
    body.pop("echo")  # echo and logprobs do not mix
    params, opts = sampling(body)
    want = dict(top_p=0.5, top_k=4, n=2, seed=7, max_tokens=9, stop="END", stop_token_ids=[3], ignore_eos=True)
    assert params == SamplingParams(temperature=0, logit_bias={5: -100}, logprobs=3, **want)
    assert opts == {"stream": True, "echo": False, "include_usage": True}
    params, opts = sampling({"max_completion_tokens": 5, "logprobs": True, "top_logprobs": 2}, chat=True)
    assert (params.max_tokens, params.logprobs) == (5, 2) and opts["stream"] is False
    assert sampling({})[0].max_tokens is None  # the rest of the context (completions: 16, after prepare)
    fmt = {"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "string"}}}
    assert sampling({"response_format": fmt})[0].json_schema == {"type": "string"}
    assert sampling({"response_format": {"type": "json_object"}})[0].json_schema == {"type": "object"}
    assert sampling({"response_format": {"type": "text"}})[0].json_schema is None


def test_engine_parameters_map_to_request_fields():
    assert param_name("json_schema", False) == "response_format"
    assert (param_name("prompt", False), param_name("prompt", True)) == ("prompt", "messages")
    assert (param_name("logprobs", False), param_name("logprobs", True)) == ("logprobs", "top_logprobs")
    assert param_name("seed", True) == "seed" and param_name(None, True) is None


def test_body_checks():
    assert decode_body(b'{"prompt": "x"}') == {"prompt": "x"}
    for raw, words in [(b"{", "malformed"), (b"[" * 100_000 + b"]" * 100_000, "nested"), (b"[1]", "JSON object")]:
        e = refused(decode_body, raw)
        assert e.status == 400 and words in e.message and e.param is None
    assert refused(decode_body, b"\xff").status == 400  # not UTF-8
    assert check_model({"model": "tiny"}, "tiny") == {"model": "tiny"} and check_model({}, "tiny") == {}
    e = refused(check_model, {"model": "gpt-4"}, "tiny")
    assert (e.status, e.param, e.code) == (404, "model", "model_not_found")
    for size in (None, "10", "x"):
        check_content_length(size, 10)  # no header, at the limit, not a number: read and counted instead
    assert refused(check_content_length, "11", 10).status == 413
    e = queue_full(256, 7)
    assert (e.status, e.type, e.code, e.headers) == (429, "rate_limit_error", "queue_full", {"Retry-After": "7"})
    assert "max_waiting_requests=256" in e.message
    assert e.body() == {"error": {"message": e.message, "type": e.type, "param": None, "code": "queue_full"}}


def test_prompts_and_messages():
    assert parse_prompt("hi", 8) == "hi" and parse_prompt(["hi"], 8) == "hi" and parse_prompt([[1, 2]], 8) == [1, 2]
    for bad in (None, 5, [1, True], ["a", "b"], [1.5], list(range(9))):
        assert refused(parse_prompt, bad, 8).param == "prompt", bad
    assert "max_model_len=8" in refused(parse_prompt, list(range(9)), 8).message
    parts = [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    assert parse_messages([{"role": "user", "content": parts, "name": "x"}]) == [{"role": "user", "content": "ab"}]
    for msgs, param in [
        (None, "messages"),
        ([], "messages"),
        (["hi"], "messages[0]"),
        ([{"role": "user", "content": "a"}, {"role": "tool", "content": "b"}], "messages[1].role"),
        ([{"role": "user", "content": "a", "tool_calls": []}], "messages[0].tool_calls"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": "x"}]}], "messages[0].content"),
        ([{"role": "user", "content": 5}], "messages[0].content"),
        ([{"role": "user"}], "messages[0].content"),
    ]:
        assert refused(parse_messages, msgs).param == param, msgs
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    assert chat_prompt(msgs, None) == "<|system|>\nbe brief\n<|user|>\nhi\n<|assistant|>\n"
    check_prompt_size("é" * 5, "prompt", 10, 4)
    e = refused(check_prompt_size, "é" * 6, "messages", 10, 4)  # 12 bytes of UTF-8 in 6 characters
    assert e.param == "messages" and "max_prompt_bytes=10" in e.message
    assert Limits().prompt_bytes(8) == 2**16 and Limits().prompt_bytes(2048) == 64 * 2048
    assert Limits(max_prompt_bytes=5).prompt_bytes(2048) == 5


# ---- responses ------------------------------------------------------------------------------------------------
def output(texts, finished=True, reason="length", logprobs=None, error=None, ids=None):
    outs = [
        CompletionOutput(i, t, list(ids or t.encode()), None, logprobs, reason if finished else None)
        for i, t in enumerate(texts)
    ]
    return RequestOutput("r1", "p", [1, 2, 3], outs, finished, error=error)


def events(chunks) -> list[dict]:
    assert all(c.startswith("data: ") and c.endswith("\n\n") for c in chunks)
    return [json.loads(c[6:]) for c in chunks if c != DONE]


def test_visible_text_holds_back_partial_characters_and_stop_prefixes():
    assert visible_text("hello wor", False, ["world!"]) == "hell"  # 5 characters could start "world!"
    assert visible_text("hello wor", True, ["world!"]) == "hello wor"
    assert visible_text("ab\ufffd", False, []) == "ab"  # an unfinished UTF-8 character
    assert visible_text("abc", False, ["x"]) == "abc"
    # a text shorter than the hold: nothing yet ("xa" would be streamed, then "abcde" end it at "x")
    assert visible_text("xab", False, ["abcde"]) == ""


def test_a_stream_of_deltas_concatenates_to_the_final_text():
    """Catches deltas that resend or drop text, a finish chunk without stop_reason, or a missing usage chunk."""
    tt = TokenText(ByteTokenizer(), VOCAB, None)
    w = StreamWriter("r1", "tiny", False, 1, tt, stops=["STOP"], include_usage=True)
    steps = ["ab", "abcST", "abcSTO", "abcSTOx", "abcSTOxy\ufffd", "abcSTOxyz"]
    chunks = [c for i, t in enumerate(steps) for c in w.deltas(output([t], finished=i == len(steps) - 1))]
    body = events(chunks)
    assert "".join(e["choices"][0]["text"] for e in body) == "abcSTOxyz"
    assert body[-1]["choices"][0]["finish_reason"] == "length" and "stop_reason" in body[-1]["choices"][0]
    assert all("stop_reason" not in e["choices"][0] for e in body[:-1])
    assert all(e["usage"] is None and e["object"] == "text_completion" for e in body)
    usage = events([w.usage(output(["abcSTOxyz"]))])[0]
    assert usage["choices"] == [] and usage["usage"] == {"prompt_tokens": 3, "completion_tokens": 9, "total_tokens": 12}
    chat = StreamWriter("c1", "tiny", True, 2, tt)
    opening = events(chat.opening())
    assert [e["choices"][0]["delta"] for e in opening] == [{"role": "assistant", "content": ""}] * 2
    assert all(e["object"] == "chat.completion.chunk" and "usage" not in e for e in opening)
    deltas = events(chat.deltas(output(["x", "y"])))
    assert [(e["choices"][0]["index"], e["choices"][0]["delta"]) for e in deltas] == [
        (0, {"content": "x"}),
        (1, {"content": "y"}),
    ]
    echo = StreamWriter("r2", "tiny", False, 1, tt, head="PROMPT")
    assert [e["choices"][0]["text"] for e in events(echo.opening())] == ["PROMPT"]


def test_completion_response_shapes():
    out = output(["hi", "yo"], reason="stop")
    r = completion_response("cmpl-1", "tiny", out, False, head="P:")
    assert (r["id"], r["object"], r["model"]) == ("cmpl-1", "text_completion", "tiny")
    assert [c["text"] for c in r["choices"]] == ["P:hi", "P:yo"] and r["choices"][1]["finish_reason"] == "stop"
    assert r["usage"] == completion_usage(out) == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    r = completion_response("chatcmpl-1", "tiny", out, True, logprobs=[{"content": []}, None])
    assert r["object"] == "chat.completion" and r["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert r["choices"][0]["logprobs"] == {"content": []} and r["choices"][1]["logprobs"] is None
    m = models_response("tiny", 5, 2048)
    assert m["data"] == [{"id": "tiny", "object": "model", "created": 5, "owned_by": "mlsys_nb", "max_model_len": 2048}]


def test_logprobs_in_openai_shapes():
    """Catches text offsets that ignore the echoed prompt, top-k entries beyond k, and token names that collide
    (end of sequence and partial UTF-8 characters get their own names)."""
    tt = TokenText(ByteTokenizer(), VOCAB, None)
    assert (tt.name(ord("a")), tt.name(256), tt.name(0xC3)) == ("a", "token_id:256", "bytes:\\xc3")
    assert tt.bytes_of(0xC3) == b"\xc3" and tt.bytes_of(256) == b""
    ids = [ord("h"), ord("i"), 256]
    lps = [{t: Logprob(-0.5, 1), 7: Logprob(-1.0, 2), 8: Logprob(-2.0, 3)} for t in ids]
    c = output(["hi"], logprobs=lps, ids=ids).outputs[0]
    cursor = LogprobCursor(tt, base=4)
    first = cursor.take(c, 2, False, upto=2)
    assert first["tokens"] == ["h", "i"] and first["text_offset"] == [4, 5] and first["token_logprobs"] == [-0.5] * 2
    assert cursor.take(c, 2, False)["tokens"] == ["token_id:256"]  # only what was not taken yet
    entry = LogprobCursor(tt).take(c, 1, True)["content"][0]
    assert entry["token"] == "h" and entry["bytes"] == [ord("h")]
    assert [e["token"] for e in entry["top_logprobs"]] == ["h"]  # k=1: only rank 1
    assert LogprobCursor(tt).take(output(["x"]).outputs[0], 2, True) is None


def test_output_errors():
    params = SamplingParams(json_schema={"type": "object", "required": ["a"]})
    assert output_error(output(['{"a": 1}']), params) is None
    e = output_error(output(["{}"]), params)
    assert (e.status, e.param, e.type) == (500, "response_format", "internal_error") and "choice 0" in e.message
    assert output_error(output(["{}"], finished=False), params) is None  # checked only when finished
    e = output_error(output([""], error="poisoned"), SamplingParams(), "the engine failed this request: ")
    assert (e.status, e.message) == (500, "the engine failed this request: poisoned")
