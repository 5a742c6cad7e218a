"""Do the notebooks' checks hold on a learner's CPU? Each notebook at several seeds under each ATEN_CPU_CAPABILITY.

    .venv/bin/python benchmarks/portability.py --notebooks 18 19 --seeds 0 1 2 3 --capabilities default avx2 avx512
    .venv/bin/python benchmarks/portability.py --quick

PyTorch picks its CPU kernels at start-up: AVX-512 ones on a CPU that has it, AVX2 on most laptops, plain C++
("default") where neither is present or asked for. Each is another summation order, so the same seed trains
another run, and a speed-up that needs vector kernels can vanish. A check tuned on one machine's rounding fails
on another's. This script runs each (notebook, seed, capability) under papermill at the notebook's defaults
except ``seed``, in a kernel started with ``ATEN_CPU_CAPABILITY`` set (``runtime.machine.capability_env``: its own
inductor and kit caches per capability), and reads back every ``margin:`` line the notebook's checks printed
(``mlsys_nb.runtime.check_margin``: the value beside its bound). A failed run is recorded with its error.

Rows are merged into ``data/measured/portability.csv`` (a new run of the same notebook, seed and capability
replaces the old one; a file lock lets several runs share the record), and ``data/measured/portability.md`` is
written again from it: per check, the smallest room over every run with the run it came from.
``--quick``: one synthetic one-cell notebook under the ``default`` kernels, which checks that the kernel really
ran them and that its margin line comes back; nothing written (used by tests).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from mlsys_nb.runtime import parse_margins
from mlsys_nb.runtime.machine import CPU_CAPABILITIES, capability_env, cpu_model
from mlsys_nb.runtime.machine import summary as machine

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
OUT = ROOT / "data" / "measured"
CSV = OUT / "portability.csv"
MD = OUT / "portability.md"
CELL_TIMEOUT_S = 600
COLUMNS = ["notebook", "seed", "capability", "check", "value", "op", "bound", "room", "status", "wall_s", "date", "cpu"]


def notebook_path(key: str) -> Path:
    """ "18" or "05b" or a file name -> the notebook's path; a clear error for anything else."""
    hits = [p for p in sorted(NOTEBOOKS.glob("*.ipynb")) if p.name == key or p.name.split("_")[0] == key]
    if len(hits) != 1:
        names = ", ".join(p.name.split("_")[0] for p in sorted(NOTEBOOKS.glob("*.ipynb")))
        raise SystemExit(f"--notebooks: {key!r} names no notebook (one of {names})")
    return hits[0]


def _kernel_name() -> str:
    from jupyter_client.kernelspec import KernelSpecManager

    return "mlsys_nb" if "mlsys_nb" in KernelSpecManager().find_kernel_specs() else "python3"


@contextlib.contextmanager
def _environ(env: dict):
    """This process's environment replaced by ``env`` while a kernel starts (it inherits it), then restored."""
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_one(path: Path, seed: int | None, capability: str, workdir: Path) -> tuple[str, str, float]:
    """Execute ``path`` with ``seed`` (None: the notebook's own) under ``capability``'s kernels ->
    (printed text, error or "", wall seconds)."""
    import papermill as pm

    params = {} if seed is None else {"seed": seed}
    out = workdir / f"{path.stem}__seed-{seed}__{capability}.ipynb"
    t0 = time.perf_counter()
    error = ""
    with _environ(capability_env(capability)):
        try:
            pm.execute_notebook(
                str(path),
                str(out),
                parameters=params,
                kernel_name=_kernel_name(),
                cwd=str(path.parent),
                execution_timeout=CELL_TIMEOUT_S,
                start_timeout=300,
                progress_bar=False,
            )
        except pm.PapermillExecutionError as e:
            error = f"{e.ename}: {str(e.evalue)[:300]}"
    wall = time.perf_counter() - t0
    nb = json.loads(out.read_text()) if out.exists() else {"cells": []}
    text = "".join(
        o.get("text", "") if isinstance(o.get("text", ""), str) else "".join(o["text"])
        for c in nb["cells"]
        if c.get("cell_type") == "code"
        for o in c.get("outputs", [])
    )
    return text, error, wall


