"""mlsys_nb.launch inside a real Jupyter kernel: interrupting the kernel stops every rank."""

import re
import time

import psutil
import pytest

import jupyter_client  # noqa: E402  (in the test extra: a missing install must fail, not skip)

CELL = """
def sleeper():
    print("pid", os.getpid(), flush=True)
    time.sleep(100)

mlsys_nb.launch(sleeper, 2, timeout=200)
"""


@pytest.mark.slow
def test_kernel_interrupt_stops_all_ranks_and_the_next_launch_works():
    km, kc = jupyter_client.manager.start_new_kernel(kernel_name="mlsys_nb")
    try:
        reply = kc.execute_interactive("import os, time, mlsys_nb, torch.distributed as dist", timeout=120)
        assert reply["content"]["status"] == "ok"
        msg_id = kc.execute(CELL)
        text, pids = "", []
        while len(pids) < 2:  # the ranks print their pids: streamed into the cell while it runs
            msg = kc.get_iopub_msg(timeout=120)
            if msg["msg_type"] == "stream" and msg["parent_header"].get("msg_id") == msg_id:
                text += msg["content"]["text"]
                pids = [int(p) for p in re.findall(r"\[rank \d\] pid (\d+)", text)]
        ranks = [psutil.Process(pid) for pid in pids]
        interrupted_at = time.monotonic()
        km.interrupt_kernel()  # what the stop button sends (SIGINT to the kernel's process group)
        error = None
        while True:
            msg = kc.get_iopub_msg(timeout=60)
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "error":
                error = msg["content"]["ename"]
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                break
        stopped_after_s = time.monotonic() - interrupted_at
        alive = [p.pid for p in ranks if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        print(f"cell ended {stopped_after_s:.2f} s after the interrupt")
        # README: "interrupting the kernel stops them within 2 s"; a generous bound for a shared 2-core
        # machine, which a launcher waiting for its 200 s timeout or the 100 s sleep would miss.
        assert stopped_after_s < 10, f"the cell ended {stopped_after_s:.1f} s after the interrupt (README: 2 s)"
        assert error == "KeyboardInterrupt"
        assert alive == [], f"ranks {alive} survived the kernel interrupt"
        reply = kc.execute_interactive("assert mlsys_nb.launch(lambda: dist.get_rank(), 2) == [0, 1]", timeout=120)
        assert reply["content"]["status"] == "ok", "the launcher did not recover after the interrupt"
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
