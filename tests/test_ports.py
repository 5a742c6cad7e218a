"""``mlsys_nb.runtime.ports``: a free loopback port, and the wait for a server's 200 with its three endings
(answered, timed out, the process died first). A stand-in HTTP server in a thread; all sub-second."""

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from mlsys_nb.runtime.ports import free_port, wait_http_ok


@contextlib.contextmanager
def stand_in(statuses):
    """A loopback HTTP server answering GETs with ``statuses`` in order (the last one forever); yields
    (url, the list of statuses it sent)."""
    sent = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self):
            code = statuses[min(len(sent), len(statuses) - 1)]
            sent.append(code)
            self.send_response(code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    th.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/health", sent
    finally:
        srv.shutdown()
        srv.server_close()
        th.join(timeout=5)


def test_free_port_is_bindable_on_loopback():
    ports = {free_port() for _ in range(3)}
    for p in ports:
        assert 1024 <= p <= 65535
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))  # nobody holds it
    with pytest.raises(OSError):
        free_port("192.0.2.1")  # TEST-NET-1: not an address of this machine


def test_wait_returns_at_the_first_200_not_at_any_answer():
    """503, 503, then 200: exactly three GETs. A wait that took any HTTP answer as ready would stop after one."""
    with stand_in([503, 503, 200]) as (url, sent):
        wait_http_ok(url, timeout_s=30, interval_s=0.01)
        assert sent == [503, 503, 200]


def test_wait_times_out_naming_url_and_timeout():
    with stand_in([503]) as (url, sent):
        with pytest.raises(TimeoutError, match=r"/health.*timeout_s=0\.3"):
            wait_http_ok(url, timeout_s=0.3, interval_s=0.02)
        assert len(sent) >= 2 and set(sent) == {503}  # it kept asking until the deadline
    url = f"http://127.0.0.1:{free_port()}/health"  # nobody listens
    with pytest.raises(TimeoutError, match=str(url.split(":")[-1])):
        wait_http_ok(url, timeout_s=0.2, interval_s=0.02)


def _dying(**kw):
    code = "import sys; sys.stderr.write('boom: the model dir is missing\\n'); sys.exit(3)"
    proc = subprocess.Popen([sys.executable, "-c", code], **kw)
    proc.wait(timeout=30)
    return proc


def test_dead_process_reports_exit_code_and_stderr_tail(tmp_path):
    url = f"http://127.0.0.1:{free_port()}/health"
    proc = _dying(stderr=subprocess.PIPE, text=True)
    with pytest.raises(RuntimeError, match=r"(?s)exited with code 3.*boom: the model dir is missing"):
        wait_http_ok(url, timeout_s=60, proc=proc)
    proc = _dying(stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # bytes, stderr folded into stdout
    with pytest.raises(RuntimeError, match="boom"):
        wait_http_ok(url, timeout_s=60, proc=proc)
    log = tmp_path / "server.log"
    with open(log, "w") as f:
        proc = _dying(stdout=f, stderr=subprocess.STDOUT)
    with pytest.raises(RuntimeError, match=r"(?s)code 3.*boom"):
        wait_http_ok(url, timeout_s=60, proc=proc, log_path=log)
    # the idea broken (the process not watched): the same dead server is only found out at the deadline
    with pytest.raises(TimeoutError):
        wait_http_ok(url, timeout_s=0.2, interval_s=0.02)


def test_bad_arguments_name_the_parameter():
    with pytest.raises(ValueError, match="timeout_s"):
        wait_http_ok("http://127.0.0.1:1/", timeout_s=0)
    with pytest.raises(ValueError, match="interval_s"):
        wait_http_ok("http://127.0.0.1:1/", timeout_s=1, interval_s=-1)
    with pytest.raises(ValueError, match="url="):
        wait_http_ok("not a url", timeout_s=1)


def test_a_dead_server_whose_child_holds_the_pipe_does_not_hang_the_wait():
    """The server exits, its child keeps stderr open for 10 minutes: the error still comes, with what was
    written (a blocking read of the pipe would wait for the child)."""
    code = "import subprocess, sys; sys.stderr.write('boom\\n'); sys.stderr.flush(); subprocess.Popen(['sleep', '600'])"
    proc = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, start_new_session=True)
    raised = []

    def wait():
        try:
            wait_http_ok(f"http://127.0.0.1:{free_port()}/health", 30, proc)
        except RuntimeError as e:
            raised.append(str(e))

    try:
        proc.wait(timeout=30)
        t = threading.Thread(target=wait, daemon=True)
        t.start()
        t.join(60)  # a hang detector (the child holds the pipe for 600 s), not a timing claim
        assert not t.is_alive(), "wait_http_ok blocked on the dead server's pipe"
        assert raised and "boom" in raised[0] and "exited with code 0" in raised[0]
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.stderr.close()
