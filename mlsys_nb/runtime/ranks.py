"""The rank runtime shared by the launcher (``launch``), the live cluster (``Cluster``) and the
torchrun entry (``python -m mlsys_nb.run``): what every rank process does to join the group, the
process factory that starts ranks, the rendezvous store, and the one error family.

- ``RankError``: one or more ranks failed (a ``RuntimeError``). ``RankTimeoutError``: ranks did
  not finish in time; a ``RankError`` and a ``TimeoutError``. Both carry, where known,
  ``errors`` {rank: traceback text}, ``stacks`` {rank: Python stack when stopped},
  ``failures`` {rank: RankFailure}, ``consequences`` {rank: what happened to the others},
  ``outputs`` {rank: printed text} and ``restarted`` (the cluster restarted its ranks).
- ``resolve_backend(backend, world_size)``, ``device()``: the backend and this rank's device.
- ``run_on_rank(fn, ...)``: join the process group, run ``fn``, leave.
- ``context()``, ``prestart()``: the multiprocessing forkserver (torch preloaded) that forks ranks.
- ``open_store(start_timeout)``: the rendezvous ``TCPStore`` on 127.0.0.1, on a port the OS picks.
- ``rank_environment(...)``, ``die_with_parent()``, ``without_main_module()``: process plumbing.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import socket
import sys
import threading
import types
from dataclasses import dataclass
from datetime import timedelta

from ..config import check_choice, check_int

HOST = "127.0.0.1"
BACKENDS = ("auto", "gloo", "nccl")
# Imported once by the forkserver, so every rank starts with them already loaded. torch._dynamo: the first
# torch.optim optimizer a process builds imports it (torch._compile's lazy import, several seconds of CPU per
# rank, with DTensor and sympy); preloaded, ranks that train skip that import (it starts no thread: forking stays safe).
PRELOAD = [
    "torch",
    "torch.distributed",
    "torch._dynamo",
    "cloudpickle",
    "mlsys_nb.runtime.launcher",
    "mlsys_nb.runtime.cluster",
]
# Messages a rank gets because *another* rank died or stalled: consequences, not causes.
COLLATERAL_PATTERNS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Timed out waiting",
    "timed out",
    "DistNetworkError",
    "DistStoreError",
    "DistBackendError",
    "aborted",
)


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------
@dataclass
class RankFailure:
    """What went wrong on one rank: an exception it raised, or its process exiting early."""

    rank: int
    type_name: str  # e.g. "ValueError", or "exit" when the process died without reporting
    message: str
    traceback: str = ""  # the remote traceback, formatted on the rank
    exitcode: int | None = None
    exception: BaseException | None = None  # the original exception when it could be unpickled

    def is_collateral(self) -> bool:
        """True when the message looks like a consequence of another rank failing."""
        text = f"{self.type_name}: {self.message}"
        return any(p in text for p in COLLATERAL_PATTERNS)

    def summary(self, width: int = 160) -> str:
        """One line: ``rank r: Type: first line of the message`` (cut to ``width`` characters)."""
        first = (self.message.strip().splitlines() or [""])[0]
        return f"rank {self.rank}: {self.type_name}: {first}"[:width]


class RankError(RuntimeError):
    """One or more ranks failed.

    ``errors``: {rank: traceback text} of the ranks that raised (the causes);
    ``failures``: {rank: RankFailure} the same, structured (``launch``);
    ``consequences``: {rank: str} what happened to the other ranks (not causes);
    ``stacks``: {rank: str} the Python stack of ranks still running when they were stopped;
    ``outputs``: {rank: str} what each rank printed during the call (``Cluster``);
    ``restarted``: the ``Cluster`` restarted its ranks (namespaces are fresh).
    """

    def __init__(
        self,
        message: str,
        *,
        errors: dict | None = None,
        failures: dict | None = None,
        consequences: dict | None = None,
        stacks: dict | None = None,
        outputs: dict | None = None,
        restarted: bool = False,
    ):
        super().__init__(message)  # (keyword defaults keep the error picklable)
        self.failures = dict(failures or {})
        self.errors = dict(errors or {}) or {
            r: f.traceback or f"{f.type_name}: {f.message}" for r, f in self.failures.items()
        }
        self.consequences = dict(consequences or {})
        self.stacks = dict(stacks or {})
        self.outputs = dict(outputs or {})
        self.restarted = restarted

    @property
    def ranks(self) -> list[int]:
        """The ranks that caused the error (raised, or were still running at a timeout)."""
        return sorted(self.errors or self.stacks)

    def report(self) -> str:
        """Every rank's traceback and stack, grouped by rank (what ``%%ranks`` prints)."""
        parts = [str(self)]
        for r in sorted(self.errors):
            parts.append(f"--- rank {r}: traceback ---\n{self.errors[r].rstrip()}")
        for r in sorted(self.stacks):
            parts.append(f"--- rank {r}: stack when stopped (most recent call first) ---\n{self.stacks[r].rstrip()}")
        return "\n".join(parts)


