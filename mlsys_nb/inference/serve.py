"""An OpenAI-compatible server over the engine: ``python -m mlsys_nb.inference.serve --model tiny --port 8000``.

FastAPI + uvicorn, bound to 127.0.0.1 by default. Endpoints:

- ``POST /v1/completions`` and ``POST /v1/chat/completions``: OpenAI's request and response shapes,
  non-streaming or streamed as server-sent events (``"stream": true``; ``data: {...}`` chunks, then
  ``data: [DONE]``). Extra fields accepted as in vLLM: ``top_k``, ``ignore_eos``, ``stop_token_ids``.
- ``GET /v1/models`` (the served id is the ``--model`` value), ``GET /health`` (200 once the engine
  is ready), ``GET /metrics`` (Prometheus text: running/waiting/swapped requests, KV blocks used,
  tokens, tokens/s, preemptions, aborts).

One background thread runs ``engine.step()`` while requests are pending (the engine is not
thread-safe: every call into it holds ``AsyncEngine.lock``); each request has an ``asyncio.Queue`` that
the engine thread feeds. Streaming sends *incremental detokenization* deltas: each chunk is the new
part of the text decoded so far, holding back an unfinished UTF-8 character (decoded as U+FFFD) and the
last ``len(stop) - 1`` characters while a stop string could still be completing, so the deltas
concatenate exactly to the non-streamed text. A client that disconnects mid-stream aborts its request:
its blocks are freed at once.

Errors are OpenAI-style JSON ``{"error": {"message", "type", "param", "code"}}``: malformed JSON or an
invalid value 400, an unknown model 404, a prompt longer than the context 400; the server keeps serving.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections import deque

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse

from .sampling_params import SamplingParams

ALLOWED_SAMPLING = (
    "temperature",
    "top_p",
    "top_k",
    "max_tokens",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "logprobs",
    "seed",
    "n",
    "regex",
    "choice",
)


class APIError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        type_: str = "invalid_request_error",
        code: str | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.type, self.code = status, message, param, type_, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class AsyncEngine:
    """The engine behind a lock, stepped by one background thread; per-request asyncio queues of outputs."""

    def __init__(self, engine):
        self.engine, self.lock = engine, threading.Lock()
        self.queues: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Queue]] = {}
        self.work = threading.Event()
        self.stopped = False
        self.aborted = 0
        self.token_log: deque[tuple[float, int]] = deque()  # (time, tokens generated in that step)
        self.thread = threading.Thread(target=self._loop, name="engine", daemon=True)
        self.thread.start()

    def submit(self, request_id: str, prompt, params: SamplingParams) -> asyncio.Queue:
        q: asyncio.Queue = asyncio.Queue()
        with self.lock:
            self.engine.add_request(request_id, prompt, params)  # ValueError -> 400 (nothing queued)
            self.queues[request_id] = (asyncio.get_running_loop(), q)
        self.work.set()
        return q

    def abort(self, request_id: str) -> None:
        with self.lock:
            if request_id in self.engine.requests:
                self.engine.abort_request(request_id)
                self.aborted += 1
            self.queues.pop(request_id, None)

    def tokens_per_second(self, window: float = 10.0) -> float:
        now = time.perf_counter()
        while self.token_log and self.token_log[0][0] < now - window:
            self.token_log.popleft()
        return sum(n for _, n in self.token_log) / window

    def _loop(self) -> None:
        while not self.stopped:
            if not self.work.wait(timeout=0.5):
                continue
            with self.lock:
                if not self.engine.has_unfinished_requests():
                    self.work.clear()
                    continue
                before = self.engine.stats["generation_tokens"]
                try:
                    outputs = self.engine.step()
                except Exception as e:  # fail every pending request (500) rather than leave it waiting forever
                    for rid, (loop, q) in list(self.queues.items()):
                        self.engine.abort_request(rid)
                        loop.call_soon_threadsafe(q.put_nowait, e)
                    self.queues.clear()
                    continue
                self.token_log.append((time.perf_counter(), self.engine.stats["generation_tokens"] - before))
                targets = [(out, self.queues.get(out.request_id)) for out in outputs]
                for out in outputs:
                    if out.finished:
                        self.queues.pop(out.request_id, None)
            for out, target in targets:
                if target is not None:
                    loop, q = target
                    loop.call_soon_threadsafe(q.put_nowait, out)

    def shutdown(self) -> None:
        self.stopped = True
        self.work.set()
        self.thread.join(timeout=5)


def _checked(item):
    """An output from the engine thread, or the exception that stopped its step (-> HTTP 500)."""
    if isinstance(item, Exception):
        raise APIError(500, f"the engine failed: {type(item).__name__}: {item}", type_="internal_error")
    return item


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


def build_app(engine, model_name: str):
    """The FastAPI app serving ``engine`` (an ``LLMEngine``) under the id ``model_name``."""
    aengine = AsyncEngine(engine)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        yield
        aengine.shutdown()

    app = FastAPI(title="mlsys_nb inference server", lifespan=lifespan)
    app.state.engine = aengine
    created = int(time.time())

    @app.exception_handler(APIError)
    async def api_error(request, exc: APIError):
        return JSONResponse(exc.body(), status_code=exc.status)

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
            st = engine.status()
        rows = [
            ("num_requests_running", "gauge", st["running"]),
            ("num_requests_waiting", "gauge", st["waiting"]),
            ("num_requests_swapped", "gauge", st["swapped"]),
            ("kv_blocks_used", "gauge", st["blocks_used"]),
            ("kv_blocks_total", "gauge", st["blocks_total"]),
            ("generation_tokens_total", "counter", st["generation_tokens"]),
            ("prompt_tokens_total", "counter", st["prompt_tokens"]),
            ("prefix_cache_hit_tokens_total", "counter", st["cached_tokens"]),
            ("requests_finished_total", "counter", st["requests_finished"]),
            ("requests_aborted_total", "counter", aengine.aborted),
            ("preemptions_total", "counter", sum(st["preemptions"].values())),
            ("generation_tokens_per_second", "gauge", round(aengine.tokens_per_second(), 3)),
        ]
        text = "".join(f"# TYPE mlsys_nb_{n} {t}\nmlsys_nb_{n} {v}\n" for n, t, v in rows)
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    async def parse(request: Request) -> dict:
        try:
            body = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
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

    def sampling(body: dict) -> SamplingParams:
        kw = {k: body[k] for k in ALLOWED_SAMPLING if body.get(k) is not None}
        if kw.get("logprobs") is True:  # chat API: logprobs is a bool, top_logprobs the count
            kw["logprobs"] = int(body.get("top_logprobs") or 0)
        elif kw.get("logprobs") is False:
            kw.pop("logprobs")
        kw.setdefault("max_tokens", body.get("max_completion_tokens") or 16)
        fmt = body.get("response_format")
        if fmt is not None:  # OpenAI's structured outputs: {"type": "json_schema", "json_schema": {"schema": ...}}
            kind = fmt.get("type") if isinstance(fmt, dict) else None
            if kind == "json_schema" and isinstance(fmt.get("json_schema"), dict) and "schema" in fmt["json_schema"]:
                kw["json_schema"] = fmt["json_schema"]["schema"]
            elif kind == "json_object":
                kw["json_schema"] = {"type": "object"}
            elif kind != "text":
                raise APIError(
                    400,
                    "response_format must be {'type': 'text'}, {'type': 'json_object'} or "
                    "{'type': 'json_schema', 'json_schema': {'name': ..., 'schema': {...}}}",
                    "response_format",
                )
        try:
            return SamplingParams(**kw)
        except (ValueError, TypeError) as e:
            raise APIError(400, str(e), str(e).split("=")[0] if "=" in str(e) else None) from None

    async def run(request: Request, body: dict, prompt, chat: bool):
        params = sampling(body)
        rid = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex[:16]
        try:
            q = aengine.submit(rid, prompt, params)
        except ValueError as e:
            raise APIError(400, str(e), "messages" if chat else "prompt") from None
        if body.get("stream"):
            return StreamingResponse(stream(rid, q, params, chat), media_type="text/event-stream")
        try:
            while not (out := _checked(await q.get())).finished:
                pass
        finally:
            if rid in aengine.queues:
                aengine.abort(rid)
        return response(rid, out, chat)

    def response(rid, out, chat):
        n_out = sum(len(c.token_ids) for c in out.outputs)
        usage = {
            "prompt_tokens": len(out.prompt_token_ids),
            "completion_tokens": n_out,
            "total_tokens": len(out.prompt_token_ids) + n_out,
        }
        choices = []
        for c in out.outputs:
            lp = (
                None
                if c.logprobs is None
                else {
                    "tokens": [engine.decode([t]) for t in c.token_ids],
                    "token_logprobs": [e[t].logprob for t, e in zip(c.token_ids, c.logprobs)],
                }
            )
            if chat:
                choices.append(
                    {
                        "index": c.index,
                        "message": {"role": "assistant", "content": c.text},
                        "logprobs": lp,
                        "finish_reason": c.finish_reason,
                    }
                )
            else:
                choices.append({"index": c.index, "text": c.text, "logprobs": lp, "finish_reason": c.finish_reason})
        return {
            "id": rid,
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": model_name,
            "choices": choices,
            "usage": usage,
        }

    async def stream(rid, q, params: SamplingParams, chat: bool):
        kind = "chat.completion.chunk" if chat else "text_completion"
        sent = [""] * params.n

        def chunk(index, text, finish=None, role=False):
            if chat:
                delta = {"role": "assistant", "content": text} if role else ({"content": text} if text else {})
                choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": index, "text": text, "logprobs": None, "finish_reason": finish}
            body = {"id": rid, "object": kind, "created": int(time.time()), "model": model_name, "choices": [choice]}
            return f"data: {json.dumps(body)}\n\n"

        try:
            if chat:
                for i in range(params.n):
                    yield chunk(i, "", role=True)
            done = False
            while not done:
                out = _checked(await q.get())
                done = out.finished
                for c in out.outputs:
                    text = _visible(c.text, c.finish_reason is not None, params.stop)
                    if len(text) > len(sent[c.index]) or c.finish_reason is not None:
                        delta, sent[c.index] = text[len(sent[c.index]) :], text
                        yield chunk(c.index, delta, c.finish_reason)
            yield "data: [DONE]\n\n"
        finally:  # also on client disconnect (the task is cancelled): free the request's blocks
            if rid in aengine.queues:
                aengine.abort(rid)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await parse(request)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if not (isinstance(prompt, str) or (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt))):
            raise APIError(400, "prompt must be a string or a list of token ids (one prompt per request)", "prompt")
        return await run(request, body, prompt, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await parse(request)
        msgs = body.get("messages")
        if (
            not isinstance(msgs, list)
            or not msgs
            or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and isinstance(m.get("role"), str)
                for m in msgs
            )
        ):
            raise APIError(400, "messages must be a non-empty list of {role, content} objects", "messages")
        return await run(request, body, chat_prompt(msgs, engine.tokenizer), chat=True)

    return app


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="OpenAI-compatible server over the mlsys_nb engine")
    ap.add_argument("--model", default="tiny", help="a preset name from data/models.yaml (random weights)")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--num-blocks", type=int, default=None)
    ap.add_argument("--max-num-seqs", type=int, default=64)
    ap.add_argument("--max-num-batched-tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1 avoids oversubscription on small CPUs)")
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args(argv)
    import torch
    import uvicorn

    from .engine import LLMEngine

    torch.set_num_threads(args.threads)
    engine = LLMEngine(
        args.model,
        block_size=args.block_size,
        num_blocks=args.num_blocks,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        seed=args.seed,
    )
    app = build_app(engine, args.model)
    print(f"serving {args.model} on http://{args.host}:{args.port}/v1", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