def rows_of(notebook: str, seed, capability: str, text: str, error: str, wall: float) -> list[dict]:
    """One row per margin line (status "held", or "broke" when its room is negative: that check raised), plus one
    "error" row carrying the error when the run failed."""
    base = {
        "notebook": notebook,
        "seed": seed,
        "capability": capability,
        "wall_s": round(wall, 1),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "cpu": cpu_model(),
    }
    held = lambda m: m["room"] > 0 or (m["room"] == 0 and m["op"] in (">=", "<="))
    rows = [{**base, "check": m["label"], "value": m["value"], "op": m["op"], "bound": m["bound"],
             "room": m["room"], "status": "held" if held(m) else "broke"} for m in parse_margins(text)]  # fmt: skip
    if error:
        rows.append({**base, "check": error, "status": "error"})
    if not rows:
        rows.append({**base, "check": "(no margin lines printed)", "status": "held"})
    return rows


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``.lock while the record is read, merged and written."""
    import fcntl

    with open(str(path) + ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def merge(new: list[dict], csv: Path = CSV) -> pd.DataFrame:
    """Replace the rows of each (notebook, seed, capability) in ``new`` and write the CSV back."""
    df_new = pd.DataFrame(new, columns=COLUMNS)
    if csv.exists():
        old = pd.read_csv(csv, dtype={"notebook": str})
        runs = set(zip(df_new.notebook, df_new.seed.astype(str), df_new.capability))
        keep = [(n, str(s), c) not in runs for n, s, c in zip(old.notebook, old.seed.astype(str), old.capability)]
        df = pd.concat([old[keep], df_new], ignore_index=True)
    else:
        df = df_new
    df = df.sort_values(["notebook", "seed", "capability"], kind="stable")
    df.to_csv(csv, index=False)
    return df


def markdown(df: pd.DataFrame) -> str:
    """The record's page: how it was made, the worst room per check, and every failure."""
    lines = [
        "# Do the checks hold on another CPU? Notebooks x seeds x ATEN_CPU_CAPABILITY",
        "",
        "Written by `benchmarks/portability.py` from `portability.csv` (one row per `margin:` line a notebook's",
        "checks printed, per run; a failed run adds an error row with its error). Each run: papermill at the notebook's",
        "defaults except `seed`, in a kernel started with `ATEN_CPU_CAPABILITY` set (own inductor and kit caches).",
        "Room is value - bound for `>` checks and bound - value for `<` ones, in the value's units: positive means the",
        "check held with that much to spare. The table gives, per check, the smallest room over every run, the run it",
        "came from, the median room, and the worst value over its bound (a ratio near 1 is a thin margin whatever the units).",
        "",
    ]
    runs = df.drop_duplicates(["notebook", "seed", "capability"])
    for nb, g in df.groupby("notebook", sort=True):
        r = runs[runs.notebook == nb]
        fails = g[g.status == "error"]
        lines += [
            f"## Notebook {nb}",
            "",
            f"{len(r)} run(s): seeds {sorted(set(r.seed.astype(str)))} x capabilities {sorted(set(r.capability))}; "
            f"{len(fails)} failed; wall {r.wall_s.min():.0f}-{r.wall_s.max():.0f} s per run (dates {sorted(set(r.date))},"
            f" {sorted(set(r.cpu))[0]}).",
            "",
        ]
        m = g[g.room.notna()]
        if len(m):
            lines += ["| check | bound | runs | smallest room (seed, capability) | median room | values (min - max) | "
                      "worst value / bound |", "|---|---|---|---|---|---|---|"]  # fmt: skip
            for check, c in m.groupby("check", sort=False):
                w = c.loc[c.room.idxmin()]
                lines.append(
                    f"| {check} | {c.op.iloc[0]} {c.bound.iloc[0]:.4g} | {len(c)} | {w.room:+.3g} ({w.seed}, "
                    f"{w.capability}) | {c.room.median():+.3g} | {c.value.min():.4g} - {c.value.max():.4g} | "
                    f"{w.value / w.bound if w.bound else float('nan'):.3g} |"
                )
            lines.append("")
        for _, f in fails.iterrows():
            lines.append(f"- FAILED at seed {f.seed}, {f.capability}: {f.check}")
        if len(fails):
            lines.append("")
    return "\n".join(lines)


def quick() -> None:
    """A one-cell notebook under the default kernels: the kernel reports them and its margin line comes back."""
    import nbformat

    code = (
        "import torch\nfrom mlsys_nb.runtime import check_margin\n"
        "cap = torch.backends.cpu.get_cpu_capability()\n"
        "check_margin('capability is DEFAULT', float(cap == 'DEFAULT'), '>', 0.5)\n"
    )
    with tempfile.TemporaryDirectory() as d:
        nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("seed = 0", metadata={"tags": ["parameters"]}),
                                             nbformat.v4.new_code_cell(code)])  # fmt: skip
        nb.metadata["kernelspec"] = {"name": _kernel_name(), "language": "python", "display_name": "Python 3"}
        nb.metadata["language_info"] = {"name": "python"}
        path = Path(d) / "quick.ipynb"
        nbformat.write(nb, path)
        text, error, wall = run_one(path, 0, "default", Path(d))
    rows = rows_of("quick", 0, "default", text, error, wall)
    print(pd.DataFrame(rows)[["notebook", "capability", "check", "value", "status", "wall_s"]].to_markdown(index=False))
    if error or [r["check"] for r in rows] != ["capability is DEFAULT"]:
        raise SystemExit(f"the quick run did not run the default kernels or lost its margin line: {rows}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--notebooks", nargs="+", default=["05b", "09", "11", "17", "18", "19", "21", "22", "23", "24", "25"]
    )
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3])
    ap.add_argument("--capabilities", nargs="+", default=list(CPU_CAPABILITIES), choices=CPU_CAPABILITIES)
    ap.add_argument("--quick", action="store_true", help="one synthetic notebook under 'default'; writes nothing")
    args = ap.parse_args(argv)
    if args.quick:
        return quick()
    paths = [notebook_path(k) for k in args.notebooks]
    print(machine())
    failed = 0
    with tempfile.TemporaryDirectory() as d:
        for path in paths:
            nb = path.name.split("_")[0]
            for seed in args.seeds:
                for cap in args.capabilities:
                    text, error, wall = run_one(path, seed, cap, Path(d))
                    rows = rows_of(nb, seed, cap, text, error, wall)
                    failed += bool(error)
                    worst = min((r["room"] for r in rows if "room" in r), default=None)
                    print(f"notebook {nb} seed {seed} {cap:8s} {wall:6.1f} s  "
                          f"{'FAILED: ' + error if error else f'{len(rows)} margins, smallest room {worst}'}",
                          flush=True)  # fmt: skip
                    with _locked(CSV):
                        df = merge(rows)
                        MD.write_text(markdown(df) + "\n")
    print(f"{failed} failed runs; record: {CSV.relative_to(ROOT)}, {MD.relative_to(ROOT)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
