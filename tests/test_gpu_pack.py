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

from mlsys_nb.runtime import gpu_record  # noqa: E402
from mlsys_nb.runtime.gpu_record import GpuRecord, device_slug  # noqa: E402

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


def test_notebook_gpu_cells_read_back_what_the_pack_recorded(tmp_path):
    """The notebooks' GPU cells (``gpu_record.gpu_cell``) show every recorded figure of the tests they
    name, parametrized runs included, with the device; with no record they say so and how to make one."""
    empty = gpu_record.gpu_cell("test_cuda_graph_speedup", tmp_path, cuda=False)
    assert empty.startswith("No GPU figure recorded yet for test_cuda_graph_speedup") and "make test-gpu" in empty
    GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"}).add("test_cuda_graph_speedup[8]", "speed-up", 2.5, "x")
    GpuRecord(tmp_path, {"device": "NVIDIA H200"}).add("test_cuda_graph_speedup[32]", "speed-up", 1.7, "x")
    GpuRecord(tmp_path, {"device": "NVIDIA H200"}).add("test_cuda_graph_speedup_other", "speed-up", 9.0, "x")
    rows = gpu_record.lookup("test_cuda_graph_speedup", directory=tmp_path)
    assert sorted((r["device"], r["value"]) for r in rows) == [("NVIDIA H100 80GB HBM3", 2.5), ("NVIDIA H200", 1.7)]
    table = gpu_record.gpu_cell([("test_cuda_graph_speedup", "speed")], tmp_path)
    assert "| NVIDIA H200 | test_cuda_graph_speedup[32] | speed-up | 1.7 | x |" in table and "_other" not in table
    assert gpu_record.lookup("test_cuda_graph_speedup", "latency", tmp_path) == []
    with pytest.raises(ValueError, match="test"):
        gpu_record.lookup("cuda_graph", directory=tmp_path)
    assert gpu_record.RECORD_DIR == ROOT / "data" / "measured"


def test_a_pipe_in_a_figure_name_stays_inside_its_cell(tmp_path):
    """A figure named ``max |GPU - CPU|`` (notebook 23's quantize-on-the-GPU figures) keeps the table's columns:
    the record's Markdown and the notebook cell's table have as many cells per row as their header (a ``|``
    left unescaped split the row into two more)."""
    import re

    def cells(line):  # Markdown splits a row at every pipe not escaped with a backslash
        return len(re.split(r"(?<!\\)\|", line.strip().strip("|")))

    GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"}).add("test_q", "max |GPU - CPU|", 0.0, "", "a|b")
    for text in ((tmp_path / "gpu-h100-80gb-hbm3.md").read_text(), gpu_record.gpu_cell("test_q", tmp_path)):
        header, _, row = [ln for ln in text.splitlines() if ln.startswith("|")][:3]
        assert cells(row) == cells(header), row
        assert "max \\|GPU - CPU\\|" in row
    assert cells("| x | max |GPU - CPU| |") == cells("| a | b |") + 2  # the check sees an unescaped pipe


def _gpu_cells():
    import nbformat

    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, 4).cells:
            if cell.cell_type == "code" and "gpu_record.gpu_cell" in cell.source:
                yield path.name, cell.source


