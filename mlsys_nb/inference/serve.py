"""The server's entry point: ``python -m mlsys_nb.inference.serve --model tiny --port 8000`` (``--model-dir PATH``
for a transformers checkpoint; every ``EngineConfig`` option is a flag; 127.0.0.1 unless ``--host``).

The server itself lives in ``inference/server/`` (its ``__init__`` is the front page: the endpoints, isolation,
back-pressure, streaming): ``protocol`` (request fields -> ``SamplingParams``), ``responses`` (OpenAI's shapes),
``engine_thread`` (``AsyncEngine``), ``routes`` (``build_app``), ``cli`` (``build_parser``, ``run_server``).
The server package's names (its ``__all__``) are re-exported here, where the tests and benchmarks import them.
"""

from . import server
from .server import *  # noqa: F403 (the server's names, where the tests and benchmarks import them)
from .server.cli import run_server

__all__ = server.__all__

if __name__ == "__main__":
    run_server()
