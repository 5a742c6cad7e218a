"""The package's layers (issue 48): docs/architecture.md's table is the rule, and this test enforces it.

The table under "## Layers" has one row per module or folder of ``mlsys_nb``: its layer and what it may
import (whole layers above it by name, or single rows above it or beside it in its layer). An AST pass
over every module (module-level and function-local imports, ``from . import x``, relative imports
resolved; ``tests/test_imports.scan``) fails on any import of package code the table does not allow.
No allow-list: a module that breaks the rule moves to its owner, or the table changes in the doc.
A last test imports every calculator in a fresh process: neither torch nor the runtime loads."""

import functools
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

import test_imports

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "architecture.md"
PKG = "mlsys_nb"


@dataclass(frozen=True)
class Row:
    path: str  # as written in the doc: "config.py", "runtime/", "__init__.py"
    prefix: str  # the dotted module name it covers: "mlsys_nb.config", "mlsys_nb.runtime", "mlsys_nb"
    layer: str
    may: tuple[str, ...]  # the "may import" cell, split


def prefix_of(path: str) -> str:
    """``runtime/`` -> ``mlsys_nb.runtime``; ``inference/roofline.py`` -> ``mlsys_nb.inference.roofline``;
    ``__init__.py`` -> ``mlsys_nb`` (the package's front page alone)."""
    stem = path.removesuffix("/").removesuffix(".py")
    return PKG if stem == "__init__" else ".".join([PKG, *stem.split("/")])


def parse_table(text: str) -> list[Row]:
    """The rows of the first table under ``## Layers``, in order (the layers' order is their first row's)."""
    section = text.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("|") or len(cells) != 3 or set(cells[0]) <= {"-"} or cells[0] == "module or folder":
            continue
        path = cells[0].strip("`")
        may = tuple(m.strip().strip("`") for m in cells[2].split(",") if m.strip())
        rows.append(Row(path, prefix_of(path), cells[1], may))
    return rows


def layers_of(rows: list[Row]) -> list[str]:
    return list(dict.fromkeys(r.layer for r in rows))


def row_of(mod: str, rows: list[Row]) -> Row | None:
    """The most specific row holding ``mod``: the longest prefix; the package's front page only itself."""
    best = None
    for r in rows:
        covers = mod == r.prefix if r.prefix == PKG else (mod == r.prefix or mod.startswith(r.prefix + "."))
        if covers and (best is None or len(r.prefix) > len(best.prefix)):
            best = r
    return best


def table_errors(rows: list[Row]) -> list[str]:
    """What is wrong with the table itself: unknown names, imports of a lower layer, a cycle of peers."""
    errors, order = [], layers_of(rows)
    by_path = {r.path: r for r in rows}
    rank = {layer: i for i, layer in enumerate(order)}
    if len(by_path) != len(rows):
        errors.append("a row appears twice")
    for layer in order:  # the layers come in blocks: one layer's rows together
        idx = [i for i, r in enumerate(rows) if r.layer == layer]
        if idx != list(range(idx[0], idx[-1] + 1)):
            errors.append(f"the rows of layer {layer!r} are not together")
    for r in rows:
        for m in r.may:
            if m in rank:
                if rank[m] >= rank[r.layer]:
                    errors.append(f"{r.path} ({r.layer}) may import the layer {m!r}, which is not above it")
            elif m in by_path:
                if rank[by_path[m].layer] > rank[r.layer]:
                    errors.append(f"{r.path} ({r.layer}) may import {m} ({by_path[m].layer}), a lower layer")
            else:
                errors.append(f"{r.path}: {m!r} in its 'may import' cell is neither a layer nor a row")
    peers = {r.path: [m for m in r.may if m in by_path and by_path[m].layer == r.layer] for r in rows}
    cyc = test_imports.cycles({p: set(ws) for p, ws in peers.items()})
    if cyc:
        errors.append(f"same-layer rows that may import each other: {cyc}")
    return errors


def allowed(row: Row, rows: list[Row]) -> set[str]:
    """The rows ``row`` may import: its own and those its cell names (a layer name stands for its rows)."""
    out = {row.path}
    for m in row.may:
        out |= {r.path for r in rows if r.layer == m or r.path == m}
    return out


