"""An OpenAI-compatible server over the engine: ``python -m mlsys_nb.inference.serve --model tiny --port 8000``
(a preset with random weights) or ``--model-dir PATH`` (a transformers checkpoint directory); every
``EngineConfig`` option is a flag (``--speculative-model ngram --num-speculative-tokens 4``, ...).

FastAPI + uvicorn, bound to 127.0.0.1 by default. Endpoints:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request and response shapes,
  non-streaming or streamed as server-sent events (``"stream": true``; ``data: {...}`` chunks, then
  ``data: [DONE]``). Every field is honoured or refused with a 400 naming it (``HONOURED``, ``REFUSED``;
  an unknown field is refused too, as OpenAI does). Types are strict (``"stream": "false"`` is a 400).
- ``GET /v1/models`` (the served id is ``--served-model-name``, else the ``--model`` or ``--model-dir``
  value), ``GET /health`` (200 once the engine is ready), ``GET /metrics`` (Prometheus text: running and
  waiting requests, sequences, KV blocks used, tokens, tokens/s, preemptions, aborts, failures, rejections,
  and vLLM's histograms of queue time, TTFT, time per output token and end-to-end latency, with its bucket
  bounds; with speculative decoding, vLLM's ``spec_decode_num_drafts``, ``_num_draft_tokens``,
  ``_num_accepted_tokens`` and ``_num_accepted_tokens_per_pos`` counters, ``speculative.SpecDecodingCounters``).

Isolation: a request is validated completely before anything is queued (``LLMEngine.prepare``: ranges,
finite numbers, a seed valid for every sample, ``n``, logprobs within the vocabulary) and queued
atomically; tokenising and grammar compilation run in worker threads, off the event loop and outside
the engine lock, under limits (``Limits``: prompt bytes, ``n``, logprobs, grammar states) that answer
400 naming the limit. If a step still raises, the engine fails only the requests that caused it (their
clients get an error event, or a 500) and serves the rest.

Back-pressure: at most ``max_waiting_requests`` requests wait (being prepared or queued, none of their
samples scheduled yet); beyond that a 429 with ``Retry-After``: the seconds the waiting requests need to
drain at the rate requests left the engine over the last 10 s, in [1, 60] (``retry_after_seconds``).
``max_tokens`` beyond the context is a 400 (vLLM's rule); without it, completions generate min(16, rest
of the context) and chat the rest of the context.

One background thread runs ``engine.step()`` while requests are pending (the engine is not
thread-safe: every call into it holds ``AsyncEngine.lock``); each request has an ``asyncio.Queue`` that
the engine thread feeds. Streaming sends *incremental detokenization* deltas: each chunk is the new
part of the text decoded so far, holding back an unfinished UTF-8 character (decoded as U+FFFD) and the
last ``len(stop) - 1`` characters while a stop string could still be completing, so the deltas
concatenate exactly to the non-streamed text; each chunk carries the logprobs of the tokens it adds.
A client that disconnects (streaming or not) aborts its request: its blocks are freed at once. Every such
request counts in ``requests_aborted_total``, also one whose client left before its body was read.

Errors are OpenAI-style JSON ``{"error": {"message", "type", "param", "code"}}``: malformed JSON (also
too deeply nested) or an invalid value 400, an unknown model or route 404, a full queue 429, a body
above ``max_request_bytes`` 413; the server keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures as cf
import contextlib
import dataclasses
import json
import math
import threading
import time
import uuid
from collections import deque

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..config import check_int, check_number
from .config import EngineConfig
from .sampling_params import SamplingParams

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


class APIError(Exception):
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


class AsyncEngine:
    """The engine behind a lock, stepped by one background thread; per-request asyncio queues of outputs.

    ``token_window`` seconds of (time, tokens) are kept for tokens/s, and of the times requests left the
    engine for ``Retry-After`` (both trimmed at every step); ``clock`` gives those times in seconds."""

    def __init__(self, engine, token_window: float = 10.0, clock=time.perf_counter):
        self.engine, self.lock = engine, threading.Lock()
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopped = False
        self.aborted = self.rejected = self.preparing = 0
        self.num_waiting = self.num_running = 0  # requests in the engine, updated under the lock
        self.token_window = token_window
        self.token_log: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self.clock = clock
        self.left_log: deque[float] = deque(maxlen=2**16)  # times requests left the engine (finished, failed, aborted)
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prepared) -> asyncio.Queue:
        """Queue a request prepared by ``engine.prepare`` (quick: the long work is done)."""
        q: asyncio.Queue = asyncio.Queue()
        with self.lock:
            self.engine.add_request(request_id, None, prepared=prepared)
            self.queues[request_id] = (asyncio.get_running_loop(), q)
            self.num_waiting += 1
        self.work.set()
        return q

    def abort(self, request_id: str) -> None:
        with self.lock:
            if request_id in self.engine.requests:
                self.engine.abort_request(request_id)
                self.aborted += 1
                self.left_log.append(self.clock())
            self.queues.pop(request_id, None)
            self._count()

    def _count(self) -> None:
        c = self.engine.request_counts()
        self.num_waiting, self.num_running = c["waiting"], c["running"]

    def retry_after(self) -> int:
        """``Retry-After`` seconds for a request refused now (``retry_after_seconds`` of the queue). Without the
        engine lock (a step may hold it): the counts are the ones the admission check read, the copy is atomic."""
        waiting, left = self.num_waiting + self.preparing, list(self.left_log)
        return retry_after_seconds(waiting, left, self.clock(), self.token_window)

    def tokens_per_second(self) -> float:
        now, log = self.clock(), list(self.token_log)
        return sum(n for t, n in log if t >= now - self.token_window) / self.token_window

    def _loop(self) -> None:
        while not self.stopped:
            if not self.work.wait(timeout=0.5):
                continue
            with self.lock:
                if not self.engine.has_unfinished_requests():
                    self.work.clear()
                    self._count()
                    continue
                before = self.engine.stats["generation_tokens"]
                try:
                    outputs = self.engine.step()  # fails only the requests whose sequences raise
                except Exception as e:  # the step failed as a whole: fail every request, with an error event
                    outputs = self.engine.fail_all(e)
                now = self.clock()
                self.token_log.append((now, self.engine.stats["generation_tokens"] - before))
                while self.token_log and self.token_log[0][0] < now - self.token_window:
                    self.token_log.popleft()
                targets = [(out, self.queues.get(out.request_id)) for out in outputs]
                for out in outputs:
                    if out.finished:
                        self.queues.pop(out.request_id, None)
                        self.left_log.append(now)
                while self.left_log and self.left_log[0] < now - self.token_window:
                    self.left_log.popleft()
                self._count()
            for out, target in targets:
                if target is not None:
                    loop, q = target
                    with contextlib.suppress(RuntimeError):  # the client's loop is closed
                        loop.call_soon_threadsafe(q.put_nowait, out)

    def shutdown(self) -> None:
        self.stopped = True
        self.work.set()
        self.thread.join(timeout=5)


async def client_gone(request: Request) -> None:
    """Return when the client has closed its connection (the body must have been read already: this
    consumes the ASGI receive channel, where only ``http.disconnect`` is left to come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _visible(text: str, finished: bool, stops: list[str]) -> str:
    """The part of ``text`` that can be streamed now (see the module docstring)."""
    if finished:
        return text
    hold = max((len(s) - 1 for s in stops), default=0)
    text = text[: len(text) - hold] if hold else text
    return text.rstrip("\ufffd")


def chat_prompt(messages, tokenizer) -> str:
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return "".join(f"<|{m['role']}|>\n{m['content']}\n" for m in messages) + "<|assistant|>\n"


# ---- strict field checks: each returns the value or raises a 400 naming the field --------------------
def _bad(field: str, allowed: str, value) -> APIError:
    shown = repr(value) if len(repr(value)) < 80 else repr(value)[:77] + "..."
    return APIError(400, f"{field}={shown}: {allowed}", field)


def _int(body, field, lo=None, hi=None):
    v = body[field]
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) or (hi is not None and v > hi):
        rng = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}" if lo is not None else ""
        raise _bad(field, f"must be an integer {rng}".strip(), v)
    return v


