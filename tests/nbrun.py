"""Run a notebook headless with papermill (used by the per-notebook parameter tests).

``run_notebook("01_first_distributed_program.ipynb", world_size=8)`` executes a copy of the
notebook with those parameters injected after its ``parameters`` cell, in the ``mlsys_nb`` kernel
(falling back to ``python3``), with a per-cell timeout, and returns the executed notebook (nbformat).
A failing cell raises ``papermill.PapermillExecutionError`` naming the cell.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
ARTIFACTS = ROOT / "test-artifacts"
CELL_TIMEOUT_S = int(os.environ.get("MLSYS_NB_CELL_TIMEOUT", "300"))


def kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    specs = KernelSpecManager().find_kernel_specs()
    return "mlsys_nb" if "mlsys_nb" in specs else "python3"


def run_notebook(name: str, **parameters):
    import papermill as pm

    src = NOTEBOOKS / name
    if not src.exists():
        raise FileNotFoundError(f"no notebook {src}")
    ARTIFACTS.mkdir(exist_ok=True)
    tag = "_".join(f"{k}-{v}" for k, v in sorted(parameters.items())) or "defaults"
    out = ARTIFACTS / f"{src.stem}__{tag}.ipynb"
    return pm.execute_notebook(
        str(src),
        str(out),
        parameters=parameters,
        kernel_name=kernel_name(),
        cwd=str(NOTEBOOKS),
        execution_timeout=CELL_TIMEOUT_S,
        progress_bar=False,
    )


def printed_text(nb) -> str:
    """Everything the executed notebook's code cells printed (stream outputs), in order."""
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))


def assert_exercises_passed(text: str, n: int) -> None:
    """A ``solutions=True`` run printed the pass line of exercises 1..n and no "not attempted"."""
    for k in range(1, n + 1):
        assert f"check passed: exercise {k}" in text, f"exercise {k}: its check did not print its pass line"
    assert f"check passed: exercise {n + 1}" not in text, f"more than {n} exercises: update the test"
    assert "not attempted" not in text, "with solutions=True every exercise must run its solution"