def violations(edges: dict[str, set[str]], rows: list[Row]) -> list[str]:
    """Every import of package code that the table does not allow, as 'importer -> imported (rows)'."""
    out = []
    for mod in sorted(edges):
        src = row_of(mod, rows)
        ok = allowed(src, rows)
        for dep in sorted(edges[mod]):
            dst = row_of(dep, rows)
            if dst.path not in ok:
                out.append(f"{mod} -> {dep}  ({src.path} [{src.layer}] may not import {dst.path} [{dst.layer}])")
    return out


def row_pairs_importing_each_other(edges: dict[str, set[str]], rows: list[Row]) -> list[tuple[str, str]]:
    """Pairs of distinct rows (folders or modules) where each imports the other."""
    between = {(row_of(a, rows).path, row_of(b, rows).path) for a, bs in edges.items() for b in bs}
    return sorted((x, y) for x, y in between if x < y and (y, x) in between)


def package_state():
    mods = test_imports.modules()
    edges, _ = test_imports.scan(mods)
    return mods, edges


@functools.lru_cache(maxsize=1)
def real_package():
    """The real package's modules and import edges, scanned once for the tests below."""
    return package_state()


def test_the_table_is_well_formed():
    rows = parse_table(DOC.read_text())
    assert len(rows) > 20, "docs/architecture.md: the Layers table was not found"
    assert layers_of(rows)[0] == "base"
    errors = table_errors(rows)
    assert not errors, "docs/architecture.md's Layers table:\n" + "\n".join(errors)


def test_every_module_has_a_row_and_every_row_a_module():
    rows = parse_table(DOC.read_text())
    mods, _ = real_package()
    homeless = sorted(m for m in mods if row_of(m, rows) is None)
    assert not homeless, f"modules without a row in docs/architecture.md's Layers table: {homeless}"
    empty = [r.path for r in rows if not any(row_of(m, rows) == r for m in mods)]
    assert not empty, f"rows of the Layers table that hold no module (moved? renamed?): {empty}"


def test_every_import_follows_the_layers():
    rows = parse_table(DOC.read_text())
    _, edges = real_package()
    found = violations(edges, rows)
    assert not found, (
        f"{len(found)} imports against docs/architecture.md's Layers table (move the thing to its owner):\n"
        + "\n".join(found)
    )


def test_no_two_rows_import_each_other():
    """Folders included: ``inference/`` and ``kernels/`` each importing the other fails here."""
    rows = parse_table(DOC.read_text())
    _, edges = real_package()
    pairs = row_pairs_importing_each_other(edges, rows)
    assert not pairs, f"rows of the Layers table that import each other: {pairs}"


TABLE = """
## Layers

| module or folder | layer | may import |
|---|---|---|
| `config.py` | base | |
| `__init__.py` | runtime | base |
| `runtime/` | runtime | base |
| `hardware.py` | calculators | base |
| `memory.py` | calculators | base, `hardware.py` |
| `inference/roofline.py` | calculators | base, `hardware.py` |
| `comm/` | implementations | base, runtime, calculators |
| `inference/` | implementations | base, calculators, `comm/` |

## Owners
"""


def fake_package(tmp_path, monkeypatch, files: dict[str, str]):
    """A package ``mlsys_nb`` of ``files`` under tmp_path, scanned as the real one is."""
    for name, src in {"__init__.py": "", "config.py": "", **files}.items():
        path = tmp_path / PKG / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(src)
    monkeypatch.setattr(test_imports, "ROOT", tmp_path)
    monkeypatch.setattr(test_imports, "PKG", tmp_path / PKG)
    return package_state()


CLEAN = {
    "runtime/__init__.py": "from ..config import x\n",
    "hardware.py": "from .config import x\n",
    "memory.py": "from . import hardware\n",
    "comm/__init__.py": "from ..runtime import y\n",
    "inference/__init__.py": "",
    "inference/roofline.py": "from ..hardware import GPU\n",
    "inference/engine.py": "from .roofline import StepCost\nfrom ..comm import z\nfrom . import roofline\n",
}


