"""Start real ``torch.distributed`` ranks from a notebook cell.

    import mlsys_nb
    import torch.distributed as dist

    def hello():
        return dist.get_rank() * 10

    mlsys_nb.launch(hello, world_size=4)      # -> [0, 10, 20, 30]

What happens, in order (each step is one function below):

1. ``launch`` checks its arguments and pickles ``fn`` with *cloudpickle* before any process
   starts, so a lambda or closure defined in a notebook cell travels by value (no
   ``if __name__ == "__main__"`` and no module needed).
2. This process opens a ``TCPStore`` on 127.0.0.1 with a port chosen by the OS (port 0): the
   ranks meet there. No fixed port, so two kernels can launch at the same time.
3. ``world_size`` processes are started by a multiprocessing *forkserver* that has torch
   preloaded. The kernel itself is never forked: a forked copy of a kernel that already ran a
   multi-threaded torch op hangs in its first parallel op, and forking after CUDA is initialised
   is unsafe. The forkserver is a small clean process that imported torch once and forks cheaply.
4. Each rank (``_rank_main`` -> ``run_on_rank``) sends its stdout/stderr into pipes, limits its
   intra-op threads, joins the process group, runs ``fn`` and sends back the pickled result or
   the exception with its traceback.
5. This process (``_supervise``) waits on every pipe at once: it prints each rank's output
   prefixed with ``[rank r]``, collects results, and stops everything on the first failure, on
   the timeout (after dumping every rank's Python stack) or on Ctrl-C / kernel interrupt.

Safety nets: ranks die with their parent (``prctl(PR_SET_PDEATHSIG)`` plus a "lifeline" pipe
they watch), collectives time out ``timeout`` + 10 seconds in instead of torch's 30 minutes,
and every process, pipe and port is closed when ``launch`` returns or raises.
"""

from __future__ import annotations

import codecs
import faulthandler
import linecache
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from multiprocessing import connection

import cloudpickle

from ..config import check_choice, check_int, check_seconds
from .ranks import (
    BACKENDS,
    RankError,
    RankFailure,
    RankTimeoutError,
    context,
    device,
    die_with_parent,
    open_store,
    prestart,
    rank_environment,
    resolve_backend,
    run_on_rank,
    without_main_module,
)

__all__ = ["launch", "device", "prestart", "resolve_backend", "RankError", "RankTimeoutError", "OUTPUT_MODES"]

OUTPUT_MODES = ("stream", "grouped", "quiet")
FAILURE_GRACE_S = 2.0  # after the first failure, seconds to let the other ranks report
STACK_WAIT_S = 2.0  # at most this long to collect stack dumps after a timeout


# --------------------------------------------------------------------------------------------
# Argument checks (all of them run before any process starts)
# --------------------------------------------------------------------------------------------
def _pickle_job(fn, args, kwargs) -> bytes:
    """cloudpickle ``(fn, args, kwargs)``; on failure name the part that cannot travel."""
    try:
        return cloudpickle.dumps((fn, args, kwargs))
    except Exception as whole_error:
        for name, part in (("fn", fn), ("args", args), ("kwargs", kwargs)):
            try:
                cloudpickle.dumps(part)
            except Exception as e:
                raise TypeError(
                    f"{name} cannot be pickled to send it to the ranks: {type(e).__name__}: {e}. "
                    "Create such objects (locks, open files, sockets, generators) inside fn instead."
                ) from e
        raise TypeError(f"the job cannot be pickled: {whole_error}") from whole_error


# --------------------------------------------------------------------------------------------
# Inside a rank
# --------------------------------------------------------------------------------------------
def _watch_parent(lifeline_fd: int) -> None:
    """Kill this rank when the launching process dies (its end of the lifeline pipe closes)."""
    while True:
        try:
            if os.read(lifeline_fd, 1) == b"":
                break
        except InterruptedError:
            continue
        except OSError:
            break
    os.kill(os.getpid(), signal.SIGKILL)


_RUNTIME_FILES = (__file__, sys.modules[run_on_rank.__module__].__file__)


