"""No rank process outlives the kernel that started it: graceful kernel shutdown and SIGKILL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

pytestmark = pytest.mark.slow


def _gone(pids, within_s=15.0):
    """True once none of ``pids`` is a live (non-zombie) process."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        alive = []
        for pid in pids:
            try:
                if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                    alive.append(pid)
            except psutil.NoSuchProcess:
                pass
        if not alive:
            return True
        time.sleep(0.2)
    return False


def test_kernel_shutdown_leaves_no_rank_processes():
    from jupyter_client.manager import start_new_kernel
    from nbrun import kernel_name

    km, kc = start_new_kernel(kernel_name=kernel_name())
    try:
        code = (
            "import json, mlsys_nb\n"
            "c = mlsys_nb.Cluster(world_size=2, timeout=30)\n"
            "print('PIDS', json.dumps(c.pids + [c._procs[0]._popen.__class__.__name__]))"
        )
        lines = []
        reply = kc.execute_interactive(
            code, timeout=120, output_hook=lambda m: lines.append(m["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        found = [l for l in "".join(lines).splitlines() if l.startswith("PIDS ")]
        *pids, popen = json.loads(found[0][5:])
        assert len(pids) == 2 and all(psutil.pid_exists(p) for p in pids), pids
        assert popen == "Popen"  # forkserver Popen
    finally:
        km.shutdown_kernel(now=False)
        kc.stop_channels()
    assert _gone(pids), f"rank processes {pids} survived the kernel shutdown"


def test_sigkilled_parent_leaves_no_rank_processes(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent("""
        import json, sys, time
        import mlsys_nb

        if __name__ == "__main__":
            c = mlsys_nb.Cluster(world_size=2, timeout=30)
            print(json.dumps(c.pids), flush=True)
            time.sleep(120)
    """)
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=str(tmp_path))
    try:
        pids = json.loads(proc.stdout.readline())
        assert all(psutil.pid_exists(p) for p in pids)
        os.kill(proc.pid, signal.SIGKILL)  # no atexit, no finalizers: only the guard helps
        proc.wait(10)
        assert _gone(pids), f"rank processes {pids} survived their SIGKILLed parent"
    finally:
        if proc.poll() is None:
            proc.kill()
