"""Starting the OpenAI-compatible server as a real process for the tests (tests/test_server.py,
tests/test_server_robust.py): a free loopback port and ``mlsys_nb.runtime.ports.ServerProcess`` (a wait on
``/health`` with a timeout, the process group stopped whatever the test did); ``stop_process`` for other servers;
``load_scaled`` for a wait that must hold beside busy processes."""

import contextlib
import os
import subprocess
import sys
from pathlib import Path

from mlsys_nb.runtime.ports import ServerProcess, free_port, wait_http_ok

ROOT = Path(__file__).resolve().parent.parent
__all__ = ["ROOT", "free_port", "load_scaled", "serve_process", "stop_process", "wait_health"]


def load_scaled(seconds: float) -> float:
    """``seconds`` (a bound for a quiet machine) times the load per core: the 1-minute load average over the cores,
    at least 1. Beside two busy processes on 2 cores a process gets about half the CPU it gets alone, and the
    waits of a start-up (imports, forks) stretch with it. Only for bounds against a hang, never a timing check:
    a hang still fails, later. 1 where the OS reports no load average."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        load = 0.0
    return seconds * max(1.0, load / (os.cpu_count() or 1))


def wait_health(url: str, proc=None, timeout: float = 120) -> None:
    """Wait until ``url/health`` answers 200 (``ports.wait_http_ok``: a ``RuntimeError`` with the output's tail if
    ``proc`` exits first, a ``TimeoutError`` after ``timeout`` seconds)."""
    wait_http_ok(url + "/health", timeout, proc)


def stop_process(proc: subprocess.Popen, timeout: float = 15) -> None:
    """Terminate ``proc``; kill it if it has not exited within ``timeout`` seconds; reap it."""
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)


@contextlib.contextmanager
def serve_process(*args: str, model: str = "tiny"):
    """``python -m mlsys_nb.inference.serve --model MODEL --port <free> *args`` under ``ports.ServerProcess`` (its own
    process group, stopped with it whatever the test did); yields ``(url, proc)``."""
    port = free_port()
    env = {"PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    cmd = [sys.executable, "-m", "mlsys_nb.inference.serve", "--model", model, "--port", str(port), *args]
    url = f"http://127.0.0.1:{port}"
    with ServerProcess(cmd, url, start_timeout=120, env=env, stop_timeout=15) as server:
        yield url, server.proc