def _describe(exc: BaseException, rank: int) -> RankFailure:
    """Turn an exception on a rank into a picklable RankFailure (traceback starts at ``fn``)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _RUNTIME_FILES:
        tb = tb.tb_next  # skip the runtime's own frames: the learner's code comes first
    tb = "".join(traceback.format_exception(type(exc), exc, tb or exc.__traceback__))
    try:
        cloudpickle.loads(cloudpickle.dumps(exc))
        original = exc
    except Exception:
        original = None
    return RankFailure(rank, type(exc).__name__, str(exc), tb, exception=original)


def _rank_main(rank, world_size, port, backend, payload, timeout, start_timeout, threads, pipes):
    """Entry point of a rank process started by ``launch`` (runs in the child)."""
    out_w, err_w, stack_w, result_w, lifeline_r = pipes
    die_with_parent()
    threading.Thread(target=_watch_parent, args=(lifeline_r.fileno(),), daemon=True, name="mlsys_nb-lifeline").start()
    # fds 1 and 2 now lead to the launcher (C-level output, e.g. from gloo, included).
    os.dup2(out_w.fileno(), 1)
    os.dup2(err_w.fileno(), 2)
    out_w.close()
    err_w.close()
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    faulthandler.enable(file=sys.stderr)  # a segfault prints a stack instead of vanishing
    faulthandler.register(signal.SIGUSR1, file=stack_w, all_threads=True)  # the timeout dump
    rank_environment(rank, world_size, port, threads)

    def send(message):
        sys.stdout.flush()
        sys.stderr.flush()
        result_w.send_bytes(cloudpickle.dumps(message))

    try:
        fn, args, kwargs = pickle.loads(payload)
        value = run_on_rank(
            fn,
            args,
            kwargs,
            rank=rank,
            world_size=world_size,
            local_rank=rank,
            backend=backend,
            timeout=timeout,
            threads=threads,
            store_port=port,
            store_timeout=start_timeout,
            on_ready=lambda: send(("ready", os.getpid())),
        )
        try:
            data = cloudpickle.dumps(("ok", value))
        except Exception as e:
            raise TypeError(f"the return value of rank {rank} cannot be pickled: {e}") from e
        sys.stdout.flush()
        sys.stderr.flush()
        result_w.send_bytes(data)
    except BaseException as e:  # noqa: B902 - KeyboardInterrupt/SystemExit are reported too
        send(("error", _describe(e, rank)))
        os._exit(1)  # exit now: peers notice at once ("Connection closed by peer")
    os._exit(0)  # done: skip interpreter teardown (everything was flushed and sent)


# --------------------------------------------------------------------------------------------
# In the calling process
# --------------------------------------------------------------------------------------------
@dataclass
class _Stream:
    """One output pipe of a rank (stdout or stderr), decoded and split into lines."""

    rank: int
    name: str  # "stdout" | "stderr"
    reader: object  # multiprocessing Connection (read end of an os.pipe)
    echo: bool  # print lines as they arrive
    lines: list = field(default_factory=list)
    _decoder: object = field(default_factory=lambda: codecs.getincrementaldecoder("utf-8")("replace"))
    _partial: str = ""
    open: bool = True

    def read(self) -> None:
        try:
            data = os.read(self.reader.fileno(), 65536)
        except (BlockingIOError, InterruptedError):
            return
        if not data:
            self.open = False
            self.reader.close()
        text = self._partial + self._decoder.decode(data, final=not data)
        *complete, self._partial = text.split("\n")
        if not data and self._partial:
            complete.append(self._partial)
            self._partial = ""
        for line in complete:
            self.lines.append(line)
            if self.echo:
                target = sys.stdout if self.name == "stdout" else sys.stderr
                target.write(f"[rank {self.rank}] {line}\n")


@dataclass
class _Rank:
    """The launcher's handle on one rank process."""

    rank: int
    process: object
    result: object  # Connection: messages from the rank
    stack: object  # Connection: faulthandler dumps
    streams: list
    state: str = "starting"  # starting -> ready -> done | failed
    value: object = None
    failure: RankFailure | None = None
    stack_text: str = ""

    @property
    def finished(self) -> bool:
        return self.state in ("done", "failed")

    def receive(self) -> None:
        """Read one message from the rank (call when ``result`` is readable)."""
        if self.finished or not self.result.poll():
            return
        try:
            data = self.result.recv_bytes()
        except (EOFError, OSError):
            self._exited()
            return
        try:
            kind, payload = pickle.loads(data)
        except Exception as e:  # e.g. the class of a returned object does not exist here
            kind, payload = (
                "error",
                RankFailure(self.rank, type(e).__name__, f"cannot unpickle what the rank sent: {e}"),
            )
        if kind == "ready":
            self.state = "ready"
        elif kind == "ok":
            self.state, self.value = "done", payload
        else:
            self.state, self.failure = "failed", payload

    def _exited(self) -> None:
        if not self.finished:
            self.process.join(1.0)
            code = self.process.exitcode
            how = f"signal {signal.Signals(-code).name}" if code is not None and code < 0 else f"code {code}"
            self.state = "failed"
            self.failure = RankFailure(self.rank, "exit", f"process exited with {how} before returning", exitcode=code)

    def on_sentinel(self) -> None:
        """The process ended: read a last message if there is one, else record the early exit."""
        while not self.finished and not self.result.closed and self.result.poll():
            self.receive()
        self._exited()

    def read_stack(self, wait_s: float) -> None:
        """Collect the faulthandler dump until the pipe is quiet for 0.2 s (at most ``wait_s``)."""
        end = time.monotonic() + wait_s
        chunks = []
        while time.monotonic() < end:
            if not self.stack.poll(0.2 if chunks else end - time.monotonic()):
                if chunks:
                    break
                continue
            chunks.append(os.read(self.stack.fileno(), 65536).decode("utf-8", "replace"))
        self.stack_text = with_caller_source(_drop_lifeline_thread("".join(chunks)))

    def stop(self) -> None:
        """Kill the process (if alive), reap it and close every pipe end this side holds."""
        if self.process.is_alive():
            self.process.kill()
        self.process.join(5.0)
        for conn in [self.result, self.stack] + [s.reader for s in self.streams]:
            conn.close()
        if self.process.exitcode is not None:
            self.process.close()


