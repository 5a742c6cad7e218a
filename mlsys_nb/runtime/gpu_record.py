"""The GPU pack's record: ``data/measured/gpu-<device>.md`` and ``.json``, written figure by figure,
and read back by the notebooks' GPU cells (``recorded``, ``lookup``, ``gpu_cell``).

Every figure a pack test measures is appended (and both files rewritten) the moment it is measured, so a
run cut short by a timeout still leaves what it measured. One file pair per device kind (the slug of
``torch.cuda.get_device_name()``): an H100's timings never land in an H200's record, and ``GpuRecord``
refuses to write into a record whose stored device name differs from the one it was opened for.

Imports only the standard library (the CPU dry run in ``tests/test_gpu_pack.py`` tests the writer with a
made-up device name), and ``cuda_seconds`` imports torch lazily. The pack's tests live in ``tests/gpu/``.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
from pathlib import Path

__all__ = ["GpuRecord", "device_slug", "cuda_seconds", "RECORD_DIR", "recorded", "lookup", "gpu_cell", "table_row"]

RECORD_DIR = Path(__file__).resolve().parents[2] / "data" / "measured"

SCRIPT = "tests/gpu/ (make test-gpu: python3 -m pytest -o addopts='' -m gpu tests/gpu)"


def table_row(*cells) -> str:
    """One Markdown table row of ``cells``; a ``|`` inside a cell is escaped (``\\|``), so a figure named
    ``max |GPU - CPU|`` stays one cell instead of splitting the row into more columns than the header's."""
    return "| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |"


def _value(v) -> str:
    """A recorded value as a table shows it: floats to 4 significant digits."""
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def device_slug(name: str) -> str:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"h100-80gb-hbm3"``: the record's file stem after ``gpu-``."""
    if not isinstance(name, str) or not name.strip():
        raise ValueError(f"name must be a non-empty device name, got {name!r}")
    s = re.sub(r"^nvidia\s+", "", name.strip().lower())
    s = re.sub(r"[^a-z0-9]+", "-", s).strip("-")
    return s


class GpuRecord:
    """Figures of one device kind, kept in ``<directory>/gpu-<slug>.json`` and a Markdown table beside it.

    ``meta``: the device name (key ``device``, required), driver, torch, CUDA, Triton, CPU model, date.
    ``add(test, name, value, unit, note="")`` stores one figure under ``test`` / ``name`` (a later run of
    the same figure replaces it, with its own date) and rewrites both files at once."""

    def __init__(self, directory, meta: dict):
        if "device" not in meta:
            raise ValueError("meta must hold 'device' (the CUDA device name)")
        self.meta = dict(meta)
        self.meta.setdefault("date", _dt.date.today().isoformat())
        self.meta.setdefault("script", SCRIPT)
        stem = "gpu-" + device_slug(self.meta["device"])
        self.json_path = Path(directory) / f"{stem}.json"
        self.md_path = Path(directory) / f"{stem}.md"
        self.figures: list[dict] = []
        if self.json_path.exists():
            old = json.loads(self.json_path.read_text())
            if old.get("meta", {}).get("device") != self.meta["device"]:
                raise ValueError(
                    f"{self.json_path} holds figures of {old.get('meta', {}).get('device')!r}, not of "
                    f"{self.meta['device']!r}: records of different devices are never mixed"
                )
            self.figures = old.get("figures", [])

    def add(self, test: str, name: str, value, unit: str, note: str = "") -> None:
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise TypeError(f"value must be a number or a string, got {type(value).__name__}")
        row = {
            "test": test,
            "name": name,
            "value": value,
            "unit": unit,
            "note": note,
            "date": self.meta["date"],
        }
        self.figures = [f for f in self.figures if (f["test"], f["name"]) != (test, name)] + [row]
        self.write()

    def write(self) -> None:
        self.json_path.parent.mkdir(parents=True, exist_ok=True)
        self.json_path.write_text(json.dumps({"meta": self.meta, "figures": self.figures}, indent=1) + "\n")
        self.md_path.write_text(self.markdown())

    def markdown(self) -> str:
        m = self.meta
        lines = [
            f"# GPU pack: {m['device']}",
            "",
            "Measured by the GPU pack on one device of this kind; every figure below was measured (a row says",
            "`model` where it compares with a formula). Rewritten by each pack run, figure by figure.",
            "",
        ]
        lines += [f"- {k}: {v}" for k, v in m.items()]
        lines += ["", "| test | figure | value | unit | note | date |", "|---|---|---|---|---|---|"]
        for f in self.figures:
            lines.append(table_row(f["test"], f["name"], _value(f["value"]), f["unit"], f["note"], f["date"]))
        return "\n".join(lines) + "\n"


def cuda_seconds(fn, reps: int = 10, warmup: int = 2) -> list[float]:
    """Seconds of each of ``reps`` calls of ``fn`` on the current CUDA stream, timed with CUDA events."""
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        out.append(a.elapsed_time(b) / 1e3)
    return out


def recorded(directory=None) -> dict[str, dict]:
    """Every GPU record in ``directory`` (default ``$GPU_PACK_RECORD_DIR``, else ``data/measured``, where
    ``make test-gpu`` writes): ``{device name: {"meta", "figures"}}``."""
    out = {}
    for path in sorted(Path(directory or os.environ.get("GPU_PACK_RECORD_DIR") or RECORD_DIR).glob("gpu-*.json")):
        data = json.loads(path.read_text())
        out[data["meta"]["device"]] = data
    return out


def lookup(test: str, name: str | None = None, directory=None) -> list[dict]:
    """Recorded figures of the pack test ``test`` (its name, or its name with a parameter, e.g.
    ``test_cuda_graph_speedup`` matches ``test_cuda_graph_speedup[8]``), optionally only those whose
    figure name contains ``name``; each row carries its ``device``. Empty where nothing was recorded."""
    if not isinstance(test, str) or not test.startswith("test_"):
        raise ValueError(f"test must be a GPU-pack test name starting with 'test_', got {test!r}")
    rows = []
    for device, data in recorded(directory).items():
        for f in data["figures"]:
            if (f["test"] == test or f["test"].startswith(test + "[")) and (name is None or name in f["name"]):
                rows.append({"device": device, **f})
    return rows


def gpu_cell(tests, directory=None, *, cuda: bool | None = None) -> str:
    """What a notebook's GPU cell prints: the pack's recorded figures for ``tests`` (names, or
    ``(test, figure-name substring)`` pairs) as a Markdown table with device and date, or, where none
    has been recorded, a line saying so and how to record them. ``cuda``: whether this kernel sees a
    GPU (default: asks torch), only to word the advice."""
    if isinstance(tests, str):
        tests = [tests]
    rows = []
    for t in tests:
        test, name = (t, None) if isinstance(t, str) else t
        rows += lookup(test, name, directory)
    if not rows:
        if cuda is None:
            import torch

            cuda = torch.cuda.is_available()
        where = "this machine has a GPU: run" if cuda else "on a GPU machine, run"
        return (
            f"No GPU figure recorded yet for {', '.join(t if isinstance(t, str) else t[0] for t in tests)} "
            f"(data/measured/gpu-<device>.json is absent): {where} `make test-gpu` to measure them."
        )
    lines = ["| device | test | figure | measured | unit | note | date |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(table_row(r["device"], r["test"], r["name"], _value(r["value"]), r["unit"], r["note"], r["date"]))
    return "\n".join(lines)
