"""The GPU pack's CPU dry run (tests/gpu, ``make test-gpu``): under the GPU machine's constraints (no nbval,
IPython, papermill, jsonschema, outlines-core, fastapi, gymnasium, ray; no pytest plugins; no CUDA) every
pack module imports, every test carries the ``gpu`` marker (none deselected by ``-m gpu``) and every test
skips with the one no-CUDA reason. And the record writer keeps figures of different devices apart."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))

from gpu_record import GpuRecord, device_slug  # noqa: E402

ABSENT = ["IPython", "nbval", "papermill", "jsonschema", "outlines_core", "fastapi", "gymnasium", "ray"]
# Installs an import blocker for ABSENT, proves it blocks, then runs the pack as the GPU machine would.
RUNNER = """
import importlib.abc, sys
ABSENT = set({absent!r})
class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {{name!r}} (absent on the GPU machine)")
sys.meta_path.insert(0, Absent())
for m in ABSENT:
    try:
        __import__(m)
    except ImportError:
        pass
    else:
        raise SystemExit(f"the blocker let {{m}} through")
import pytest
sys.exit(pytest.main(["-o", "addopts=", "-p", "no:cacheprovider", "-rs", "-m", "gpu", "tests/gpu"]))
"""


def test_pack_imports_collects_and_skips_without_cuda():
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "HOME", "LANG", "TMPDIR")}
    env.update(PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="", PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    code = RUNNER.format(absent=ABSENT)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out[-3000:]
    collected = int(re.search(r"collected (\d+) items?", out).group(1))
    assert "deselected" not in out, "a pack test lacks the gpu marker:\n" + out[-2000:]
    assert re.search(rf"\b{collected} skipped\b", out) and "error" not in out.lower(), out[-2000:]
    assert collected >= 30, out[-2000:]
    reasons = set(re.findall(r"SKIPPED \[\d+\] [^:]+(?::\d+)?: (.*)", out))
    assert reasons == {
        "no CUDA device (torch.cuda.is_available() is False): the GPU pack runs on a GPU machine (make test-gpu)"
    }


def test_record_writes_figure_by_figure_and_never_mixes_devices(tmp_path):
    h100 = GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3", "torch": "x"})
    h100.add("test_a", "bf16 matmul", 700.5, "TFLOP/s")
    data = json.loads((tmp_path / "gpu-h100-80gb-hbm3.json").read_text())
    assert [f["value"] for f in data["figures"]] == [700.5]  # on disk after the first figure
    h100.add("test_a", "bf16 matmul", 710.0, "TFLOP/s")  # a rerun replaces its own figure
    h100.add("test_b", "copy", 3.0, "TB/s")
    again = GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"})
    assert [(f["name"], f["value"]) for f in again.figures] == [("bf16 matmul", 710.0), ("copy", 3.0)]
    assert "| test_b | copy | 3 | TB/s |" in (tmp_path / "gpu-h100-80gb-hbm3.md").read_text()
    GpuRecord(tmp_path, {"device": "NVIDIA H200"}).add("test_a", "bf16 matmul", 720.0, "TFLOP/s")
    assert json.loads((tmp_path / "gpu-h100-80gb-hbm3.json").read_text())["figures"][0]["value"] == 710.0
    # a record whose stored device differs is refused (the check that keeps H100 and H200 apart)
    forged = tmp_path / "gpu-h200.json"
    forged.write_text(json.dumps({"meta": {"device": "NVIDIA H100 80GB HBM3"}, "figures": []}))
    with pytest.raises(ValueError, match="never mixed"):
        GpuRecord(tmp_path, {"device": "NVIDIA H200"})
    assert device_slug("NVIDIA H100 80GB HBM3") != device_slug("NVIDIA H200")
    with pytest.raises(ValueError, match="name"):
        device_slug("  ")
    with pytest.raises(TypeError, match="value"):
        h100.add("t", "n", [1], "x")
