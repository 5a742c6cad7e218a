"""Front pages list what notebooks import (issue 48).

A subpackage's front page is its ``__init__.py`` docstring: where a learner looks first to find what the
package offers. Every name a notebook imports from a subpackage ``mlsys_nb.X`` (``from mlsys_nb.X import a``,
or from a module inside it, ``from mlsys_nb.X.y import b``) is mentioned there, as a word (``a``, ``y.b``).
Plain modules (``mlsys_nb.config``, ``mlsys_nb.flops``) have no front page of their own and are not checked.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re

import pytest
from test_notebook_imports import NOTEBOOKS, _per_code_cell, _python


def _package_of(module: str) -> str | None:
    """``mlsys_nb.X`` when ``module`` is ``mlsys_nb.X`` or inside it and ``mlsys_nb.X`` is a package, else None."""
    parts = module.split(".")
    if parts[0] != "mlsys_nb" or len(parts) < 2:
        return None
    top = ".".join(parts[:2])
    spec = importlib.util.find_spec(top)
    return top if spec is not None and spec.submodule_search_locations is not None else None


def imported_from_packages(source: str) -> list[tuple[int, str, str]]:
    """(line, package, name) for each name a cell imports from a subpackage ``mlsys_nb.X`` or a module in it."""
    found = []
    for node in ast.walk(ast.parse(_python(source))):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            package = _package_of(node.module)
            if package is not None:
                found.extend((node.lineno, package, a.name) for a in node.names if a.name != "*")
    return found


def mentioned(name: str, doc: str) -> bool:
    """Is ``name`` a word of ``doc`` (``run_step`` is in "``executor.run_step``", not in "``run_steps``")?"""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", doc) is not None


def missing_from_front_pages(source: str) -> list[tuple[int, str, str]]:
    """(line, package, name) for each name a cell imports from a subpackage whose front page does not mention it."""
    return [
        (line, package, name)
        for line, package, name in imported_from_packages(source)
        if not mentioned(name, importlib.import_module(package).__doc__ or "")
    ]


def test_the_check_reads_imports_from_packages_only_and_finds_words():
    cell = (
        "%matplotlib inline\nfrom mlsys_nb.pipeline.executor import run_step\nfrom mlsys_nb.pipeline import schedule\n"
        "from mlsys_nb.config import ModelConfig\nfrom mlsys_nb import plots\nimport mlsys_nb.comm as comm"
    )
    assert imported_from_packages(cell) == [
        (2, "mlsys_nb.pipeline", "run_step"),
        (3, "mlsys_nb.pipeline", "schedule"),
    ]  # config is a plain module; ``from mlsys_nb import ...`` and ``import`` name no package page
    assert mentioned("run_step", "runs ``executor.run_step`` on every rank")
    assert not mentioned("run_step", "``run_steps``") and not mentioned("step", "``run_step``")
    assert missing_from_front_pages("from mlsys_nb.pipeline import schedule") == []  # its front page lists it
    assert missing_from_front_pages("from mlsys_nb.pipeline.schedules import dependency_not_there") == [
        (1, "mlsys_nb.pipeline", "dependency_not_there")
    ]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:3].rstrip("_"))
def test_front_pages_mention_every_name_a_notebook_imports_from_them(nb):
    flagged = sorted(
        {
            f"{package}/__init__.py does not mention {name!r} (cell {i} line {line})"
            for i, (line, package, name) in _per_code_cell(nb, missing_from_front_pages)
        }
    )
    assert not flagged, f"{nb.name} imports names its front pages do not list:\n" + "\n".join(flagged)
