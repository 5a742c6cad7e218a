"""Every benchmark script runs in its ``--quick`` mode (seconds), so none can rot unnoticed.

``make bench`` runs them in full; here only that each one starts, measures and prints its table. No
timing is asserted (the machine is shared): quick modes skip targets and never write records.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p.name for p in (ROOT / "benchmarks").glob("*.py") if not p.name.startswith("_"))


def test_there_are_benchmarks_and_each_has_a_quick_mode():
    assert SCRIPTS, "no benchmarks found"
    for name in SCRIPTS:
        assert "--quick" in (ROOT / "benchmarks" / name).read_text(), f"benchmarks/{name} has no --quick mode"


@pytest.mark.slow
@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_runs_quick(name):
    before = subprocess.run(["git", "status", "--porcelain", "data"], cwd=ROOT, capture_output=True, text=True).stdout
    env = dict(os.environ, MPLBACKEND="Agg")
    proc = subprocess.run(
        [sys.executable, f"benchmarks/{name}", "--quick"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, f"benchmarks/{name} --quick failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"benchmarks/{name} --quick printed nothing"
    after = subprocess.run(["git", "status", "--porcelain", "data"], cwd=ROOT, capture_output=True, text=True).stdout
    assert after == before, f"benchmarks/{name} --quick changed data/: {after}"