_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in ')


def with_caller_source(text: str) -> str:
    """Add the source line under each ``File "...", line N`` that has none.

    A rank cannot read code typed into a notebook cell (it lives in the kernel's linecache),
    so its tracebacks and stack dumps lack those lines; this process can fill them in.
    """
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        out.append(line)
        match = _FRAME.match(line)
        followed_by_source = i + 1 < len(lines) and lines[i + 1].startswith("    ") and not _FRAME.match(lines[i + 1])
        if match and not followed_by_source:
            source = linecache.getline(match["file"], int(match["line"])).strip()
            if source:
                out.append(" " * (line.index("File") + 2) + source)
    return "\n".join(out)


def _drop_lifeline_thread(dump: str) -> str:
    """Tidy a faulthandler dump: drop the launcher's watcher thread and the frames below ``fn``."""
    blocks = [b for b in dump.strip("\n").split("\n\n") if "_watch_parent" not in b]
    tidy = []
    for block in blocks:
        lines = block.splitlines()
        cut = next((i for i, line in enumerate(lines) if "in run_on_rank" in line), len(lines))
        tidy.append("\n".join(lines[:cut]))
    return "\n\n".join(tidy)


def start_rank(
    ctx, rank, world_size, port, backend, payload, timeout, start_timeout, threads, lifeline_r, echo
) -> _Rank:
    out_r, out_w = ctx.Pipe(duplex=False)
    err_r, err_w = ctx.Pipe(duplex=False)
    stack_r, stack_w = ctx.Pipe(duplex=False)
    result_r, result_w = ctx.Pipe(duplex=False)
    process = ctx.Process(
        target=_rank_main,
        name=f"mlsys_nb-rank-{rank}",
        daemon=True,
        args=(
            rank,
            world_size,
            port,
            backend,
            payload,
            timeout,
            start_timeout,
            threads,
            (out_w, err_w, stack_w, result_w, lifeline_r),
        ),
    )
    try:
        process.start()
    finally:
        for child_end in (out_w, err_w, stack_w, result_w):
            child_end.close()  # the child has its own copies; EOF arrives when it exits
    streams = [_Stream(rank, "stdout", out_r, echo), _Stream(rank, "stderr", err_r, echo)]
    return _Rank(rank, process, result_r, stack_r, streams)


