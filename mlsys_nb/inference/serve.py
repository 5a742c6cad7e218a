"""The server's entry point: ``python -m mlsys_nb.inference.serve --model tiny --port 8000`` (``--model-dir PATH``
for a transformers checkpoint; every ``EngineConfig`` option is a flag; 127.0.0.1 unless ``--host``).

The server itself lives in ``inference/server/`` (its ``__init__`` is the front page: the endpoints, isolation,
back-pressure, streaming): ``protocol`` (request fields -> ``SamplingParams``), ``responses`` (OpenAI's shapes),
``engine_thread`` (``AsyncEngine``), ``routes`` (``build_app``), ``cli`` (``build_parser``, ``run_server``).
The names below are re-exported here, where the tests and benchmarks import them.
"""

from .server.cli import SPEC_NGRAM, build_parser, load_model_dir, run_server, speculative_choices
from .server.engine_thread import AsyncEngine
from .server.protocol import COMMON_FIELDS, HONOURED, MESSAGE_ROLES, REFUSED, APIError, Limits, chat_prompt
from .server.protocol import retry_after_seconds
from .server.routes import build_app, client_gone

__all__ = [
    "COMMON_FIELDS",
    "HONOURED",
    "MESSAGE_ROLES",
    "REFUSED",
    "SPEC_NGRAM",
    "APIError",
    "AsyncEngine",
    "Limits",
    "build_app",
    "build_parser",
    "chat_prompt",
    "client_gone",
    "load_model_dir",
    "retry_after_seconds",
    "run_server",
    "speculative_choices",
]

if __name__ == "__main__":
    run_server()
