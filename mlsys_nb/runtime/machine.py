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


# ATEN_CPU_CAPABILITY picks which of PyTorch's CPU kernels run: "default" (no vector kernels), "avx2", "avx512"
# on x86 (others on ARM). Another choice is another summation order: the same seed can train another run.
CPU_CAPABILITIES = ("default", "avx2", "avx512")


def cpu_capability() -> str:
    """The kernels PyTorch picked in this process, lower case ("default", "avx2", "avx512", "sve256", ...):
    the native ones unless ``ATEN_CPU_CAPABILITY`` asked for others. Imports torch."""
    import torch

    return torch.backends.cpu.get_cpu_capability().lower()


def vector_kernels(capability: str | None = None, machine: str | None = None) -> tuple[bool, str]:
    """Whether PyTorch's CPU kernels in this process are vectorised, and why: ``capability`` (default
    ``cpu_capability()``, set by ``ATEN_CPU_CAPABILITY``) ``"default"`` on x86 means scalar kernels; on Arm
    (``machine`` aarch64/arm64) the default kernels are NEON ones (ATen's Vectorized types use NEON there), and
    ``sve*`` are vector ones too. Speed-up checks (notebooks 21 and 23) are asserted only where this is True."""
    cap = (capability or cpu_capability()).lower()
    machine = (machine or platform.machine()).lower()
    if cap != "default":
        return True, f"PyTorch's CPU kernels here are {cap} (vectorised)"
    if machine in ("arm64", "aarch64"):
        return True, "PyTorch's default CPU kernels on Arm use NEON (vectorised)"
    return False, (
        "PyTorch's CPU kernels here are the default (scalar) ones (ATEN_CPU_CAPABILITY=default or a CPU "
        "without AVX2): a scalar sum or GELU is bound by its arithmetic, not by memory"
    )


def capability_env(capability: str | None, base: dict | None = None) -> dict:
    """An environment (a copy of ``base``, default ``os.environ``) in which a new process runs PyTorch's
    ``capability`` kernels (``None``: the native ones, ``ATEN_CPU_CAPABILITY`` removed), with inductor's on-disk
    cache and the kit's own cache (``MLSYS_NB_CACHE``) kept apart per capability: inductor's cache does not key
    on the capability, and code compiled for AVX-512 reused under AVX2 gave wrong numbers."""
    env = dict(os.environ if base is None else base)
    if capability is None:
        env.pop("ATEN_CPU_CAPABILITY", None)
        return env
    cap = str(capability).lower()
    if cap not in CPU_CAPABILITIES:
        raise ValueError(f"capability={capability!r}: one of {CPU_CAPABILITIES} or None (the native kernels)")
    import tempfile

    user = os.environ.get("USER") or str(os.getuid() if hasattr(os, "getuid") else "user")
    root = Path(tempfile.gettempdir()) / f"mlsys_nb-{user}-capability-{cap}"
    env["ATEN_CPU_CAPABILITY"] = cap
    env["TORCHINDUCTOR_CACHE_DIR"] = str(root / "inductor")
    cache = Path(env.get("MLSYS_NB_CACHE") or Path.home() / ".cache" / "mlsys_nb")
    env["MLSYS_NB_CACHE"] = str(cache / f"capability-{cap}")
    return env