def _check_launch_args(fn, world_size, args, kwargs, backend, timeout, threads, output, start_timeout) -> dict:
    """``launch``'s arguments, checked before any process starts (``TypeError`` / ``ArgumentError`` naming the
    argument); returns ``kwargs`` (``{}`` for ``None``)."""
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    kwargs = {} if kwargs is None else kwargs
    if not isinstance(args, (tuple, list)) or not isinstance(kwargs, dict):
        raise TypeError("args must be a tuple and kwargs a dict")
    check_choice("backend", backend, BACKENDS)
    check_int("world_size", world_size, 1)
    check_seconds("timeout", timeout)
    check_seconds("start_timeout", start_timeout)
    check_int("threads", threads, 1)
    check_choice("output", output, OUTPUT_MODES)
    return kwargs


def launch(
    fn,
    world_size: int = 4,
    *,
    args=(),
    kwargs=None,
    backend: str = "auto",
    timeout: float = 60.0,
    threads: int = 1,
    output: str = "stream",
    start_timeout: float = 60.0,
) -> list:
    """Run ``fn(*args, **kwargs)`` on ``world_size`` fresh ranks; return their results by rank.

    Inside ``fn`` the default process group is initialised (``dist.get_rank()`` etc. work) and
    ``mlsys_nb.device()`` gives the rank's device.

    - ``backend``: ``"auto"`` (NCCL if there is one GPU per rank, else gloo), ``"gloo"``, ``"nccl"``.
    - ``timeout``: seconds ``fn`` may run, counted from the moment every rank has joined the
      process group. On expiry every rank's Python stack is dumped, all ranks are killed and
      ``RankTimeoutError`` (a ``RankError`` and a ``TimeoutError``) is raised. Collectives inside the ranks give up
      10 s later on their own (torch's default would be 30 minutes).
    - ``start_timeout``: seconds the ranks may take to start and join the group.
    - ``threads``: intra-op threads per rank (default 1: ranks share the cores).
    - ``output``: ``"stream"`` prints each rank's lines as they come, prefixed ``[rank r]``;
      ``"grouped"`` prints them after the run, one block per rank; ``"quiet"`` prints nothing.
    Raises ``RankError`` naming the failing rank(s) with their remote traceback when a rank
    fails (all ranks are stopped), and ``ValueError``/``TypeError`` for bad arguments before any
    process starts. Interrupting the kernel kills all ranks before ``KeyboardInterrupt`` propagates.
    Note: cloudpickle copies the globals ``fn`` uses; pass big tensors' *recipes*, not tensors.
    """
    kwargs = _check_launch_args(fn, world_size, args, kwargs, backend, timeout, threads, output, start_timeout)
    payload = _pickle_job(fn, tuple(args), kwargs)
    if backend != "nccl":  # the arguments are valid: the rank factory imports torch while this process does (below)
        prestart()
    backend = resolve_backend(backend, world_size)  # imports torch; "nccl" without the GPUs raises here

    ctx = context()
    # Ranks get 10 s more than the launcher for their collectives, so a hang is caught by the
    # launcher (which dumps stacks) rather than by a rank-side timeout error.
    rank_timeout = timeout + 10.0
    store = open_store(start_timeout)
    lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
    ranks: list[_Rank] = []
    try:
        with without_main_module():  # each rank: a fresh process from the forkserver, told where the store is
            for r in range(world_size):
                job = (r, world_size, store.port, backend, payload, rank_timeout, start_timeout, threads, lifeline_r)
                ranks.append(start_rank(ctx, *job, echo=output == "stream"))
        lifeline_r.close()
        return _supervise(ranks, timeout, start_timeout, output)
    finally:
        lifeline_r.close()
        lifeline_w.close()  # any rank still alive now sees EOF and kills itself
        for rank in ranks:
            rank.stop()
        store = None  # closes the listening socket now (a traceback would keep it alive)


def _supervise(ranks: list[_Rank], timeout: float, start_timeout: float, output: str) -> list:
    """Wait on every rank's pipes and process at once until all finish, one fails, or time runs out."""
    started = time.monotonic()
    deadline = started + start_timeout
    running_since = None
    first_failure_at = None
    while not all(r.finished for r in ranks):
        now = time.monotonic()
        if running_since is None and all(r.state != "starting" for r in ranks):
            running_since = now  # every rank joined the group: fn's clock starts now
            deadline = now + timeout
        if first_failure_at is not None and now >= first_failure_at + FAILURE_GRACE_S:
            break
        if now >= deadline:
            phase = "run" if running_since is not None else "start"
            _raise_timeout(ranks, timeout if phase == "run" else start_timeout, phase, output)
        until = deadline if first_failure_at is None else min(deadline, first_failure_at + FAILURE_GRACE_S)
        waitables = {}
        for r in ranks:
            for s in r.streams:
                if s.open:
                    waitables[s.reader] = s.read
            if not r.finished:
                waitables[r.result] = r.receive
                waitables[r.process.sentinel] = r.on_sentinel
        for ready in connection.wait(list(waitables), timeout=max(0.0, until - now)):
            waitables[ready]()
        if first_failure_at is None and any(r.state == "failed" for r in ranks):
            first_failure_at = time.monotonic()
    _drain_output(ranks, output)
    if any(r.state == "failed" for r in ranks):
        raise _rank_error(ranks)
    return [r.value for r in ranks]


