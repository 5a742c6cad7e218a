"""Calculators a learner reads in one sitting (issue 48): no function in ``mlsys_nb/planner/`` or
``mlsys_nb/memory/`` is longer than 80 lines (``def`` to its last line, docstring and decorators included).

An AST scan over every file of both packages, methods and nested functions included. No allow-list: split a
long function into named steps (``search``: candidates, timing, estimates in step-time order, the frame)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("mlsys_nb/planner", "mlsys_nb/memory")
LIMIT = 80


def long_functions(source: str, filename: str, limit: int = LIMIT) -> list[str]:
    """``"file:line name (n lines)"`` for every function of ``source`` longer than ``limit`` lines."""
    out = []
    for node in ast.walk(ast.parse(source, filename=filename)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            n = node.end_lineno - first + 1
            if n > limit:
                out.append(f"{filename}:{node.lineno} {node.name} ({n} lines)")
    return out


def package_files() -> list[Path]:
    files = [p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))]
    assert len(files) >= 2 * 5, files  # both are packages of several files (not single modules any more)
    return files


def test_no_calculator_function_over_80_lines():
    found = [f for p in package_files() for f in long_functions(p.read_text(), str(p.relative_to(ROOT)))]
    assert not found, f"functions over {LIMIT} lines (split them into named steps):\n" + "\n".join(found)


def test_the_scan_catches_a_long_function_a_long_method_and_a_long_nested_one():
    body = "".join(f"    x{i} = {i}\n" for i in range(LIMIT - 1))  # def line + 79 = 80 lines: allowed
    ok = f"def fits():\n{body}"
    assert long_functions(ok, "ok") == []
    long = f"@decorator\ndef too_long():\n{body}"  # the decorator makes it 81
    nested = (
        "class C:\n    def method(self):\n        def inner():\n"
        + body.replace("    ", "            ")
        + "            x = 1\n"
    )
    assert long_functions(long, "a") == ["a:2 too_long (81 lines)"]
    assert [f.split(" ")[1] for f in long_functions(nested, "b")] == ["method", "inner"]
