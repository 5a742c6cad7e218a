"""Run a notebook headless with papermill (used by the per-notebook parameter tests).

``run_notebook("01_first_distributed_program.ipynb", world_size=8)`` executes a copy of the
notebook with those parameters injected after its ``parameters`` cell, in the ``mlsys_nb`` kernel
(falling back to ``python3``), with a per-cell timeout, and returns the executed notebook (nbformat).
A failing cell raises ``papermill.PapermillExecutionError`` naming the cell.

A kernel that fails to start is started again, on new ports (``KERNEL_START_ATTEMPTS`` in all, the reason
printed): jupyter_client picks the kernel's five ports, releases them and writes them to the connection file;
the kernel binds them only once its imports are done (seconds; several times longer beside busy processes), and
if another process took one meanwhile the kernel exits with ``ZMQError: Address already in use``, which papermill
reports as "Kernel died before replying to kernel_info" (jupyter_client issue 276; a start that merely took
long says "Kernel didn't respond in N seconds" instead). ``KERNEL_START_TIMEOUT_S`` bounds one start, only
against a hang: a kernel was ready in 3.3-4.7 s on a 2-core machine at load 14, well inside papermill's 60 s.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mlsys_nb.runtime.notebook import CHECK_LOG_ENV

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts"
CELL_TIMEOUT_S = int(os.environ.get("MLSYS_NB_CELL_TIMEOUT", "300"))
KERNEL_START_TIMEOUT_S = int(os.environ.get("MLSYS_NB_KERNEL_START_TIMEOUT", "300"))
KERNEL_START_ATTEMPTS = 3
# What jupyter_client raises when the kernel never answered: its process exited (a port taken, a crash at start),
# or it stayed silent for KERNEL_START_TIMEOUT_S. No cell has run then, so starting again repeats nothing.
KERNEL_START_FAILURES = ("Kernel died before replying to kernel_info", "Kernel didn't respond in")


def kernel_start_failed(exc: BaseException) -> bool:
    """``exc`` is jupyter_client's error for a kernel that never became ready (not a failure inside a cell, not
    nbclient's ``DeadKernelError`` for a kernel that died while running one)."""
    return type(exc) is RuntimeError and str(exc).startswith(KERNEL_START_FAILURES)


def kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    return "mlsys_nb" if "mlsys_nb" in specs else "python3"


def run_notebook(
    name: str,
    capability: str | None = None,
    *,
    notebook_dir: Path | None = None,
    artifact_dir: Path | None = None,
    **parameters,
):
    """Execute ``name`` (in ``notebook_dir``, default notebooks/; written to ``artifact_dir``, default
    test-artifacts/) with ``parameters``; with
    ``capability`` ("default", "avx2", "avx512") its kernel runs PyTorch's kernels of that capability
    (``ATEN_CPU_CAPABILITY``, with its own inductor and kit caches: ``runtime.machine.capability_env``), as a
    learner's CPU of that kind would."""
    import papermill as pm

    from mlsys_nb.runtime.machine import capability_env

    notebook_dir, artifact_dir = notebook_dir or NOTEBOOKS, artifact_dir or ARTIFACTS
    src = notebook_dir / name
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}")
    artifact_dir.mkdir(parents=True, exist_ok=True)
    tag = "_".join(f"{k}-{v}" for k, v in sorted(parameters.items())) or "defaults"
    if capability is not None:
        tag += f"__capability-{capability}"
    out = artifact_dir / f"{src.stem}__{tag}.ipynb"
    saved = dict(os.environ)
    log = check_log_path(out)
    log.unlink(missing_ok=True)
    if capability is not None:  # the kernel process inherits this process's environment when it starts
        os.environ.clear()
        os.environ.update(capability_env(capability, saved))
    os.environ[CHECK_LOG_ENV] = str(log)  # the kernel records each check there (mlsys_nb.runtime.notebook)
    try:
        for attempt in range(1, KERNEL_START_ATTEMPTS + 1):
            try:
                return pm.execute_notebook(
                    str(src),
                    str(out),
                    parameters=parameters,
                    kernel_name=kernel_name(),
                    cwd=str(notebook_dir),
                    execution_timeout=CELL_TIMEOUT_S,
                    start_timeout=KERNEL_START_TIMEOUT_S,
                    progress_bar=False,
                )
            except RuntimeError as e:
                if not kernel_start_failed(e) or attempt == KERNEL_START_ATTEMPTS:
                    raise
                print(
                    f"nbrun: {name}: the kernel failed to start ({e}; attempt {attempt} of {KERNEL_START_ATTEMPTS}; "
                    "its stderr above says why, e.g. a port taken meanwhile): starting a fresh kernel on new ports",
                    file=sys.stderr,
                )
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_log_path(executed: Path) -> Path:
    """Where a run of the notebook written to ``executed`` records its checks (one JSON line each)."""
    return executed.with_suffix(".checks.jsonl")


def recorded_checks(nb, kind: str | None = None) -> list[dict]:
    """The checks an executed notebook recorded, in order (``passed(...)`` and ``check_margin(...)`` calls):
    ``[{"kind": "passed" | "margin", "label", ...}]``; ``kind`` keeps one kind."""
    from mlsys_nb.runtime.notebook import read_check_log

    checks = read_check_log(check_log_path(Path(nb.metadata.papermill.output_path)))
    return [c for c in checks if kind is None or c["kind"] == kind]


def passed_labels(nb) -> list[str]:
    """The labels of the ``passed`` checks an executed notebook recorded, in order."""
    return [c["label"] for c in recorded_checks(nb, "passed")]


def other_capability() -> str | None:
    """A CPU capability other than this machine's native one, for the variant runs of the notebooks whose checks
    depend on training, sampling or timing: "default" (no vector kernels) where the native kernels are vector
    ones (every x86 CPU of the last decade), else None (the native kernels are already the default ones). A
    check tuned to one CPU's rounding then fails on every machine, CI's included."""
    import subprocess
    import sys

    from mlsys_nb.runtime.machine import capability_env

    code = "import torch; print(torch.backends.cpu.get_cpu_capability().lower())"
    native = subprocess.run(
        [sys.executable, "-c", code], env=capability_env(None), capture_output=True, text=True, timeout=120
    ).stdout.strip()
    return "default" if native != "default" else None


def printed_text(nb) -> str:
    """Everything the executed notebook's code cells printed (stream outputs), in order."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def assert_exercises_passed(nb, n: int) -> None:
    """A ``solutions=True`` run of ``nb`` (an executed notebook) recorded the pass of exercises 1..n (a
    ``passed("exercise k...")`` label each), none of exercise n + 1, and printed no "not attempted"."""
    import re

    labels = passed_labels(nb)

    def recorded(k: int) -> bool:
        return any(re.match(rf"exercise {k}\b", label) for label in labels)

    for k in range(1, n + 1):
        assert recorded(k), f"exercise {k}: its check recorded no pass (labels: {labels})"
    assert not recorded(n + 1), f"more than {n} exercises: update the test"
    assert "not attempted" not in printed_text(nb), "with solutions=True every exercise must run its solution"
