"""The HTTP side: ``build_app(engine, model_name)`` -> a FastAPI app whose routes read one ``ServerState``
(``app.state.server``: the engine, its ``AsyncEngine`` thread, the limits, the worker pools).

Each handler is a few lines over ``protocol`` (parse and check the body) and ``responses`` (build the answer):

- ``read_body``: the body under ``max_request_bytes`` (413), a client that left before sending it counted as
  aborted; JSON decoding of a large body runs in a thread.
- ``submit``: admission (429 beyond ``max_waiting_requests``), ``LLMEngine.prepare`` (tokenising; grammar
  compilation on its own one-thread pool) off the event loop and outside the engine lock, then the queue.
- ``final_output`` waits for the last output and, at the same time, for the client to leave; ``stream_events``
  and ``AbortingStream`` stream; either way a request whose client left is aborted at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures as cf
import contextlib
import dataclasses
import time
import uuid

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from .engine_thread import AsyncEngine
from .protocol import (
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
from .responses import (
    DONE,
    LogprobCursor,
    StreamWriter,
    TokenText,
    completion_response,
    error_event,
    models_response,
    output_error,
)

router = APIRouter()


@dataclasses.dataclass
class ServerState:
    """What every route shares: the ``engine`` (an ``LLMEngine``), ``aengine`` (its ``AsyncEngine`` thread), the
    served ``model_name``, ``limits`` and ``max_prompt_bytes``, ``token_text`` (logprobs' token names), the
    tokenising pool ``workers`` and ``grammar_worker`` (one grammar compiles at a time), ``created`` (s)."""

    engine: object
    aengine: AsyncEngine
    model_name: str
    limits: Limits
    max_prompt_bytes: int
    token_text: TokenText
    workers: cf.ThreadPoolExecutor
    grammar_worker: cf.ThreadPoolExecutor
    created: int

    @classmethod
    def create(cls, engine, model_name: str, limits: Limits, clock) -> ServerState:
        """Start the engine thread and the worker pools for ``engine``."""
        return cls(
            engine=engine,
            aengine=AsyncEngine(engine, clock=clock),
            model_name=model_name,
            limits=limits,
            max_prompt_bytes=limits.prompt_bytes(engine.max_model_len),
            token_text=TokenText(engine.tokenizer, engine.model.cfg.vocab_size, engine.decode),
            workers=cf.ThreadPoolExecutor(4, thread_name_prefix="prepare"),  # tokenising
            grammar_worker=cf.ThreadPoolExecutor(1, thread_name_prefix="grammar"),  # one compilation at a time
            created=int(time.time()),
        )

    @property
    def vocab(self) -> int:
        return self.token_text.vocab

    def shutdown(self) -> None:
        self.aengine.shutdown()
        self.workers.shutdown(wait=False, cancel_futures=True)
        self.grammar_worker.shutdown(wait=False, cancel_futures=True)

    def stream_writer(self, rid: str, params, chat: bool, head: str, include_usage: bool) -> StreamWriter:
        """The events of streamed request ``rid`` (its final ``SamplingParams``; ``head``: the echoed prompt)."""
        n, stops, k = params.n, params.stop, params.logprobs
        return StreamWriter(rid, self.model_name, chat, n, self.token_text, stops, k, head, include_usage)

    def echo_head(self, prepared, echo: bool) -> str:
        """The prompt text echoed before each completion (``echo``), else ""."""
        if not echo:
            return ""
        return prepared.prompt if prepared.prompt is not None else self.engine.decode(prepared.ids)


def build_app(engine, model_name: str, limits: Limits | None = None, clock=time.perf_counter) -> FastAPI:
    """The FastAPI app serving ``engine`` (an ``LLMEngine``) under the id ``model_name``; ``clock`` (seconds)
    times tokens/s and ``Retry-After`` (a test passes a fake one). The engine thread starts now and stops
    with the app's lifespan."""
    state = ServerState.create(engine, model_name, limits or Limits(), clock)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        state.shutdown()

    app = FastAPI(title="mlsys_nb inference server", lifespan=lifespan)
    app.state.server = state
    app.state.engine, app.state.limits = state.aengine, state.limits
    app.add_exception_handler(APIError, api_error)
    app.add_exception_handler(StarletteHTTPException, http_error)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(Exception, internal_error)
    app.include_router(router)
    return app


# ---- errors: OpenAI-style JSON {"error": {"message", "type", "param", "code"}} ------------------------------
async def api_error(request: Request, exc: APIError) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=exc.headers)


