"""The dashboard's kernels are culled (issue 53: every page load left a ~182 MiB kernel running; 10 loads held
1.8 GiB). Voilà runs with the ``make dashboard`` target's own kernel-manager flags, read from ``make -n`` with
short times: an open page keeps its kernel however idle, a closed page's kernel is gone within the cull time."""

import os
import re
import subprocess
import time
import urllib.parse

import pytest

from browser import ROOT, START_TIMEOUT_S, browser_page, chromium_available, voila_server

pytestmark = [pytest.mark.browser, pytest.mark.slow]
IDLE_S, INTERVAL_S = 6, 2  # the test's cull times (the Makefile's defaults: 120 s and 30 s)
CULL_WITHIN_S = IDLE_S + 2 * INTERVAL_S + 10  # idle time, a check interval late, slack for a busy machine


def dashboard_cull_flags(idle_s: int, interval_s: int) -> list[str]:
    """The ``--MappingKernelManager.*`` flags the Makefile's ``dashboard`` target passes to Voilà."""
    out = subprocess.run(
        ["make", "-n", "dashboard", f"DASHBOARD_CULL_IDLE_S={idle_s}", f"DASHBOARD_CULL_INTERVAL_S={interval_s}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return re.findall(r"--MappingKernelManager\.\S+", out)


def kernel_pids(url: str) -> list[int]:
    """The kernels (child processes) of the Voilà serving ``url``, from /proc."""
    port = urllib.parse.urlparse(url).port
    procs = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            parent = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        procs[int(pid)] = (parent, cmd)
    voila = [p for p, (_, cmd) in procs.items() if "voila" in cmd and f"--port={port}" in cmd]
    return [p for p, (parent, cmd) in procs.items() if parent in voila and "kernel" in cmd]


def wait_until_no_kernel(url: str) -> float:
    """Seconds until the Voilà at ``url`` has no kernel left (gives up at ``CULL_WITHIN_S``)."""
    start = time.monotonic()
    while kernel_pids(url) and time.monotonic() - start < CULL_WITHIN_S:
        time.sleep(0.5)
    return time.monotonic() - start


def test_the_dashboard_target_culls_idle_disconnected_kernels():
    flags = dashboard_cull_flags(120, 30)
    assert "--MappingKernelManager.cull_idle_timeout=120" in flags
    assert "--MappingKernelManager.cull_interval=30" in flags
    assert "--MappingKernelManager.cull_connected=False" in flags  # an open page keeps its kernel


def test_a_closed_pages_kernel_is_gone_within_the_cull_time(tmp_path):
    if not chromium_available():
        if os.environ.get("CI"):
            pytest.fail("chromium is missing in CI")
        pytest.skip("no chromium on this machine")
    with voila_server(log_path=tmp_path / "voila.log", args=dashboard_cull_flags(IDLE_S, INTERVAL_S)) as url:
        # the server's start-up probe (one GET of the page, no websocket ever) left a kernel: it goes too
        assert wait_until_no_kernel(url) < CULL_WITHIN_S, "the start-up probe's kernel was never culled"
        with browser_page() as page:
            page.goto(url, timeout=START_TIMEOUT_S * 1000)
            page.wait_for_selector(".mlsys-panel-memory", timeout=START_TIMEOUT_S * 1000)
            assert len(kernel_pids(url)) == 1
            time.sleep(IDLE_S + 2 * INTERVAL_S)  # idle past the timeout, but connected: kept
            assert len(kernel_pids(url)) == 1, "an open page's kernel was culled"
        waited = wait_until_no_kernel(url)
        assert waited < CULL_WITHIN_S, f"the kernel outlived its page by {waited:.0f} s"
        assert "Culling" in (tmp_path / "voila.log").read_text()
