"""The package's import graph (issue 29): no cycles, no private names across modules.

An AST pass over every module of ``mlsys_nb`` reads module- and function-level imports (relative
imports resolved) and fails on any cycle between modules and on any ``from X import _name`` or
``X._name`` where X is another module of the package. No allow-list. Which module may import which is
``tests/test_layers.py``'s job (docs/architecture.md's Layers table, read with ``scan`` below)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlsys_nb"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PKG.rglob("*.py"))}


def resolve(mod: str, is_pkg: bool, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = mod.split(".") if is_pkg else mod.split(".")[:-1]
    base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def owner(name: str, mods) -> str | None:
    """The package module that ``name`` (a dotted import target) refers to, longest prefix first."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        cand = ".".join(parts[:k])
        if cand in mods:
            return cand
    return None


def scan(mods):
    edges: dict[str, set[str]] = {m: set() for m in mods}
    private: list[str] = []
    for mod, path in mods.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        is_pkg = path.name == "__init__.py"
        aliases: dict[str, str] = {}  # local name -> package module
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    o = owner(a.name, mods)
                    if o:
                        edges[mod].add(o)
                        aliases[a.asname or a.name.split(".")[0]] = o if a.asname else a.name.split(".")[0]
            elif isinstance(node, ast.ImportFrom):
                base = resolve(mod, is_pkg, node.level, node.module)
                for a in node.names:
                    full = f"{base}.{a.name}" if base else a.name
                    if full in mods:  # a submodule
                        edges[mod].add(full)
                        aliases[a.asname or a.name] = full
                        continue
                    o = owner(base, mods)
                    if o is None:
                        continue
                    if o != mod:
                        edges[mod].add(o)
                    if a.name.startswith("_") and not a.name.startswith("__") and o != mod:
                        private.append(f"{mod}: from {o} import {a.name} (line {node.lineno})")
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
                chain = []
                v = node.value
                while isinstance(v, ast.Attribute):
                    chain.append(v.attr)
                    v = v.value
                if isinstance(v, ast.Name) and v.id in aliases:
                    target = ".".join([aliases[v.id], *reversed(chain)])
                    o = owner(target, mods)
                    if o and o != mod and target == o:
                        private.append(f"{mod}: {o}.{node.attr} (line {node.lineno})")
    return edges, private


def cycles(edges) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in edges:
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_modules():
    edges, _ = scan(modules())
    found = cycles(edges)
    assert not found, f"import cycles (move the shared thing to its owner, see docs/architecture.md): {found}"


def test_no_private_names_across_modules():
    _, private = scan(modules())
    assert not private, "private names used across modules (make them public in their owner):\n" + "\n".join(private)


def test_the_scan_catches_a_cycle_and_a_private_import(tmp_path, monkeypatch):
    """A fake package: a imports b at function level, b imports a at module level and a's private name."""
    pkg = tmp_path / "mlsys_nb"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from . import a\n")
    (pkg / "sub" / "a.py").write_text("def f():\n    from .b import g\n    return g\n\ndef _h():\n    pass\n")
    (pkg / "sub" / "b.py").write_text("from mlsys_nb.sub import a\nfrom .a import _h\n\ndef g():\n    return a._h\n")
    (pkg / "c.py").write_text("from .sub import b\n\nx = b.g\n")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    monkeypatch.setitem(globals(), "PKG", pkg)
    edges, private = scan(modules())
    assert cycles(edges) == [["mlsys_nb.sub.a", "mlsys_nb.sub.b"]]
    assert private == [
        "mlsys_nb.sub.b: from mlsys_nb.sub.a import _h (line 2)",
        "mlsys_nb.sub.b: mlsys_nb.sub.a._h (line 5)",
    ], private
    assert "mlsys_nb.sub.b" in edges["mlsys_nb.c"]
