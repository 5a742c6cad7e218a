"""What a notebook prints with ``inspect.getsource`` is public and at most 60 lines (issue 48).

A notebook that prints the kit's code asks the learner to read it, so the target must be something the
learner can import by name (no component of its qualified name starts with ``_``; dunder methods such as
``__init__`` are fine) and short enough to read in one screen. A slice of the printed text
(``inspect.getsource(x).split(...)[1][:1500]``) still counts the whole object: what is printed in part is
still the object the learner is sent to read.

The scan: an AST pass over each code cell (IPython magics blanked) finds every ``inspect.getsource(<expr>)``
(or ``getsource(<expr>)``); ``<expr>`` is evaluated against the kit imports of the notebook's cells up to that
one (only ``import``/``from ... import`` statements of the kit are executed). A loop variable over a literal
tuple (``for fn in (A.f, B.g): print(inspect.getsource(fn))``) stands for each element. A name the notebook
defines itself (a ``def`` or ``class`` in a cell) is the notebook's own code and is not the kit's to judge.
"""

from __future__ import annotations

import ast
import inspect
import json
import sys
from pathlib import Path

import pytest
from test_notebook_imports import NOTEBOOKS, _python

import mlsys_nb.kernels  # noqa: F401  (at collection: sets TRITON_INTERPRET before any test imports triton)

MAX_LINES = 60
KIT = ("mlsys_nb",)


def _is_getsource(call: ast.AST) -> bool:
    if not isinstance(call, ast.Call) or len(call.args) != 1:
        return False
    f = call.func
    return (isinstance(f, ast.Attribute) and f.attr == "getsource" and isinstance(f.value, ast.Name)) or (
        isinstance(f, ast.Name) and f.id == "getsource"
    )


