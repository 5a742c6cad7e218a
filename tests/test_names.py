"""One name, one meaning (issue 48): no public top-level name is defined in two modules of ``mlsys_nb``.

An AST pass over every module reads its top-level definitions (``def``, ``class``, and assignments to a
name that is not an UPPER_CASE constant, including those under a top-level ``if``/``try``/``with``). A name
without a leading underscore defined in two modules fails, whatever the two mean: a learner who meets
``evaluate`` or ``quantize`` should find one function. A re-export (``from .x import name``) or an alias
of an imported object (``name = module.name``) is not a definition. Constants get their own check: one
UPPER_CASE name with the same value in two modules is a copied fact (``GB = 1e9`` twice), which should be
one constant imported from its owner. No allow-list."""

import ast
from collections import defaultdict

from test_imports import PKG, module_name  # one module walk for both tests


def is_constant(name: str) -> bool:
    return name.upper() == name and any(c.isalpha() for c in name)


def top_level(body):
    """The statements of a module body, descending into top-level if/try/with blocks."""
    for node in body:
        if isinstance(node, ast.If | ast.With):
            yield from top_level(node.body + getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            yield from top_level(node.body + node.orelse + node.finalbody + [s for h in node.handlers for s in h.body])
        else:
            yield node


def imported_names(tree) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import | ast.ImportFrom):
            out.update((a.asname or a.name).split(".")[0] for a in node.names)
    return out


def root_name(expr) -> str | None:
    while isinstance(expr, ast.Attribute):
        expr = expr.value
    return expr.id if isinstance(expr, ast.Name) else None


def definitions(source: str) -> tuple[list[str], dict[str, str]]:
    """(public names a module defines, {UPPER_CASE constant: its value's source}) at its top level."""
    tree = ast.parse(source)
    imported = imported_names(tree)
    names, constants = [], {}
    for node in top_level(tree.body):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if not node.name.startswith("_"):
                names.append(node.name)
            continue
        if isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets, value = [node.target], node.value
        else:
            continue
        alias = isinstance(value, ast.Name | ast.Attribute) and root_name(value) in imported
        for target in targets:
            for n in ast.walk(target):
                if not isinstance(n, ast.Name) or n.id.startswith("_"):
                    continue
                if is_constant(n.id):
                    constants[n.id] = ast.unparse(value)
                elif not alias:
                    names.append(n.id)
    return names, constants


def scan(files: dict[str, str]) -> tuple[dict[str, list[str]], dict[tuple[str, str], list[str]]]:
    """{name: modules defining it} and {(constant, value): modules defining it}, for names in 2+ modules."""
    where, consts = defaultdict(list), defaultdict(list)
    for mod, source in sorted(files.items()):
        names, constants = definitions(source)
        for name in dict.fromkeys(names):
            where[name].append(mod)
        for name, value in constants.items():
            consts[name, value].append(mod)
    return (
        {n: m for n, m in where.items() if len(m) > 1},
        {k: m for k, m in consts.items() if len(m) > 1},
    )


def package_sources() -> dict[str, str]:
    return {module_name(p): p.read_text() for p in sorted(PKG.rglob("*.py"))}


def test_no_public_name_is_defined_in_two_modules():
    clashes, _ = scan(package_sources())
    assert not clashes, "public names defined in more than one module (give each meaning its own name):\n" + "\n".join(
        f"  {n}: {', '.join(m)}" for n, m in sorted(clashes.items())
    )


def test_no_constant_is_copied_into_two_modules():
    _, copies = scan(package_sources())
    assert not copies, "one constant defined twice with the same value (import it from its owner):\n" + "\n".join(
        f"  {n} = {v}: {', '.join(m)}" for (n, v), m in sorted(copies.items())
    )


def test_the_scan_catches_a_second_definition_and_passes_a_re_export():
    files = {
        "a": "def evaluate(x):\n    return x\n\nGB = 1e9\n",
        "b": "from .a import evaluate\nimport a\nlink = a.evaluate\n",
        "c": "class evaluate:\n    pass\n",
        "d": "try:\n    quantize = lambda x: x\nexcept ImportError:\n    pass\nGB = 1e9\nKB = 1e3\n",
        "e": "def quantize(x):\n    return x\n\n_private = 1\nKB = 1024\n",
        "f": "def _private():\n    pass\n",
    }
    clashes, copies = scan(files)
    assert clashes == {"evaluate": ["a", "c"], "quantize": ["d", "e"]}
    assert copies == {("GB", "1000000000.0"): ["a", "d"]}
