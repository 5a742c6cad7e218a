"""The torchrun entry: run a ``mlsys_nb.launch``-style function under ``torchrun``
(``python -m mlsys_nb.run`` and the ``mlsys-nb-run`` script call ``main`` here).

    torchrun --nproc-per-node 4 -m mlsys_nb.run mypackage.mymodule:function --args '[1, 2]'

    # two "nodes" on one machine (run each line in its own terminal):
    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 2 --master-addr 127.0.0.1 \\
             --master-port 29511 -m mlsys_nb.run mypackage.mymodule:function
    torchrun --nnodes 2 --node-rank 1 --nproc-per-node 2 --master-addr 127.0.0.1 \\
             --master-port 29511 -m mlsys_nb.run mypackage.mymodule:function

torchrun starts the processes and sets RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT in each one's environment. This entry point reads them, joins the
default process group (``env://``) through the same ``run_on_rank`` as ``mlsys_nb.launch``, calls
the function and prints ``[rank r] result: <repr of the return value>``. The function must live
in an importable module: under torchrun there is no notebook to pickle it from.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys

from torch.distributed.elastic.multiprocessing.errors import record

from .ranks import BACKENDS, resolve_backend, run_on_rank

ENV_NEEDED = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def load_function(target: str):
    """``"package.module:function"`` -> the function object."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"target must look like 'module:function', got {target!r}")
    fn = importlib.import_module(module_name)
    for part in attr.split("."):
        fn = getattr(fn, part)
    if not callable(fn):
        raise TypeError(f"{target} is not callable")
    return fn


@record  # an exception on a rank shows up in torchrun's failure summary with its traceback
def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mlsys_nb.run", description=__doc__.split("\n\n")[0])
    parser.add_argument("target", help="module:function to run on every rank")
    parser.add_argument("--args", default="[]", help="JSON list of positional arguments")
    parser.add_argument("--kwargs", default="{}", help="JSON object of keyword arguments")
    parser.add_argument("--backend", default="auto", choices=BACKENDS)
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds a collective may wait before raising (default 60)"
    )
    parser.add_argument("--threads", type=int, default=1, help="intra-op threads per rank")
    ns = parser.parse_args(argv)
    missing = [name for name in ENV_NEEDED if name not in os.environ]
    if missing:
        parser.error(
            f"{', '.join(missing)} not set: start this under torchrun, e.g. "
            f"torchrun --nproc-per-node 2 -m mlsys_nb.run {ns.target}"
        )
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", world_size))
    backend = resolve_backend(ns.backend, local_world_size)  # GPUs are counted per node
    fn = load_function(ns.target)
    value = run_on_rank(
        fn,
        json.loads(ns.args),
        json.loads(ns.kwargs),
        rank=rank,
        world_size=world_size,
        local_rank=local_rank,
        backend=backend,
        timeout=ns.timeout,
        threads=ns.threads,
    )
    # One write() of the whole line: ranks share the terminal, and their lines must not mix.
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), f"[rank {rank}] result: {value!r}\n".encode())
    return 0