def _drain_output(ranks: list[_Rank], output: str, wait_s: float = 1.0) -> None:
    """Read what the ranks still have in their pipes, then print blocks if ``output="grouped"``."""
    for r in ranks:
        if r.finished and r.state == "done":
            r.process.join(wait_s)
        elif r.process.is_alive():
            r.process.kill()
            r.process.join(wait_s)
    end = time.monotonic() + wait_s
    streams = [s for r in ranks for s in r.streams if s.open]
    while streams and time.monotonic() < end:
        for ready in connection.wait([s.reader for s in streams], timeout=end - time.monotonic()):
            next(s for s in streams if s.reader is ready).read()
        streams = [s for s in streams if s.open]
    if output == "grouped":
        for r in ranks:
            for s in r.streams:
                if s.lines:
                    target = sys.stdout if s.name == "stdout" else sys.stderr
                    target.write(f"----- rank {r.rank} {s.name} -----\n" + "\n".join(s.lines) + "\n")


def _rank_error(ranks: list[_Rank]) -> RankError:
    """Build the error: real causes with their remote tracebacks, collateral damage summarised."""
    failed = sorted((r for r in ranks if r.failure is not None), key=lambda r: r.rank)
    causes = [r.failure for r in failed if not r.failure.is_collateral()] or [failed[0].failure]
    cause_ranks = {f.rank for f in causes}
    consequences = {}
    for r in ranks:
        if r.rank in cause_ranks:
            continue
        if r.failure is not None:
            consequences[r.rank] = r.failure.summary()
        elif r.state == "done":
            consequences[r.rank] = f"rank {r.rank}: finished normally"
        else:
            consequences[r.rank] = f"rank {r.rank}: stopped by the launcher"
    names = ", ".join(str(f.rank) for f in causes)
    lines = [f"rank{'s' if len(causes) > 1 else ''} {names} failed; all ranks were stopped."]
    for f in causes:
        body = with_caller_source(f.traceback.rstrip()) or f"{f.type_name}: {f.message}"
        lines += ["", f"--- rank {f.rank}: remote traceback ---", body]
    if consequences:
        lines += ["", "Consequences on the other ranks (not causes):"]
        lines += [f"  {text}" for _, text in sorted(consequences.items())]
    error = RankError("\n".join(lines), failures={f.rank: f for f in causes}, consequences=consequences)
    if causes[0].exception is not None:
        error.__cause__ = causes[0].exception
    return error


def _raise_timeout(ranks: list[_Rank], limit: float, phase: str, output: str):
    """Dump the stack of every rank still running (SIGUSR1 -> faulthandler), kill all, raise."""
    stuck = [r for r in ranks if not r.finished and r.process.is_alive()]
    for r in stuck:
        os.kill(r.process.pid, signal.SIGUSR1)
    for r in stuck:
        r.read_stack(STACK_WAIT_S)
    for r in ranks:
        if r.process.is_alive():
            r.process.kill()
    _drain_output(ranks, output)
    what = "finish fn" if phase == "run" else "start and join the process group"
    lines = [
        f"ranks {', '.join(str(r.rank) for r in stuck)} did not {what} within {limit:g} s; "
        "all ranks were killed. Python stack of each (most recent call first):"
    ]
    for r in stuck:
        lines += ["", f"--- rank {r.rank} ---", r.stack_text or "(no stack dump received)"]
    done = [r.rank for r in ranks if r.state == "done"]
    if done:
        lines += ["", f"ranks {done} had already returned."]
    raise RankTimeoutError("\n".join(lines), stacks={r.rank: r.stack_text for r in stuck})