def _number(body, field):
    v = body[field]
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise _bad(field, "must be a finite number", v)
    return v


def _bool(body, field):
    if not isinstance(body[field], bool):
        raise _bad(field, "must be true or false (a JSON boolean)", body[field])
    return body[field]


def _str(body, field):
    if not isinstance(body[field], str):
        raise _bad(field, "must be a string", body[field])
    return body[field]


def build_app(engine, model_name: str, limits: Limits | None = None, clock=time.perf_counter):
    """The FastAPI app serving ``engine`` (an ``LLMEngine``) under the id ``model_name``; ``clock`` (seconds)
    times tokens/s and ``Retry-After`` (a test passes a fake one)."""
    limits = limits or Limits()
    max_prompt_bytes = limits.max_prompt_bytes or max(2**16, 64 * engine.max_model_len)
    aengine = AsyncEngine(engine, clock=clock)
    workers = cf.ThreadPoolExecutor(4, thread_name_prefix="prepare")  # tokenising
    grammar_worker = cf.ThreadPoolExecutor(1, thread_name_prefix="grammar")  # one compilation at a time
    vocab = engine.model.cfg.vocab_size

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        aengine.shutdown()
        workers.shutdown(wait=False, cancel_futures=True)
        grammar_worker.shutdown(wait=False, cancel_futures=True)

    app = FastAPI(title="mlsys_nb inference server", lifespan=lifespan)
    app.state.engine, app.state.limits = aengine, limits
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request, exc: StarletteHTTPException):  # unknown route (404), wrong method (405)
        err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=str(exc.status_code))
        return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))

    @app.exception_handler(RequestValidationError)
    async def validation_error(request, exc):
        return JSONResponse(APIError(400, str(exc)).body(), status_code=400)

    @app.exception_handler(Exception)
    async def internal_error(request, exc: Exception):
        err = APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_="internal_error")
        return JSONResponse(err.body(), status_code=500)

    @app.get("/health")
    async def health():
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": model_name,
                    "object": "model",
                    "created": created,
                    "owned_by": "mlsys_nb",
                    "max_model_len": engine.max_model_len,
                }
            ],
        }

    @app.get("/metrics")
    async def metrics():
        with aengine.lock:
            st, counts = engine.status(), engine.request_counts()
        rows = [
            ("num_requests_running", "gauge", counts["running"]),
            ("num_requests_waiting", "gauge", counts["waiting"] + aengine.preparing),
            ("num_requests_preparing", "gauge", aengine.preparing),
            ("num_sequences_running", "gauge", st["running"]),
            ("num_sequences_waiting", "gauge", st["waiting"]),
            ("num_sequences_swapped", "gauge", st["swapped"]),
            ("num_open_streams", "gauge", len(aengine.queues)),
            ("kv_blocks_used", "gauge", st["blocks_used"]),
            ("kv_blocks_total", "gauge", st["blocks_total"]),
            ("generation_tokens_total", "counter", st["generation_tokens"]),
            ("prompt_tokens_total", "counter", st["prompt_tokens"]),
            ("prefix_cache_hit_tokens_total", "counter", st["cached_tokens"]),
            ("requests_finished_total", "counter", st["requests_finished"]),
            ("requests_aborted_total", "counter", aengine.aborted),
            ("requests_failed_total", "counter", st["requests_failed"]),
            ("requests_rejected_total", "counter", aengine.rejected),
            ("preemptions_total", "counter", sum(st["preemptions"].values())),
            ("engine_steps_total", "counter", engine.num_steps),
            ("generation_tokens_per_second", "gauge", round(aengine.tokens_per_second(), 3)),
        ]
        text = "".join(f"# TYPE mlsys_nb_{n} {t}\nmlsys_nb_{n} {v}\n" for n, t, v in rows)
        with aengine.lock:
            text += "".join(h.prometheus(f"mlsys_nb_{n}") for n, h in engine.histograms.items())
            if getattr(engine, "spec_counters", None) is not None:  # vLLM's spec_decode_* counters
                text += engine.spec_counters.prometheus("mlsys_nb_")
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def parse(request: Request) -> dict:
        size = request.headers.get("content-length")
        if size is not None and size.isdigit() and int(size) > limits.max_request_bytes:
            raise APIError(413, f"the body has {size} bytes, above max_request_bytes={limits.max_request_bytes}")
        raw = bytearray()
        try:
            async for part in request.stream():
                raw += part
                if len(raw) > limits.max_request_bytes:
                    raise APIError(413, f"the body is above max_request_bytes={limits.max_request_bytes}")
        except ClientDisconnect:  # the client left before its body was read: it never reached the engine
            aengine.aborted += 1
            raise APIError(499, "the client closed the connection before its request was read") from None
        try:
            body = json.loads(raw) if len(raw) < 2**20 else await asyncio.to_thread(json.loads, bytes(raw))
        except RecursionError:
            raise APIError(400, "malformed JSON body: nested too deeply") from None
        except ValueError as e:  # JSONDecodeError, UnicodeDecodeError
            raise APIError(400, f"malformed JSON body: {e}") from None
        if not isinstance(body, dict):
            raise APIError(400, "the request body must be a JSON object")
        if body.get("model") not in (model_name, None):
            raise APIError(
                404,
                f"The model `{body.get('model')}` does not exist (served: {model_name!r}).",
                "model",
                code="model_not_found",
            )
        return body

    def check_fields(body: dict, kind: str) -> dict:
        """The non-null fields of ``body``, each honoured or refused (400 naming it)."""
        for field, value in body.items():
            if field in REFUSED[kind] and value is not None:
                raise APIError(400, f"{field}: {REFUSED[kind][field]} by this server", field)
            if field not in HONOURED[kind] and field not in REFUSED[kind]:
                raise APIError(400, f"Unrecognized request argument supplied: {field}", field)
        return {k: v for k, v in body.items() if v is not None and k in HONOURED[kind]}

    def sampling(body: dict, chat: bool) -> tuple[SamplingParams, dict]:
        """SamplingParams from the checked fields, and the server-side options (stream, echo, usage)."""
        kw: dict = {}
        for f in ("temperature", "top_p", "min_p", "presence_penalty", "frequency_penalty", "repetition_penalty"):
            if f in body:
                kw[f] = _number(body, f)
        for f, lo in (("top_k", -1), ("min_tokens", 0), ("seed", None)):
            if f in body:
                kw[f] = _int(body, f, lo)
        if "n" in body:
            kw["n"] = _int(body, "n", 1, limits.max_n)
        if "best_of" in body and _int(body, "best_of", 1) != kw.get("n", 1):
            raise _bad(
                "best_of", f"must equal n={kw.get('n', 1)} (ranking extra samples is not supported)", body["best_of"]
            )
        max_field = "max_completion_tokens" if "max_completion_tokens" in body else "max_tokens"
        if max_field in body:
            kw["max_tokens"] = _int(body, max_field, 1)
        else:
            kw["max_tokens"] = None  # the rest of the context (completions: at most 16, below)
        if "stop" in body:
            stop = body["stop"]
            if not (isinstance(stop, str) or (isinstance(stop, list) and all(isinstance(s, str) for s in stop))):
                raise _bad("stop", "must be a string or a list of strings", stop)
            if isinstance(stop, list) and len(stop) > limits.max_stop:
                raise _bad("stop", f"at most max_stop={limits.max_stop} strings", stop)
            kw["stop"] = stop
        if "stop_token_ids" in body:
            ids = body["stop_token_ids"]
            if not isinstance(ids, list) or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < vocab for t in ids
            ):
                raise _bad("stop_token_ids", f"must be a list of token ids in [0, {vocab})", ids)
            kw["stop_token_ids"] = ids
        if "ignore_eos" in body:
            kw["ignore_eos"] = _bool(body, "ignore_eos")
        if "logit_bias" in body:
            lb = body["logit_bias"]
            if not isinstance(lb, dict):
                raise _bad("logit_bias", "must be an object {token id: bias in [-100, 100]}", lb)
            for k, v in lb.items():
                if not k.lstrip("-").isdigit() or not 0 <= int(k) < vocab:
                    raise _bad("logit_bias", f"key {k!r}: token ids must be in [0, {vocab})", lb)
                if isinstance(v, bool) or not isinstance(v, (int, float)) or not -100 <= v <= 100:
                    raise _bad("logit_bias", f"value of {k!r}: a number in [-100, 100]", lb)
            kw["logit_bias"] = {int(k): v for k, v in lb.items()}
        if chat:
            if "top_logprobs" in body:
                _int(body, "top_logprobs", 0, limits.max_logprobs)
                if body.get("logprobs") is not True:
                    raise _bad("top_logprobs", "needs logprobs=true", body["top_logprobs"])
            if "logprobs" in body and _bool(body, "logprobs"):
                kw["logprobs"] = body.get("top_logprobs", 0)
        elif "logprobs" in body:
            kw["logprobs"] = _int(body, "logprobs", 0, limits.max_logprobs)
        if "regex" in body:
            kw["regex"] = _str(body, "regex")
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
                raise APIError(
                    400,
                    "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                    "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}",
                    "response_format",
                )
        if kw.get("json_schema") is not None or "regex" in kw or "choice" in kw:
            for f in ("stop", "stop_token_ids"):
                if f in kw:
                    raise _bad(f, "cannot be combined with a structured output (it could cut the match)", kw[f])
        opts = {"stream": _bool(body, "stream") if "stream" in body else False}
        opts["echo"] = _bool(body, "echo") if "echo" in body else False
        if opts["echo"] and "logprobs" in kw:
            raise _bad("echo", "cannot be combined with logprobs (prompt logprobs are not computed)", True)
        so = body.get("stream_options")
        if so is not None:
            if not opts["stream"]:
                raise _bad("stream_options", "is only allowed with stream=true", so)
            if not isinstance(so, dict) or set(so) - {"include_usage"}:
                raise _bad("stream_options", "must be {'include_usage': bool} (other options are refused)", so)
            if "include_usage" in so:
                _bool(so, "include_usage")
        opts["include_usage"] = bool(so and so.get("include_usage"))
        if "user" in body:
            _str(body, "user")  # accepted (an end-user id for the caller's records); no effect here
        try:
            return SamplingParams(**kw), opts
        except ValueError as e:
            raise APIError(400, str(e), _param_name(getattr(e, "param", None), chat)) from None

    def _param_name(param, chat):
        names = {"json_schema": "response_format", "prompt": "messages" if chat else "prompt"}
        if chat:
            names["logprobs"] = "top_logprobs"
        return names.get(param, param)

    async def run(request: Request, body: dict, prompt, params: SamplingParams, opts: dict, chat: bool):
        if aengine.num_waiting + aengine.preparing >= limits.max_waiting_requests:
            aengine.rejected += 1
            raise APIError(
                429,
                f"too many requests waiting (max_waiting_requests={limits.max_waiting_requests}); retry later",
                type_="rate_limit_error",
                code="queue_full",
                headers={"Retry-After": str(aengine.retry_after())},
            )
        aengine.preparing += 1
        try:
            pool = grammar_worker if params.structured else workers
            fut = asyncio.get_running_loop().run_in_executor(
                pool, lambda: engine.prepare(prompt, params, strict_context=True)
            )
            try:
                prepared = await fut
            except ValueError as e:
                raise APIError(400, str(e), _param_name(getattr(e, "param", None), chat)) from None
            if not chat and "max_tokens" not in body and prepared.params.max_tokens > 16:  # OpenAI's default
                prepared.params = dataclasses.replace(prepared.params, max_tokens=16)
            rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
            q = aengine.submit(rid, prepared)
        finally:
            aengine.preparing -= 1
        params = prepared.params
        if opts["stream"]:
            return AbortingStream(rid, stream(rid, q, params, opts, chat, prepared))
        # Wait for the final output and, at the same time, for the client to leave (a task blocked on the ASGI
        # receive: the server delivers http.disconnect the moment the connection closes). The engine feeds `q`
        # at every step, so the two waits must race: a disconnect checked only between outputs is never seen.
        getter, gone = None, asyncio.ensure_future(client_gone(request))
        try:
            while True:
                getter = getter or asyncio.ensure_future(q.get())
                await asyncio.wait({getter, gone}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
                if gone.done():
                    return JSONResponse({}, status_code=499)  # `finally` aborts the request
                if getter.done():
                    out, getter = getter.result(), None
                    if out.finished:
                        break
        finally:
            for task in (getter, gone):
                if task is not None:
                    task.cancel()
            if rid in aengine.queues:
                aengine.abort(rid)
        if out.error is not None:
            raise APIError(500, f"the engine failed this request: {out.error}", type_="internal_error")
        schema_fail = _schema_failure(out, params)
        if schema_fail:
            raise APIError(500, schema_fail, "response_format", type_="internal_error")
        return response(rid, out, params, opts, chat, prepared)

    def _schema_failure(out, params) -> str | None:
        if params.json_schema is None:
            return None
        from .structured import schema_errors

        for c in out.outputs:
            err = schema_errors(c.text, params.json_schema)
            if err:
                return f"choice {c.index}: the output failed its JSON schema ({err}); nothing is returned"
        return None

    # ---- logprobs in OpenAI's shapes -----------------------------------------------------------------
    tb_cache: dict = {}

    def token_bytes_of(t: int) -> bytes:
        if t not in tb_cache:
            from .tokenizer import ByteTokenizer, token_bytes

            tok = engine.tokenizer
            if isinstance(tok, ByteTokenizer):
                b = bytes([t]) if t < 256 else b""
            else:
                try:
                    b = token_bytes(tok, vocab)[0].get(t)
                except ValueError:
                    b = None
                b = engine.decode([t]).encode() if b is None else b
            if len(tb_cache) < 2**16:
                tb_cache[t] = b
            return b
        return tb_cache[t]

    def token_str(t: int) -> str:
        """A token as text: its UTF-8, ``bytes:\\xNN`` for part of a character, ``token_id:N`` for a token
        without text (end of sequence, unused ids), so that no two tokens of a top-k share a key."""
        b = token_bytes_of(t)
        if not b:
            return f"token_id:{t}"
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: vLLM's convention
            return "bytes:" + "".join(f"\\x{x:02x}" for x in b)

    class Cursor:
        """Logprobs of one choice, in chunks (streaming) or at once; ``text_offset`` via incremental decoding."""

        def __init__(self, base: int):
            from .tokenizer import decode_stream

            self.sent, self.offset = 0, base
            self.detok = decode_stream(engine.tokenizer) if engine.tokenizer is not None else None

        def take(self, c, k: int, chat: bool, upto: int | None = None):
            if c.logprobs is None:
                return None
            upto = len(c.token_ids) if upto is None else upto
            toks, entries = c.token_ids[self.sent : upto], c.logprobs[self.sent : upto]
            self.sent = upto
            if chat:
                content = []
                for t, e in zip(toks, entries):
                    top = sorted((lp.rank, tid, lp.logprob) for tid, lp in e.items() if lp.rank <= k)
                    content.append(
                        {
                            "token": token_str(t),
                            "logprob": e[t].logprob,
                            "bytes": list(token_bytes_of(t)),
                            "top_logprobs": [
                                {"token": token_str(tid), "logprob": lp, "bytes": list(token_bytes_of(tid))}
                                for _, tid, lp in top
                            ],
                        }
                    )
                return {"content": content}
            offsets = []
            for t in toks:
                offsets.append(self.offset)
                if self.detok is not None:
                    self.offset += len(self.detok.step(t))
            return {
                "tokens": [token_str(t) for t in toks],
                "token_logprobs": [e[t].logprob for t, e in zip(toks, entries)],
                "top_logprobs": [{token_str(tid): lp.logprob for tid, lp in e.items()} for e in entries],
                "text_offset": offsets,
            }

    def usage(out) -> dict:
        n_out = sum(len(c.token_ids) for c in out.outputs)
        n_in = len(out.prompt_token_ids)
        return {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}

    def prompt_text(prepared) -> str:
        return prepared.prompt if prepared.prompt is not None else engine.decode(prepared.ids)

    def response(rid, out, params, opts, chat, prepared):
        choices = []
        head = prompt_text(prepared) if opts["echo"] else ""
        for c in out.outputs:
            lp = Cursor(len(head)).take(c, params.logprobs or 0, chat)
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
            "usage": usage(out),
        }

    async def stream(rid, q, params: SamplingParams, opts: dict, chat: bool, prepared):
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = [""] * params.n
        head = prompt_text(prepared) if opts["echo"] else ""
        cursors = [Cursor(len(head)) for _ in range(params.n)]
        k = params.logprobs or 0

        def chunk(index, text, finish=None, role=False, lp=None, stop_reason=None):
            if chat:
                delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "logprobs": lp, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text, "logprobs": lp, "finish_reason": finish}
            if finish is not None:
                choice["stop_reason"] = stop_reason
            body = {"id": rid, "object": kind, "created": int(time.time()), "model": model_name, "choices": [choice]}
            if opts["include_usage"]:
                body["usage"] = None
            return f"data: {json.dumps(body)}\n\n"

        try:
            for i in range(params.n):
                if chat:
                    yield chunk(i, "", role=True)
                elif head:
                    yield chunk(i, head)
            while True:
                out = await q.get()
                if out.error is not None:
                    yield f"data: {json.dumps(APIError(500, out.error, type_='internal_error').body())}\n\n"
                    break
                if out.finished and (fail := _schema_failure(out, params)):
                    yield f"data: {json.dumps(APIError(500, fail, 'response_format', 'internal_error').body())}\n\n"
                    break
                for c in out.outputs:
                    text = _visible(c.text, c.finish_reason is not None, params.stop)
                    if len(text) > len(sent[c.index]) or c.finish_reason is not None:
                        delta, sent[c.index] = text[len(sent[c.index]) :], text
                        lp = cursors[c.index].take(c, k, chat)
                        yield chunk(c.index, delta, c.finish_reason, lp=lp, stop_reason=c.stop_reason)
                if out.finished:
                    if opts["include_usage"]:
                        body = {"id": rid, "object": kind, "created": int(time.time()), "model": model_name}
                        yield f"data: {json.dumps({**body, 'choices': [], 'usage': usage(out)})}\n\n"
                    break
            yield "data: [DONE]\n\n"
        finally:  # also on client disconnect (the task is cancelled): free the request's blocks
            if rid in aengine.queues:
                aengine.abort(rid)

    class AbortingStream(StreamingResponse):
        """A server-sent-event stream that aborts its request when the response ends for any reason: finished,
        client gone (Starlette cancels the sending task on http.disconnect, possibly while it awaits ``send``,
        outside the generator, which an ``async for`` then leaves suspended until garbage collection), or an
        error. The generator is closed here, at once, so its own clean-up runs now too."""

        def __init__(self, rid: str, events):
            super().__init__(events, media_type="text/event-stream")
            self.rid = rid

        async def __call__(self, scope, receive, send) -> None:
            try:
                await super().__call__(scope, receive, send)
            finally:
                if self.rid in aengine.queues:
                    aengine.abort(self.rid)
                with contextlib.suppress(Exception):
                    await self.body_iterator.aclose()

    def check_prompt_size(text: str, field: str) -> None:
        if len(text) > max_prompt_bytes or len(text.encode("utf-8", "surrogatepass")) > max_prompt_bytes:
            raise APIError(
                400,
                f"{field} has more than max_prompt_bytes={max_prompt_bytes} bytes of text (the context is "
                f"{engine.max_model_len} tokens)",
                field,
            )

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = check_fields(await parse(request), "completions")
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, list) and len(prompt) > engine.max_model_len:
            raise APIError(
                400, f"prompt of {len(prompt)} tokens is too long: max_model_len={engine.max_model_len}", "prompt"
            )
        if not (
            isinstance(prompt, str)
            or (isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
        ):
            raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
        if isinstance(prompt, str):
            check_prompt_size(prompt, "prompt")
        params, opts = sampling(body, chat=False)
        return await run(request, body, prompt, params, opts, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = check_fields(await parse(request), "chat")
        if "echo" in body:
            raise APIError(400, "echo is a completions field", "echo")
        msgs = body.get("messages")
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
            content = m.get("content")
            if isinstance(content, list):  # content parts: text only
                if not all(
                    isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content
                ):
                    raise APIError(
                        400, f"messages[{i}].content: only text parts are supported", f"messages[{i}].content"
                    )
                content = "".join(p["text"] for p in content)
            if not isinstance(content, str):
                raise APIError(400, f"messages[{i}].content must be a string", f"messages[{i}].content")
            clean.append({"role": m["role"], "content": content})
        prompt = chat_prompt(clean, engine.tokenizer)
        check_prompt_size(prompt, "messages")
        params, opts = sampling(body, chat=True)
        return await run(request, body, prompt, params, opts, chat=True)

    return app


SPEC_NGRAM = "ngram"  # --speculative-model: draft by n-gram lookup in the sequence itself (no draft model)


def speculative_choices() -> list[str]:
    """The values ``--speculative-model`` accepts: the presets of data/models.yaml and ``"ngram"``."""
    from ..config import model_presets

    return [*model_presets(), SPEC_NGRAM]


def build_parser() -> argparse.ArgumentParser:
    """The command line: the server's own flags, then one flag per ``EngineConfig`` field (``--block-size``,
    ``--no-enable-prefix-caching``, ``--preemption-mode swap``, ``--kv-cache-dtype bf16``,
    ``--speculative-model ngram --num-speculative-tokens 3``, ...)."""
    ap = argparse.ArgumentParser(description="OpenAI-compatible server over the mlsys_nb engine")
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--model", default="tiny", help="a preset name from data/models.yaml (random weights)")
    src.add_argument(
        "--model-dir",
        default=None,
        metavar="PATH",
        help="a transformers checkpoint directory (save_pretrained: config.json and weights; its tokenizer if saved "
        "there), converted with models.from_hf",
    )
    ap.add_argument("--served-model-name", default=None, help="the model id clients send (default: --model or PATH)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--max-waiting-requests", type=int, default=Limits.max_waiting_requests)
    ap.add_argument("--max-n", type=int, default=Limits.max_n)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids oversubscription on small CPUs)")
    ap.add_argument("--log-level", default="warning")
    engine_flags = ap.add_argument_group("engine (EngineConfig; --seed also seeds the random weights)")
    EngineConfig.add_cli_arguments(engine_flags, skip=("speculative_model",))
    engine_flags.add_argument(
        "--speculative-model",
        default=None,
        choices=speculative_choices(),
        metavar="PRESET|ngram",
        help="speculative decoding inside the batch: a draft preset from data/models.yaml (random weights, seed + 1; "
        "its vocabulary must be the target's) or ngram (prompt lookup); --num-speculative-tokens drafts per step",
    )
    return ap


def load_model_dir(path: str):
    """(a transformers causal LM, its tokenizer directory or None) from a ``save_pretrained`` directory;
    ``ValueError`` naming ``--model-dir`` when ``path`` holds none."""
    import os

    if not os.path.isdir(path) or not os.path.isfile(os.path.join(path, "config.json")):
        raise ValueError(
            f"--model-dir {path!r}: not a transformers checkpoint directory (expected a directory with config.json "
            "and the weights, as save_pretrained writes)"
        )
    from transformers import AutoModelForCausalLM

    try:
        hf = AutoModelForCausalLM.from_pretrained(path)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"--model-dir {path!r}: transformers could not load a causal LM from it ({e})") from e
    has_tok = any(os.path.isfile(os.path.join(path, f)) for f in ("tokenizer.json", "tokenizer_config.json"))
    return hf.eval(), (path if has_tok else None)


