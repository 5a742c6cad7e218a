"""Every benchmark script runs in its ``--quick`` mode (seconds), so none can rot unnoticed.

``make bench`` runs them in full; here only that each one starts, measures and prints its table. No
timing is asserted (the machine is shared): quick modes skip targets and never write records.

The scripts run two at a time (a module fixture starts every selected one on a pool of 2 threads, each
test waits for its own): a quick run is mostly imports and one torch thread, so on 2 cores two of them
take about the time of one.
"""

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))
WORKERS = min(2, os.cpu_count() or 1)


def _data_status() -> str:
    return subprocess.run(["git", "status", "--porcelain", "data"], cwd=ROOT, capture_output=True, text=True).stdout


def _run_quick(name: str) -> tuple[str, subprocess.CompletedProcess, str]:
    """``benchmarks/<name> --quick`` in a subprocess, with ``git status data`` right before it and right after."""
    before = _data_status()
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{name}", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return before, proc, _data_status()


@pytest.fixture(scope="module")
def quick_runs(request):
    """``{script: future of _run_quick}`` for the selected scripts, started two at a time in test order."""
    names = [
        item.callspec.params["name"]
        for item in request.session.items
        if getattr(item, "originalname", None) == "test_benchmark_runs_quick"
    ]
    pool = ThreadPoolExecutor(max_workers=WORKERS)
    yield {name: pool.submit(_run_quick, name) for name in names}
    pool.shutdown(wait=True, cancel_futures=True)


def test_the_machine_line_names_torchs_version_without_importing_torch(monkeypatch):
    """A driver that only launches ranks reads torch's version from its installed distribution."""
    import torch

    from mlsys_nb.runtime.machine import info

    monkeypatch.delitem(sys.modules, "torch")  # as in a process that never imported it
    assert info()["torch"] == torch.__version__
    assert "torch" not in sys.modules


def test_there_are_benchmarks_and_each_has_a_quick_mode():
    assert SCRIPTS, "no benchmarks found"
    for name in SCRIPTS:
        assert "--quick" in (ROOT / "benchmarks" / name).read_text(), f"benchmarks/{name} has no --quick mode"


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_runs_quick(name, quick_runs):
    before, proc, after = quick_runs[name].result()
    assert proc.returncode == 0, f"benchmarks/{name} --quick failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"benchmarks/{name} --quick printed nothing"
    assert after == before, f"benchmarks/{name} --quick (or the script running beside it) changed data/: {after}"
