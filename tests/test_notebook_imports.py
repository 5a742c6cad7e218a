"""Notebooks import public names from the front pages (issue 29).

A name that a package's front page exports (it is in ``mlsys_nb.<package>.__all__``) is imported
from there, not from the module deep inside that defines it: ``from mlsys_nb.inference import LLMEngine``,
not ``from mlsys_nb.inference.engine import LLMEngine``. Learners then see one public surface, and
moving code between modules does not break the notebooks. An AST pass over every notebook's code
cells flags each deep import of an exported name, naming the front page to use instead.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _python(cell_source: str) -> str:
    """A code cell's Python, with IPython magics and shell lines blanked (line numbers kept)."""
    lines = cell_source.splitlines()
    if lines and lines[0].startswith("%%"):
        return ""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in lines)


def _front_page(module: str, name: str) -> str | None:
    """The nearest package above ``module`` whose ``__all__`` exports ``name`` (the same object), or None."""
    try:
        obj = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None  # not ours to judge: the notebook's own run shows a broken import
    parts = module.split(".")
    for k in range(len(parts) - 1, 0, -1):
        front = ".".join(parts[:k])
        pkg = importlib.import_module(front)
        if name in getattr(pkg, "__all__", ()) and getattr(pkg, name, None) is obj:
            return front
    return None


def deep_imports(source: str) -> list[tuple[int, str, str, str]]:
    """(line, module, name, front page) for each ``from mlsys_nb.a.b import name`` whose name a front page exports."""
    found = []
    for node in ast.walk(ast.parse(_python(source))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mlsys_nb."):
            for alias in node.names:
                front = _front_page(node.module, alias.name)
                if front is not None:
                    found.append((node.lineno, node.module, alias.name, front))
    return found


def _per_code_cell(nb: Path, find) -> list[tuple[int, tuple]]:
    """(cell index, finding) for each finding of ``find(source)`` in the notebook's code cells."""
    cells = json.loads(nb.read_text())["cells"]
    return [(i, f) for i, c in enumerate(cells) if c["cell_type"] == "code" for f in find("".join(c["source"]))]


def test_the_check_flags_deep_imports_and_only_them():
    assert deep_imports("from mlsys_nb.inference.engine import LLMEngine") == [
        (1, "mlsys_nb.inference.engine", "LLMEngine", "mlsys_nb.inference")
    ]
    assert deep_imports("%load_ext mlsys_nb\nx = 1\nfrom mlsys_nb.runtime.launcher import launch as go") == [
        (3, "mlsys_nb.runtime.launcher", "launch", "mlsys_nb.runtime")
    ]
    assert deep_imports("from mlsys_nb.inference import LLMEngine") == []  # the front page itself
    assert deep_imports("from mlsys_nb.inference.engine import PHASES") == []  # not exported: deep is right
    assert deep_imports("import mlsys_nb.inference.engine as engine\nfrom mlsys_nb import launch") == []
    assert deep_imports("%%ranks\nfrom mlsys_nb.inference.engine import LLMEngine") == []  # a cell magic


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_notebooks_import_exported_names_from_front_pages(nb):
    flagged = [
        f"cell {i} line {line}: from {module} import {name} -> from {front} import {name}"
        for i, (line, module, name, front) in _per_code_cell(nb, deep_imports)
    ]
    assert not flagged, f"{nb.name}: import these from their front page:\n" + "\n".join(flagged)


def private_names(source: str) -> list[tuple[int, str]]:
    """(line, what) for each private name of the kit a cell uses: ``from mlsys_nb... import _x`` and ``m._x`` where
    ``m`` is a kit module bound in the cell (``import mlsys_nb.a as m``, ``from mlsys_nb.a import b as m``,
    ``from mlsys_nb import b``). torch's own private APIs (``torch._scaled_mm``) are not the kit's and pass."""
    tree = ast.parse(_python(source))
    modules, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("mlsys_nb") and a.asname:
                    modules.add(a.asname)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("mlsys_nb"):
            for a in node.names:
                if a.name.startswith("_") and not a.name.startswith("__"):
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
                if _is_package(node.module) and importlib.util.find_spec(f"{node.module}.{a.name}"):  # a module
                    modules.add(a.asname or a.name)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in modules
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
        ):
            found.append((node.lineno, f"{node.value.id}.{node.attr}"))
    return sorted(found)


def _is_package(module: str) -> bool:
    spec = importlib.util.find_spec(module)
    return spec is not None and spec.submodule_search_locations is not None


def test_the_private_name_check_flags_the_kits_private_names_only():
    assert private_names("from mlsys_nb.inference.model_runner import _Static") == [
        (1, "from mlsys_nb.inference.model_runner import _Static")
    ]
    assert private_names("from mlsys_nb.rl import placement as pl\nw = pl._actor_class()") == [(2, "pl._actor_class")]
    assert private_names("import mlsys_nb.planner as planner\nplanner._bubble_ratio(1)") == [
        (2, "planner._bubble_ratio")
    ]
    assert private_names("import torch\ntorch._scaled_mm\nfrom mlsys_nb.rl import placement as pl\npl.run") == []


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:2])
def test_notebooks_use_no_private_name_of_the_kit(nb):
    """What a learner reads is public: a notebook that needs a private name makes it public first (issue 48)."""
    flagged = [f"cell {i} line {line}: {what}" for i, (line, what) in _per_code_cell(nb, private_names)]
    assert not flagged, f"{nb.name} uses private names of the kit:\n" + "\n".join(flagged)