def main(argv=None) -> None:
    ap = build_parser()
    args = ap.parse_args(argv)
    from ..config import load_model_preset

    if args.model_dir is not None:
        args.model = None  # the checkpoint, not the default preset
    try:
        config = EngineConfig.from_cli(args)
    except (TypeError, ValueError) as e:
        ap.error(str(e))
    draft = args.speculative_model
    if draft not in (None, SPEC_NGRAM) and args.model is not None:  # a model dir's vocabulary is checked on load
        want, got = load_model_preset(args.model).vocab_size, load_model_preset(draft).vocab_size
        if want != got:
            same = [n for n in speculative_choices() if n == SPEC_NGRAM or load_model_preset(n).vocab_size == want]
            ap.error(
                f"--speculative-model {draft}: its vocab_size {got} differs from --model {args.model}'s {want}; "
                f"allowed here: {same}"
            )
    import torch
    import uvicorn

    from .engine import LLMEngine

    torch.set_num_threads(args.threads)
    try:
        if args.model_dir is not None:
            hf, tokenizer = load_model_dir(args.model_dir)
            engine = LLMEngine(hf, tokenizer=tokenizer, config=config)
        else:
            engine = LLMEngine(args.model, config=config)
    except ValueError as e:
        ap.error(str(e))
    name = args.served_model_name or args.model or args.model_dir
    limits = Limits(max_n=args.max_n, max_waiting_requests=args.max_waiting_requests)
    app = build_app(engine, name, limits)
    print(f"serving {name} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
