"""The GPU pack's fixtures: skip everything without CUDA (one line per test), and the record.

Imports only pytest, torch and the standard library at collection time (the GPU machine has no nbval,
IPython, papermill, ...); ``tests/conftest.py``, loaded first as an ancestor, imports only pytest too.
Run from the repository root: ``PYTHONPATH=. python3 -m pytest -o addopts="" -m gpu tests/gpu`` (``make test-gpu``);
the smoke subset first with ``-m "gpu and smoke"``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch


from mlsys_nb.runtime.gpu_record import GpuRecord  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
RECORD_DIR = Path(os.environ.get("GPU_PACK_RECORD_DIR", ROOT / "data" / "measured"))
NO_CUDA = "no CUDA device (torch.cuda.is_available() is False): the GPU pack runs on a GPU machine (make test-gpu)"


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=NO_CUDA))


def _driver() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def _meta() -> dict:
    from importlib import metadata

    from mlsys_nb.runtime.machine import cpu_model

    p = torch.cuda.get_device_properties(0)
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = "not installed"
    return {
        "device": torch.cuda.get_device_name(0),
        "compute capability": f"{p.major}.{p.minor}",
        "driver": _driver(),
        "torch": torch.__version__,
        "CUDA (torch build)": torch.version.cuda,
        "triton": triton,
        "host CPU": cpu_model(),
        "python": sys.version.split()[0],
    }


@pytest.fixture(scope="session")
def gpu_record():
    if not torch.cuda.is_available():
        pytest.skip(NO_CUDA)
    return GpuRecord(RECORD_DIR, _meta())


@pytest.fixture
def record(gpu_record, request):
    """``record(name, value, unit, note="")``: store one measured figure of this test at once."""

    def add(name, value, unit, note=""):
        gpu_record.add(request.node.name, name, value, unit, note)
        print(f"[gpu record] {request.node.name}: {name} = {value} {unit} {note}")

    return add


@pytest.fixture
def cuda():
    """The CUDA device; peak-memory statistics reset, caches emptied, after the test too."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    yield torch.device("cuda", 0)
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
