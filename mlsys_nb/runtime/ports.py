"""Loopback ports and waiting for a server: the two helpers every started server (the kit's OpenAI server,
``transformers serve``, Voilà, a torchrun rendezvous) needs.

- ``free_port(host)``: a TCP port nobody listens on now (the OS picks it; another process may still take it
  before the caller binds: bind soon after).
- ``wait_http_ok(url, timeout_s, proc)``: poll ``url`` with GET until it answers 200; a clear error when it
  never does (``TimeoutError`` naming the url and the timeout) or when the server process died first
  (``RuntimeError`` with its exit code and the tail of its output).
- ``skipped_imports_dir()``: a directory to put first on a child's ``PYTHONPATH`` so that it skips slow optional
  imports it never uses (``SKIPPED_IMPORTS``).
- ``ServerProcess(cmd, url)``: the one way the kit starts a server process (the tests' servers, the serving
  benchmark's three): its own process group, ready when ``url/health`` answers 200, the whole group stopped on exit.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

from ..config import check_number

__all__ = ["SKIPPED_IMPORTS", "ServerProcess", "free_port", "skipped_imports_dir", "wait_http_ok"]

TAIL_CHARS = 2000  # characters of a dead process's output quoted in the error


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port on ``host`` (the kit binds servers to the loopback address only)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _output_tail(proc: subprocess.Popen, log_path: str | os.PathLike | None) -> str:
    """The last ``TAIL_CHARS`` characters of what the dead ``proc`` wrote: its stderr pipe, else its stdout pipe
    (stderr redirected there), else the file ``log_path``; "" when none was kept."""
    text = ""
    pipe = proc.stderr if proc.stderr is not None else proc.stdout
    if pipe is not None:
        try:  # non-blocking: a child of the dead process may still hold the pipe open (then read() never ends)
            os.set_blocking(pipe.fileno(), False)
            out = pipe.read()  # what is buffered now; None when nothing is
        except (OSError, ValueError):
            out = ""
        text = out.decode(errors="replace") if isinstance(out, bytes) else out or ""
    elif log_path is not None:
        try:
            with open(log_path, errors="replace") as f:
                text = f.read()
        except OSError:
            text = ""
    return text[-TAIL_CHARS:]


def wait_http_ok(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    *,
    interval_s: float = 0.2,
    log_path: str | os.PathLike | None = None,
) -> None:
    """Return once a GET of ``url`` answers 200. Raise ``RuntimeError`` (exit code and output tail: ``proc``'s
    stderr or stdout pipe, else the file ``log_path``) if ``proc`` exits first, ``TimeoutError`` naming ``url``
    and ``timeout_s`` (seconds) if no 200 came by then. Polls every ``interval_s`` seconds, each GET bounded by
    the time left (at most 2 s)."""
    check_number("timeout_s", timeout_s, 0, lo_open=True, unit="seconds")
    check_number("interval_s", interval_s, 0, lo_open=True, unit="seconds")
    deadline = time.monotonic() + timeout_s
    while True:
        if proc is not None and proc.poll() is not None:
            tail = _output_tail(proc, log_path)
            raise RuntimeError(
                f"the server process for {url} exited with code {proc.returncode} before answering 200"
                + (f"; its output ends with:\n{tail}" if tail else "")
            )
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{url} did not answer 200 within timeout_s={timeout_s} s")
        try:
            with urllib.request.urlopen(url, timeout=min(2.0, left)) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            if isinstance(e, ValueError):  # not a URL at all: no wait will fix it
                raise ValueError(f"url={url!r} is not an http(s) URL") from e
        time.sleep(min(interval_s, max(0.0, deadline - time.monotonic())))


class ServerProcess:
    """``with ServerProcess(cmd, url, log_path) as s:`` starts ``cmd`` in a new process group (its output to
    ``log_path``, by default a temporary file removed on exit) and waits at most ``start_timeout`` seconds for
    ``url/health`` to answer 200 (``wait_http_ok``: a ``TimeoutError``, or a ``RuntimeError`` with the exit code and
    the log's tail if the server dies first). On exit, also when the body or the start raised, the whole group is
    stopped: SIGTERM, SIGKILL after ``stop_timeout`` seconds, and SIGKILL for anything of the group still there once
    the server has exited. ``s.cpu_seconds()``: user + system CPU seconds of the process and its children so far;
    ``s.proc``: the ``Popen``; ``s.log``: the open log file (closed on exit)."""

    def __init__(
        self,
        cmd,
        url: str,
        log_path: str | os.PathLike | None = None,
        start_timeout: float = 180.0,
        env=None,
        stop_timeout: float = 10.0,
    ):
        check_number("start_timeout", start_timeout, 0, lo_open=True, unit="seconds")
        check_number("stop_timeout", stop_timeout, 0, lo_open=True, unit="seconds")
        self.cmd, self.url, self.log_path, self.start_timeout = list(cmd), url, log_path, start_timeout
        self.stop_timeout = stop_timeout
        self.env = dict(os.environ, **(env or {}))
        self.proc, self.log, self._own_log = None, None, log_path is None

    def __enter__(self):
        if self._own_log:  # a temporary file, removed on exit
            fd, self.log_path = tempfile.mkstemp(prefix="server-", suffix=".log")
            os.close(fd)
        self.log = open(self.log_path, "w")
        try:
            self.proc = subprocess.Popen(
                self.cmd, stdout=self.log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
            )
            wait_http_ok(self.url + "/health", self.start_timeout, self.proc, interval_s=0.5, log_path=self.log_path)
        except BaseException:
            self.__exit__()
            raise
        return self

    def cpu_seconds(self) -> float:
        import psutil

        p = psutil.Process(self.proc.pid)
        procs = [p, *p.children(recursive=True)]
        return sum(sum(q.cpu_times()[:2]) for q in procs)

    def __exit__(self, *exc):
        try:
            if self.proc is not None:
                for sig in (signal.SIGTERM, signal.SIGKILL):
                    try:
                        os.killpg(self.proc.pid, sig)  # the group: the server and whatever it started
                    except ProcessLookupError:
                        break  # nothing of the group is left
                    try:
                        self.proc.wait(timeout=self.stop_timeout)
                    except subprocess.TimeoutExpired:
                        continue
                    with contextlib.suppress(ProcessLookupError):  # the server is gone: its leftovers too
                        os.killpg(self.proc.pid, signal.SIGKILL)
                    break
                self.proc.wait(timeout=self.stop_timeout)
        finally:
            if self.log is not None:
                self.log.close()
            if self._own_log and self.log_path is not None:
                with contextlib.suppress(OSError):
                    os.remove(self.log_path)


# Modules that started processes (Ray's, Voila's server) import only as an optional extra and never use, each slow
# to import.
# ``rfc3987_syntax``: ``import ray`` imports ``jsonschema`` (runtime_env schemas), whose format module
# imports ``rfc3987_syntax`` when it is installed (Jupyter's ``jupyter-events`` pulls it in); it builds three
# Earley parsers at import (measured: 3.7 s of CPU for ``python -c "import rfc3987_syntax"`` on a loaded
# 2-core machine) for the "iri" format checks, and Ray validates no formats.
SKIPPED_IMPORTS = ("rfc3987_syntax",)


def skipped_imports_dir() -> str:
    """A new temporary directory holding, for each module of ``SKIPPED_IMPORTS``, a module of that name whose
    import raises ``ImportError`` (as if it were not installed: ``jsonschema`` then leaves out those optional
    format checks). Put first on a child's ``PYTHONPATH`` (``rl.placement.ray_session``'s Ray processes, the
    browser test's Voila server); the caller deletes it."""
    path = tempfile.mkdtemp(prefix="mlsys_nb_ray_skip_")
    for name in SKIPPED_IMPORTS:
        with open(os.path.join(path, name + ".py"), "w") as f:
            f.write(f"raise ImportError('{name}: left out by mlsys_nb.runtime.ports.skipped_imports_dir')\n")
    return path