def test_notebook_gpu_cells_check_what_a_gpu_recorded(tmp_path, monkeypatch):
    """Each notebook GPU cell runs with no record (CI), passes with plausible recorded figures and fails
    with an impossible one (a matmul above the table peak, a step 30 % off the memory model)."""
    import IPython.display

    monkeypatch.setattr(IPython.display, "display", lambda *a, **k: None)
    cells = list(_gpu_cells())
    assert {name[:2] for name, _ in cells} >= {"10", "13", "15", "21", "22", "23"}
    monkeypatch.setenv("GPU_PACK_RECORD_DIR", str(tmp_path))

    def run(src):
        exec(compile(src, "<gpu cell>", "exec"), {"display": lambda *a, **k: None})

    for _, src in cells:
        run(src)  # nothing recorded
    rec = GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"})
    rec.add("test_memory_model_vs_max_memory_allocated[a]", "peak / model", 1.04, "ratio")
    rec.add("test_bf16_matmul_8192", "matmul MFU vs table bf16 peak", 0.80, "ratio")
    rec.add("test_device_to_device_copy_bandwidth", "copy / table HBM bandwidth", 0.9, "ratio")
    rec.add("test_triton_elementwise_softmax_matmul_compiled", "Triton matmul rel. error vs fp64", 3e-4, "")
    rec.add("test_autocast_matmul[bf16]", "autocast bf16 matmul rel. error vs fp64", 2e-3, "")
    rec.add("test_cuda_graph_decode_equals_eager", "CUDA-graph decode == eager", "equal", "")
    for _, src in cells:
        run(src)
    for test, name, bad in (
        ("test_memory_model_vs_max_memory_allocated[b]", "peak / model", 1.3),
        ("test_bf16_matmul_8192", "matmul MFU vs table bf16 peak", 1.4),
        ("test_autocast_matmul[fp16]", "autocast fp16 matmul rel. error vs fp64", 2e-3),  # bf16's error in fp16
        ("test_greedy_on_cuda_equals_recompute", "greedy == recompute", "differs at token 3"),
        ("test_int8_weight_only_decode_matmul[8]", "int8 speed-up over bf16, batch 8", 3.5),  # above the bytes
    ):
        GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"}).add(test, name, bad, "")
        failed = set()
        for nb, src in cells:
            try:
                run(src)
            except AssertionError:
                failed.add(nb[:2])
        assert failed, (test, bad)
        rec = GpuRecord(tmp_path, {"device": "NVIDIA H100 80GB HBM3"})
        rec.figures = [f for f in rec.figures if f["test"] != test or f["value"] != bad]
        rec.write()


def test_the_packs_claims_match_the_code_they_describe():
    """Without a GPU the pack only skips, so its texts are checked against the code here: the Triton kernels
    pass input_precision="ieee" to every tl.dot and the pack says fp32, not TF32, and holds the matmul to an
    fp32 tolerance; the "pinned" device-to-host copy allocates a pinned destination (``empty_like`` of a pinned
    tensor is pageable: the first H100 run recorded 11.7 GB/s that way, below pageable's 13.9); the offload
    test's bound is derived, not the measured 0.5."""
    import ast

    tk = (ROOT / "mlsys_nb" / "kernels" / "triton_kernels.py").read_text()
    dots = re.findall(r"tl\.dot\(([^\n]*)\)", tk)
    assert dots and all('input_precision="ieee"' in d for d in dots), dots
    kern = (ROOT / "tests" / "gpu" / "test_gpu_kernels.py").read_text()
    assert "TF32 tl.dot" not in kern and "input_precision='ieee'" in kern and "assert err < 1e-5" in kern
    cal = ast.parse((ROOT / "tests" / "gpu" / "test_gpu_calibration.py").read_text())
    fn = next(n for n in ast.walk(cal) if isinstance(n, ast.FunctionDef) and n.name == "test_host_device_copies")
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)]
    back = next(n.value for n in assigns if getattr(n.targets[0], "id", "") == "back")
    assert ast.unparse(back.func) == "torch.empty", ast.unparse(back)  # not empty_like(host)
    assert {k.arg: ast.unparse(k.value) for k in back.keywords}.get("pin_memory") == "pinned", ast.unparse(back)
    assert "back.is_pinned() == pinned" in ast.unparse(fn)
    off = (ROOT / "tests" / "gpu" / "test_gpu_offload.py").read_text()
    assert ">= 0.5 * states" not in off and 'bound = 8 * (off["n"] - off["largest_unit"])' in off


def test_the_h100_record_says_how_its_copy_and_matmul_figures_were_measured():
    """Text corrections of the first H100 record (no figure changed): the "pinned" device-to-host figure was
    measured into a pageable destination, and the Triton matmul ran in IEEE fp32."""
    md = (ROOT / "data" / "measured" / "gpu-h100-80gb-hbm3.md").read_text()
    row = next(ln for ln in md.splitlines() if ln.startswith("| test_host_device_copies[pinned] | device -> host"))
    assert "| 11.69 |" in row and "pageable destination" in row, row
    tri = next(ln for ln in md.splitlines() if "Triton matmul rel. error vs fp64" in ln)
    assert "TF32" not in tri and "ieee" in tri, tri
