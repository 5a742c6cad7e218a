"""The GPU pack's record: ``data/measured/gpu-<device>.md`` and ``.json``, written figure by figure.

Every figure a pack test measures is appended (and both files rewritten) the moment it is measured, so a
run cut short by a timeout still leaves what it measured. One file pair per device kind (the slug of
``torch.cuda.get_device_name()``): an H100's timings never land in an H200's record, and ``GpuRecord``
refuses to write into a record whose stored device name differs from the one it was opened for.

Imports only the standard library (the CPU dry run in ``tests/test_gpu_pack.py`` tests the writer with a
made-up device name), and ``cuda_seconds`` imports torch lazily.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from pathlib import Path

__all__ = ["GpuRecord", "device_slug", "cuda_seconds"]

SCRIPT = "tests/gpu/ (make test-gpu: python3 -m pytest -o addopts='' -m gpu tests/gpu)"


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
            v = f["value"]
            v = f"{v:.4g}" if isinstance(v, float) else str(v)
            lines.append(f"| {f['test']} | {f['name']} | {v} | {f['unit']} | {f['note']} | {f['date']} |")
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
