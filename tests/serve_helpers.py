"""Starting the OpenAI-compatible server as a real process for the tests (tests/test_server.py,
tests/test_server_robust.py): a free loopback port, a wait on ``/health`` with a timeout, and a
clean stop (terminate, then kill) whatever the test did."""

import contextlib
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_health(url: str, proc=None, timeout: float = 120) -> None:
    """Poll ``url/health`` until it answers 200; raise if ``proc`` exits or ``timeout`` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {proc.stdout.read()}")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"the server did not answer /health within {timeout} s")
        time.sleep(0.2)


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
    """``python -m mlsys_nb.inference.serve --model MODEL --port <free> *args``; yields ``(url, proc)``."""
    port = free_port()
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "mlsys_nb.inference.serve", "--model", model, "--port", str(port), *args]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_health(url, proc)
        yield url, proc
    finally:
        stop_process(proc)