async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """An unknown route (404) or a wrong method (405)."""
    err = APIError(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", code=str(exc.status_code))
    return JSONResponse(err.body(), status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    return JSONResponse(APIError(400, str(exc)).body(), status_code=400)


async def internal_error(request: Request, exc: Exception) -> JSONResponse:
    err = APIError(500, f"internal error: {type(exc).__name__}: {exc}", type_="internal_error")
    return JSONResponse(err.body(), status_code=500)


# ---- routes ---------------------------------------------------------------------------------------------------
@router.get("/health")
async def health():
    return {"status": "ok"}


@router.get("/v1/models")
async def models(request: Request):
    state: ServerState = request.app.state.server
    return models_response(state.model_name, state.created, state.engine.max_model_len)


@router.get("/metrics")
async def metrics(request: Request):
    text = request.app.state.server.aengine.prometheus_text()
    return PlainTextResponse(text, media_type="text/plain; version=0.0.4")


@router.post("/v1/completions")
async def completions(request: Request):
    state: ServerState = request.app.state.server
    body = check_fields(await read_body(request, state), "completions")
    prompt = parse_prompt(body.get("prompt"), state.engine.max_model_len)
    if isinstance(prompt, str):
        check_prompt_size(prompt, "prompt", state.max_prompt_bytes, state.engine.max_model_len)
    params, opts = parse_sampling(body, False, state.limits, state.vocab)
    return await serve_request(request, state, body, prompt, params, opts, chat=False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state: ServerState = request.app.state.server
    body = check_fields(await read_body(request, state), "chat")
    if "echo" in body:
        raise APIError(400, "echo is a completions field", "echo")
    prompt = chat_prompt(parse_messages(body.get("messages")), state.engine.tokenizer)
    check_prompt_size(prompt, "messages", state.max_prompt_bytes, state.engine.max_model_len)
    params, opts = parse_sampling(body, True, state.limits, state.vocab)
    return await serve_request(request, state, body, prompt, params, opts, chat=True)


# ---- one request, from its body to its answer -----------------------------------------------------------------
async def read_body(request: Request, state: ServerState) -> dict:
    """The request's JSON object: 413 above ``max_request_bytes``, 499 (counted as aborted) when the client left
    before sending it all, 400 when malformed, 404 for another model."""
    limit = state.limits.max_request_bytes
    check_content_length(request.headers.get("content-length"), limit)
    raw = bytearray()
    try:
        async for part in request.stream():
            raw += part
            if len(raw) > limit:
                raise APIError(413, f"the body is above max_request_bytes={limit}")
    except ClientDisconnect:  # the client left before its body was read: it never reached the engine
        state.aengine.aborted += 1
        raise APIError(499, "the client closed the connection before its request was read") from None
    body = decode_body(raw) if len(raw) < 2**20 else await asyncio.to_thread(decode_body, bytes(raw))
    return check_model(body, state.model_name)


async def serve_request(request: Request, state: ServerState, body: dict, prompt, params, opts: dict, chat: bool):
    """Queue the request, then stream its events or wait for its answer (499 when the client left first)."""
    rid, q, prepared = await submit(state, body, prompt, params, chat)
    params = prepared.params
    head = state.echo_head(prepared, opts["echo"])
    if opts["stream"]:
        writer = state.stream_writer(rid, params, chat, head, opts["include_usage"])
        return AbortingStream(state.aengine, rid, stream_events(state.aengine, rid, q, params, writer))
    out = await final_output(request, state.aengine, rid, q)
    if out is None:
        return JSONResponse({}, status_code=499)  # the client left: its request was aborted
    if err := output_error(out, params, "the engine failed this request: "):
        raise err
    lps = [LogprobCursor(state.token_text, len(head)).take(c, params.logprobs or 0, chat) for c in out.outputs]
    return completion_response(rid, state.model_name, out, chat, head, lps)


async def submit(state: ServerState, body: dict, prompt, params, chat: bool):
    """Admit (429 when ``max_waiting_requests`` wait), prepare off the event loop (400 naming the field when
    ``LLMEngine.prepare`` refuses it) and queue: ``(request id, its output queue, the Prepared request)``."""
    aengine, limits = state.aengine, state.limits
    if aengine.num_waiting + aengine.preparing >= limits.max_waiting_requests:
        aengine.rejected += 1
        raise queue_full(limits.max_waiting_requests, aengine.retry_after())
    aengine.preparing += 1
    try:
        pool = state.grammar_worker if params.structured else state.workers
        fut = asyncio.get_running_loop().run_in_executor(
            pool, lambda: state.engine.prepare(prompt, params, strict_context=True)
        )
        try:
            prepared = await fut
        except ValueError as e:
            raise APIError(400, str(e), param_name(getattr(e, "param", None), chat)) from None
        if not chat and "max_tokens" not in body and prepared.params.max_tokens > 16:  # OpenAI's default
            prepared.params = dataclasses.replace(prepared.params, max_tokens=16)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        q = aengine.submit(rid, prepared)
    finally:
        aengine.preparing -= 1
    return rid, q, prepared


async def client_gone(request: Request) -> None:
    """Return when the client has closed its connection (the body must have been read already: this
    consumes the ASGI receive channel, where only ``http.disconnect`` is left to come)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def final_output(request: Request, aengine: AsyncEngine, rid: str, q: asyncio.Queue):
    """The finished ``RequestOutput`` of ``rid``, or None when its client left first (the request is aborted).

    Waits for the final output and, at the same time, for the client to leave (a task blocked on the ASGI
    receive: the server delivers http.disconnect the moment the connection closes). The engine feeds ``q``
    at every step, so the two waits must race: a disconnect checked only between outputs is never seen."""
    getter, gone = None, asyncio.ensure_future(client_gone(request))
    try:
        while True:
            getter = getter or asyncio.ensure_future(q.get())
            await asyncio.wait({getter, gone}, timeout=1.0, return_when=asyncio.FIRST_COMPLETED)
            if gone.done():
                return None  # `finally` aborts the request
            if getter.done():
                out, getter = getter.result(), None
                if out.finished:
                    return out
    finally:
        for task in (getter, gone):
            if task is not None:
                task.cancel()
        if rid in aengine.queues:
            aengine.abort(rid)


async def stream_events(aengine: AsyncEngine, rid: str, q: asyncio.Queue, params, writer: StreamWriter):
    """The server-sent events of ``rid``: the opening chunks, a delta per output, usage, ``DONE``; an error event
    (and no ``DONE``) when the engine fails it or its structured answer fails the schema."""
    try:
        for event in writer.opening():
            yield event
        while True:
            out = await q.get()
            if err := output_error(out, params):
                yield error_event(err)
                break
            for event in writer.deltas(out):
                yield event
            if out.finished:
                if writer.include_usage:
                    yield writer.usage(out)
                break
        yield DONE
    finally:  # also on client disconnect (the task is cancelled): free the request's blocks
        if rid in aengine.queues:
            aengine.abort(rid)


class AbortingStream(StreamingResponse):
    """A server-sent-event stream that aborts its request when the response ends for any reason: finished,
    client gone (Starlette cancels the sending task on http.disconnect, possibly while it awaits ``send``,
    outside the generator, which an ``async for`` then leaves suspended until garbage collection), or an
    error. The generator is closed here, at once, so its own clean-up runs now too."""

    def __init__(self, aengine: AsyncEngine, rid: str, events):
        super().__init__(events, media_type="text/event-stream")
        self.aengine, self.rid = aengine, rid

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            if self.rid in self.aengine.queues:
                self.aengine.abort(self.rid)
            with contextlib.suppress(Exception):
                await self.body_iterator.aclose()
