"""An OpenAI-compatible server over the engine, in four files read in this order:

- ``protocol.py``: the request fields checked into ``SamplingParams`` (pure functions: ``parse_sampling``,
  ``parse_prompt``, ``parse_messages``, ``check_fields``; ``Limits``; ``APIError``; ``retry_after_seconds``).
- ``responses.py``: the answers in OpenAI's shapes (``completion_response``, ``StreamWriter``'s server-sent
  events, logprobs by ``LogprobCursor``).
- ``engine_thread.py``: ``AsyncEngine``, the one thread that steps the engine and feeds each request's queue.
- ``routes.py``: ``build_app(engine, model_name)``, the FastAPI routes over one ``ServerState``.
- ``cli.py``: the command line, ``python -m mlsys_nb.inference.serve --model tiny --port 8000`` (a preset with
  random weights) or ``--model-dir PATH`` (a transformers checkpoint directory); every ``EngineConfig`` option
  is a flag (``--speculative-model ngram --num-speculative-tokens 4``, ...).

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

from .cli import SPEC_NGRAM, build_parser, load_model_dir, run_server, speculative_choices
from .engine_thread import AsyncEngine
from .protocol import COMMON_FIELDS, HONOURED, MESSAGE_ROLES, REFUSED, APIError, Limits, chat_prompt
from .protocol import retry_after_seconds
from .routes import ServerState, build_app, client_gone

__all__ = [
    "COMMON_FIELDS",
    "HONOURED",
    "MESSAGE_ROLES",
    "REFUSED",
    "SPEC_NGRAM",
    "APIError",
    "AsyncEngine",
    "Limits",
    "ServerState",
    "build_app",
    "build_parser",
    "chat_prompt",
    "client_gone",
    "load_model_dir",
    "retry_after_seconds",
    "run_server",
    "speculative_choices",
]