def test_a_package_that_follows_the_table_passes(tmp_path, monkeypatch):
    rows = parse_table(TABLE)
    assert not table_errors(rows)
    _, edges = fake_package(tmp_path, monkeypatch, CLEAN)
    assert violations(edges, rows) == [] and row_pairs_importing_each_other(edges, rows) == []


@pytest.mark.parametrize(
    "name, source, flagged",
    [  # a calculator timing itself (function-local), a peer not in the cell, a relative import upwards
        ("memory.py", "def f():\n    from .runtime import timing\n", "mlsys_nb.memory -> mlsys_nb.runtime"),
        ("hardware.py", "from . import memory\n", "mlsys_nb.hardware -> mlsys_nb.memory"),
        ("inference/roofline.py", "def g():\n    from .engine import h\n", "roofline -> mlsys_nb.inference.engine"),
        ("runtime/timing.py", "from .. import hardware\n", "mlsys_nb.runtime.timing -> mlsys_nb.hardware"),
        ("comm/plots.py", "import mlsys_nb.inference.engine as e\n", "plots -> mlsys_nb.inference.engine"),
    ],
)
def test_an_import_against_the_table_is_flagged(tmp_path, monkeypatch, name, source, flagged):
    """The mutation: one module of a clean package imports against the table; the scan names it."""
    rows = parse_table(TABLE)
    _, edges = fake_package(tmp_path, monkeypatch, {**CLEAN, name: CLEAN.get(name, "") + source})
    found = violations(edges, rows)
    assert len(found) == 1 and flagged in found[0], found


def test_two_folders_importing_each_other_are_flagged(tmp_path, monkeypatch):
    rows = parse_table(TABLE.replace("base, runtime, calculators |", "base, runtime, calculators, `inference/` |"))
    assert any("may import each other" in e for e in table_errors(rows))  # the table cannot allow it
    _, edges = fake_package(
        tmp_path, monkeypatch, {**CLEAN, "comm/ring" + ".py": "def f():\n    from ..inference import engine\n"}
    )
    assert row_pairs_importing_each_other(edges, parse_table(TABLE)) == [("comm/", "inference/")]


def test_the_table_checks_catch_a_wrong_table():
    rows = parse_table(TABLE.replace("| base, `hardware.py` |\n| `inference", "| base, `inference/` |\n| `inference"))
    assert any("lower layer" in e for e in table_errors(rows))
    rows = parse_table(
        TABLE.replace("| `hardware.py` | calculators | base |", "| `hardware.py` | calculators | base, `memory.py` |")
    )
    assert any("may import each other" in e for e in table_errors(rows))
    rows = parse_table(TABLE.replace("| `runtime/` | runtime | base |", "| `runtime/` | runtime | base, calculators |"))
    assert any("not above it" in e for e in table_errors(rows))


def calculators() -> list[str]:
    rows = parse_table(DOC.read_text())
    return sorted(m for m in test_imports.modules() if row_of(m, rows).layer == "calculators")


PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
    heavy = sorted(k for k in sys.modules if k == "torch" or k.startswith("mlsys_nb.runtime"))
    if heavy:
        print(name, heavy)
        break
"""


def first_heavy_import(modules: list[str]) -> str:
    """Import ``modules`` one after the other in one fresh interpreter; the first that loaded torch or any
    of ``mlsys_nb.runtime``, with what it loaded, or "" when none did."""
    out = subprocess.run([sys.executable, "-c", PROBE, *modules], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_calculators_load_neither_torch_nor_the_runtime():
    """Every calculator imported in a fresh interpreter: a closed form costs no torch import and starts no rank
    machinery (what a widget or the quiz imports stays light)."""
    mods = calculators()
    assert "mlsys_nb.hardware" in mods and "mlsys_nb.inference.roofline" in mods
    heavy = first_heavy_import(mods)
    assert not heavy, f"a calculator loads torch or the runtime when imported: {heavy}"


def test_the_fresh_process_probe_sees_a_heavy_import():
    """The mutation of the test above: a module that loads torch, after a light one, is named."""
    assert first_heavy_import(["mlsys_nb.hardware", "mlsys_nb.models", "mlsys_nb.flops"]).startswith("mlsys_nb.models ")
