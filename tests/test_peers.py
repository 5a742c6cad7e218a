"""``mlsys_nb.runtime.ports.ServerProcess`` (the one manager of the tests' and the serving benchmark's servers):
every process it starts is gone after the ``with`` (the server and what the server started), on a normal exit and
when the body raises; a server that never answers 200 times out naming the url, one that dies at start reports its
exit code and its output. Stand-in servers (a few lines of ``http.server``), so no model loads."""

import os
import signal
import sys
import time

import psutil
import pytest

from mlsys_nb.runtime.ports import ServerProcess, free_port

# a server that starts a child of its own (as uvicorn workers, or a tokenizer's pool, might), then answers
# /health with 200 and everything else with 404
STAND_IN = """
import http.server, subprocess, sys
subprocess.Popen(["sleep", "120"])
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _start(tmp_path, code, **kw):
    port = free_port()
    cmd = [sys.executable, "-c", code, str(port)]
    return ServerProcess(cmd, f"http://127.0.0.1:{port}", str(tmp_path / "server.log"), **kw)


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


def _wait_gone(pids, timeout=10.0) -> list[int]:
    """The pids still alive after ``timeout`` seconds (a killed orphan is reaped by init asynchronously)."""
    deadline = time.monotonic() + timeout
    while (alive := [p for p in pids if not _gone(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _family(s: ServerProcess) -> list[int]:
    deadline = time.monotonic() + 10
    while not (kids := psutil.Process(s.proc.pid).children(recursive=True)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kids, "the stand-in's child did not start"
    return [s.proc.pid, *(k.pid for k in kids)]


def test_every_process_is_gone_after_a_normal_exit_and_after_an_error(tmp_path):
    with _start(tmp_path, STAND_IN) as s:
        pids = _family(s)
        assert s.cpu_seconds() >= 0
    assert s.proc.returncode is not None and _wait_gone(pids) == []
    with pytest.raises(KeyError, match="the body failed"):
        with _start(tmp_path, STAND_IN) as s:
            pids = _family(s)
            raise KeyError("the body failed")
    assert s.proc.returncode is not None and _wait_gone(pids) == []


def test_killing_only_the_server_leaves_its_child_behind(tmp_path, monkeypatch):
    """The idea broken: signalling the server's pid instead of its process group leaves the child running."""
    from mlsys_nb.runtime import ports

    monkeypatch.setattr(ports.os, "killpg", os.kill)
    with _start(tmp_path, STAND_IN) as s:
        pids = _family(s)
    try:
        assert _wait_gone(pids[:1]) == [] and _wait_gone(pids[1:], timeout=0.5) == pids[1:]
    finally:
        for p in pids[1:]:
            os.kill(p, signal.SIGKILL)


def test_a_server_that_never_answers_times_out_and_is_killed(tmp_path):
    s = _start(tmp_path, "import time; time.sleep(120)", start_timeout=1.0)
    with pytest.raises(TimeoutError, match=r"/health did not answer 200 within timeout_s=1\.0"):
        s.__enter__()
    assert s.proc.returncode == -signal.SIGTERM


def test_a_server_that_dies_at_start_reports_its_exit_code_and_output(tmp_path):
    code = "import sys; print('loading'); sys.exit('error: --model-dir /nowhere: no config.json')"
    s = _start(tmp_path, code, start_timeout=60)
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 1 .*loading.*--model-dir /nowhere: no config.json"):
        s.__enter__()
    assert s.log.closed  # the log file it wrote is closed


def test_the_default_log_is_a_temporary_file_removed_on_exit():
    port = free_port()
    with ServerProcess([sys.executable, "-c", STAND_IN, str(port)], f"http://127.0.0.1:{port}") as s:
        log = s.log_path
        assert os.path.exists(log)
    assert not os.path.exists(log) and _wait_gone([s.proc.pid]) == []