def _kit_imports(tree: ast.AST, kit) -> list[ast.stmt]:
    """The ``import``/``from ... import`` statements of the kit anywhere in a cell (function bodies included)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and all(a.name.split(".")[0] in kit for a in node.names):
            out.append(node)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] in kit:
            out.append(node)
    return out


def _loop_literals(tree: ast.AST) -> dict[str, list[ast.expr]]:
    """``{name: [element, ...]}`` for each ``for name in (a, b, ...)`` over a literal tuple or list."""
    return {
        node.target.id: list(node.iter.elts)
        for node in ast.walk(tree)
        if isinstance(node, ast.For)
        and isinstance(node.target, ast.Name)
        and isinstance(node.iter, (ast.Tuple, ast.List))
    }


def _defined(cells: list[str]) -> set[str]:
    """Names the notebook's cells define themselves (``def``, ``class``)."""
    names = set()
    for source in cells:
        for node in ast.walk(ast.parse(_python(source))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
    return names


def printed_targets(cells: list[str], kit=KIT) -> list[tuple[int, int, str, object]]:
    """(cell, line, expression, object) for each ``inspect.getsource(<expr>)`` in ``cells`` (code cell sources,
    in order). ``object`` is what ``<expr>`` names, or an ``Exception`` if it could not be resolved; targets that
    are the notebook's own functions are left out."""
    namespace: dict = {}
    own = _defined(cells)
    found = []
    for i, source in enumerate(cells):
        tree = ast.parse(_python(source))
        imports = _kit_imports(tree, kit)
        if imports:
            exec(compile(ast.Module(body=imports, type_ignores=[]), f"<cell {i}>", "exec"), namespace)
        loops = _loop_literals(tree)
        for call in (n for n in ast.walk(tree) if _is_getsource(n)):
            arg = call.args[0]
            exprs = loops[arg.id] if isinstance(arg, ast.Name) and arg.id in loops else [arg]
            for expr in exprs:
                root = expr
                while isinstance(root, ast.Attribute):
                    root = root.value
                if isinstance(root, ast.Name) and root.id in own and root.id not in namespace:
                    continue  # the notebook's own code
                try:
                    obj = eval(compile(ast.Expression(expr), f"<cell {i}>", "eval"), dict(namespace))
                except Exception as e:  # noqa: BLE001 - reported as a finding
                    obj = e
                found.append((i, call.lineno, ast.unparse(expr), obj))
    return found


def problems(obj) -> list[str]:
    """Why a printed target fails the rule: a private component of its name, more than 60 lines, or no source."""
    if isinstance(obj, Exception):
        return [f"cannot be resolved from the notebook's kit imports ({type(obj).__name__}: {obj})"]
    target = inspect.unwrap(obj)
    module = getattr(target, "__module__", "") or ""
    qualname = getattr(target, "__qualname__", getattr(target, "__name__", ""))
    out = []
    private = [p for p in (*module.split("."), *qualname.split(".")) if p.startswith("_") and not p.startswith("__")]
    if private:
        out.append(f"{module}.{qualname} is private ({', '.join(private)}): give it a public name")
    try:
        n = len(inspect.getsource(obj).splitlines())
    except (OSError, TypeError) as e:
        return [*out, f"has no source ({e})"]
    if n > MAX_LINES:
        out.append(f"{module}.{qualname} is {n} lines (at most {MAX_LINES}): print a shorter, readable version")
    return out


def _code_cells(nb: Path) -> list[str]:
    """Each cell's source, ``""`` for a markdown cell (so that indices are the notebook's cell numbers)."""
    return ["".join(c["source"]) if c["cell_type"] == "code" else "" for c in json.loads(nb.read_text())["cells"]]


def test_the_check_flags_private_and_long_targets_even_in_a_slice(tmp_path, monkeypatch):
    body = "\n".join(f"    x{i} = {i}" for i in range(58))
    (tmp_path / "fake_kit.py").write_text(
        "def short():\n    return 1\n\n\n"
        "def _hidden():\n    return 2\n\n\n"
        f"def long():\n{body}\n    return 0\n\n\n"  # def + 58 + return = 60 lines: allowed
        f"def too_long():\n{body}\n    x = 1\n    return x\n\n\n"  # 61 lines
        "class Box:\n    def __init__(self):\n        self.x = 1\n\n    def _inner(self):\n        return 1\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "fake_kit", raising=False)
    kit = (*KIT, "fake_kit")
    cells = [
        "%load_ext something\nimport inspect\nimport fake_kit as fk\nfrom fake_kit import Box",
        "print(inspect.getsource(fk.short))\nprint(inspect.getsource(fk.long))\nprint(inspect.getsource(Box.__init__))",
        "print(inspect.getsource(fk._hidden))",
        'print(inspect.getsource(fk.too_long).split("x3")[1][:100])  # a slice still counts the whole object',
        "for fn in (Box._inner, fk.short):\n    print(inspect.getsource(fn))",
        "def mine():\n    pass\nprint(inspect.getsource(mine))",
        "print(inspect.getsource(fk.missing))",
    ]
    flagged = {(cell, expr): problems(obj) for cell, _line, expr, obj in printed_targets(cells, kit)}
    assert [k for k, v in flagged.items() if not v] == [
        (1, "fk.short"),
        (1, "fk.long"),
        (1, "Box.__init__"),
        (4, "fk.short"),
    ]
    assert "private (_hidden)" in flagged[(2, "fk._hidden")][0]
    assert "61 lines" in flagged[(3, "fk.too_long")][0]
    assert "private (_inner)" in flagged[(4, "Box._inner")][0]
    assert "cannot be resolved" in flagged[(6, "fk.missing")][0]
    assert (5, "mine") not in flagged  # the notebook's own function


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name[:3].rstrip("_"))
def test_what_a_notebook_prints_is_public_and_at_most_60_lines(nb):
    flagged = [
        f"cell {cell} line {line}: inspect.getsource({expr}): {why}"
        for cell, line, expr, obj in printed_targets(_code_cells(nb))
        for why in problems(obj)
    ]
    assert not flagged, f"{nb.name} prints code a learner should not be sent to read:\n" + "\n".join(flagged)
