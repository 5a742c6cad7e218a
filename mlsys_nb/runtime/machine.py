"""Which machine a measurement came from: the line every table in ``data/measured/`` starts with.

Measured times only mean something next to the machine, the software and how busy the machine was
(load average: on a shared 2-core box other jobs inflate wall times)."""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def info() -> dict:
    """Architecture, CPU, cores, Python and torch versions, 1-minute load average, UTC time.
    torch's version is its installed distribution's unless torch is imported (the same string): a
    benchmark's driver that only launches ranks does not import torch for it (seconds of CPU)."""
    import importlib.metadata
    import sys

    torch = sys.modules.get("torch")
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return {
        "uname -m": platform.machine(),
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "torch": torch.__version__ if torch else importlib.metadata.version("torch"),
        "python": platform.python_version(),
        "date (UTC)": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "load average (1 min)": f"{load:.1f}",
    }


def summary() -> str:
    """``info()`` as one line for a report."""
    i = info()
    return (
        f"{i['uname -m']}, nproc {i['nproc']}, {i['cpu']}, torch {i['torch']}, Python {i['python']}, "
        f"{i['date (UTC)']} UTC, load average {i['load average (1 min)']}"
    )


def report(text: str, out=None) -> None:
    """Print a benchmark's markdown ``text``; with ``out`` (a path) also append it to that record under a
    ``## <summary()>`` heading (the machine, the date and the load when it was written)."""
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(f"\n## {summary()}\n\n{text}\n")