class RankTimeoutError(RankError, TimeoutError):
    """Ranks did not finish within the timeout; they were killed (``launch``) or restarted
    (``Cluster``). ``stacks``: {rank: str} the Python stack of every rank still running, dumped
    just before it was stopped (shows where each rank was blocked)."""


# --------------------------------------------------------------------------------------------
# Backend and device
# --------------------------------------------------------------------------------------------
def resolve_backend(backend: str, world_size: int) -> str:
    """Return the concrete backend for ``world_size`` ranks on this machine.

    ``"auto"`` -> ``"nccl"`` when at least ``world_size`` CUDA devices are visible (one GPU per
    rank), else ``"gloo"`` (CPU). ``"nccl"`` without enough GPUs raises ``ValueError``.
    """
    check_choice("backend", backend, BACKENDS)
    check_int("world_size", world_size, 1)
    import torch

    n_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if n_gpus >= world_size else "gloo"
    if backend == "nccl" and n_gpus < world_size:
        raise ValueError(
            f"backend='nccl' needs one CUDA device per rank: world_size={world_size} but "
            f"torch.cuda.device_count()={n_gpus}; use backend='gloo' or 'auto'"
        )
    return backend


def device():
    """This rank's ``torch.device``: ``cuda:<LOCAL_RANK>`` under NCCL, else ``cpu``."""
    import torch
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")


# --------------------------------------------------------------------------------------------
# Inside a rank
# --------------------------------------------------------------------------------------------
def run_on_rank(
    fn,
    args,
    kwargs,
    *,
    rank,
    world_size,
    local_rank,
    backend,
    timeout,
    threads,
    store_port=None,
    store_timeout=60.0,
    on_ready=None,
):
    """Set up one rank, run ``fn(*args, **kwargs)`` and tear the process group down.

    Shared by ``launch`` and ``Cluster`` (``store_port``: the port of the caller's rendezvous store on
    ``HOST``, joined as a client within ``store_timeout`` seconds) and by ``python -m mlsys_nb.run`` under
    torchrun (``store_port=None``: rendezvous from MASTER_ADDR/MASTER_PORT, ``env://``). ``timeout``: seconds
    any collective may wait before raising (torch's default is 30 min). ``threads``: intra-op threads for
    this rank. ``on_ready()`` is called once the group is up.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(threads)  # before any op: ranks must not oversubscribe the cores
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
    if store_port is None:
        init = {"init_method": "env://"}
    else:
        store = dist.TCPStore(HOST, store_port, is_master=False, timeout=timedelta(seconds=store_timeout))
        init = {"store": store}
    dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout), **init)
    # Every rank has now connected to every other before fn starts; without this a rank
    # whose fn is quick could exit while a slower peer is still connecting to it.
    dist.barrier()
    if on_ready is not None:
        on_ready()
    value = fn(*args, **kwargs)
    # Only on success: after an error the process exits instead (tearing down a group with
    # collectives still pending can block, e.g. under NCCL).
    dist.destroy_process_group()
    return value


def rank_environment(rank: int, world_size: int, port: int, threads: int) -> None:
    """Set the variables torch.distributed and libraries read (RANK, MASTER_PORT, ...) and keep
    gloo/NCCL sockets on the loopback interface (unless the user chose another)."""
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR=HOST,
        MASTER_PORT=str(port),
        OMP_NUM_THREADS=str(threads),
    )
    if sys.platform.startswith("linux"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def die_with_parent() -> None:
    """Linux: ask the kernel to SIGKILL this process when its parent (the forkserver) exits."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# In the calling process
# --------------------------------------------------------------------------------------------
def context():
    """The multiprocessing context: a forkserver that preloads torch (started on first use)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
    return ctx


def prestart() -> None:
    """Start the forkserver now, so that the first ``launch`` does not wait for it.

    Returns at once; the forkserver imports ``PRELOAD`` (torch, then torch._dynamo: seconds each) in the
    background. Call it in a notebook's import cell. Without it the first ``launch`` waits for those imports ("cold").
    """
    from multiprocessing import forkserver

    context()
    forkserver.ensure_running()


def open_store(start_timeout: float):
    """A TCPStore server in this process, listening on 127.0.0.1 only, on a port the OS picks.

    (``TCPStore(host, 0, is_master=True)`` would listen on every interface, so we bind the
    socket ourselves and hand it over; the store owns and closes it.)
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((HOST, 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    return dist.TCPStore(
        HOST,
        port,
        None,
        is_master=True,
        wait_for_workers=False,
        timeout=timedelta(seconds=start_timeout),
        master_listen_fd=sock.detach(),
    )


_MAIN_SWAP_LOCK = threading.Lock()


@contextlib.contextmanager
def without_main_module():
    """Hide the caller's ``__main__`` while ranks start.

    multiprocessing makes each child re-import the parent's main script (so pickled references
    to ``__main__.f`` resolve). The ranks never need it: cloudpickle sends functions and classes
    of ``__main__`` by value. Re-importing it would re-run a script that lacks an
    ``if __name__ == "__main__"`` guard, and cost time on every launch.
    """
    with _MAIN_SWAP_LOCK:  # two threads launching at once must not restore each other's dummy
        main = sys.modules["__main__"]
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            sys.modules["__main__"] = main
