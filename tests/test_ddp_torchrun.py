"""The same DDP/ZeRO implementations started by torchrun (``mlsys_nb.run``) instead of the launcher."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys

import pytest

from mlsys_nb.runtime.ports import free_port


@pytest.mark.slow
def test_ddp_and_zero_under_torchrun_equal_single_process():
    command = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "mlsys_nb.run",
        "mlsys_nb.parallel.harness:max_differences",
        "--timeout",
        "60",
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = {
        int(m.group(1)): ast.literal_eval(m.group(2))
        for m in re.finditer(r"^\[rank (\d+)\] result: (.*)$", proc.stdout, re.M)
    }
    assert sorted(results) == [0, 1], proc.stdout[-2000:]
    for rank, diffs in results.items():
        assert set(diffs) == {"ddp", "zero1", "zero2", "zero3"}, diffs
        for impl, d in diffs.items():
            assert d < 1e-5, f"rank {rank} {impl} under torchrun: max parameter difference {d:.3g}"
