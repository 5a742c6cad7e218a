"""Tests read public state only (issue 48): no test reads or patches a private name of the kit (``x._name`` where
``_name`` is a function, class, method, attribute or module variable that ``mlsys_nb`` defines), so a refactor of a
module's insides never breaks a test of its behaviour. Names of other libraries (``os._exit``, a namedtuple's
``_replace``, ipywidgets' ``_dom_classes``) are not the kit's and pass; a test's own classes may use ``self._x``."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def kit_private_names(package: Path = ROOT / "mlsys_nb") -> set[str]:
    """Every ``_name`` (not dunder) the package defines: defs, classes, assigned module names and attributes."""
    names = set()
    for f in package.rglob("*.py"):
        for n in ast.walk(ast.parse(f.read_text())):
            if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(n.name)
            elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                names.add(n.id)
            elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                names.add(n.attr)
    return {x for x in names if x.startswith("_") and not x.startswith("__")}


def private_reads(source: str, private: set[str]) -> list[str]:
    """``line: expr._name`` for each read (or patch) of a kit-private name in a test's source: attribute access
    on anything but ``self``/``cls``, ``from mlsys_nb... import _name``, and ``setattr(x, "_name", ...)`` /
    ``monkeypatch.setattr(x, "_name", ...)``."""
    found = []
    for n in sorted(ast.walk(ast.parse(source)), key=lambda n: (getattr(n, "lineno", 0), getattr(n, "col_offset", 0))):
        if isinstance(n, ast.Attribute) and n.attr in private:
            if not (isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")):
                found.append(f"{n.lineno}: .{n.attr}")
        elif isinstance(n, ast.ImportFrom) and (n.module or "").startswith("mlsys_nb"):
            found += [f"{n.lineno}: import {a.name}" for a in n.names if a.name in private]
        elif isinstance(n, ast.Call) and len(n.args) >= 2 and isinstance(n.args[1], ast.Constant):
            fn = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
            if fn in ("setattr", "getattr") and n.args[1].value in private:
                found.append(f"{n.lineno}: {fn} {n.args[1].value}")
    return found


def test_tests_read_no_private_name_of_the_kit():
    private = kit_private_names()
    bad = {}
    for f in sorted((ROOT / "tests").rglob("*.py")):
        if hits := private_reads(f.read_text(), private):
            bad[str(f.relative_to(ROOT))] = hits
    assert not bad, f"tests reading private kit state (give it a public name or accessor): {bad}"


def test_the_scan_flags_each_way_of_reading_private_state():
    """The mutation: a test that reads, imports or patches a private kit name is flagged; others' privates, a
    test's own ``self._x`` and public names are not."""
    private = {"_ticker", "_route", "_helper"}
    src = "\n".join(
        [
            "from mlsys_nb.x import _helper",
            "w._ticker.playing",
            "monkeypatch.setattr(ep.EPMoE, '_route', f)",
            "os._exit(3)",
            "self._ticker = 1",
            "w.ticker.playing",
        ]
    )
    assert private_reads(src, private) == ["1: import _helper", "2: ._ticker", "3: setattr _route"]
    assert "_tick" in kit_private_names() or "_finalizer" in kit_private_names()  # the scan sees the kit
