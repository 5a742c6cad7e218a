"""Repository invariants: notebooks stored clean and parameterised, env files in agreement."""

import json
import re
import tomllib
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _deps_pyproject():
    pp = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = list(pp["dependencies"])
    for extra in pp["optional-dependencies"].values():
        deps += extra
    return deps


def _name(req: str) -> str:
    return re.split(r"[<>=!~ \[;]", req, maxsplit=1)[0].lower().replace("_", "-")


def test_there_are_notebooks():
    assert NOTEBOOKS, "notebooks/ holds no .ipynb"


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_clean_and_parameterised(nb):
    data = json.loads(nb.read_text())
    pattern = r"\d\d[a-z]?_[a-z0-9_]+\.ipynb"  # NNx: inserted after NN (docs/adding-a-topic.md)
    assert re.fullmatch(pattern, nb.name), f"{nb.name}: name must be NN_topic.ipynb or NNx_topic.ipynb"
    code = [c for c in data["cells"] if c["cell_type"] == "code"]
    with_outputs = [i for i, c in enumerate(code) if c.get("outputs") or c.get("execution_count")]
    assert not with_outputs, f"{nb.name}: code cells {with_outputs} are stored with outputs; clear them"
    tagged = [c for c in code if "parameters" in c.get("metadata", {}).get("tags", [])]
    assert len(tagged) == 1, f"{nb.name}: needs exactly one code cell tagged 'parameters'"
    assert any("assert" in "".join(c["source"]) for c in code), f"{nb.name}: ends no section on a check"
    assert data["metadata"].get("kernelspec", {}).get("name") == "mlsys_nb", f"{nb.name}: kernel must be mlsys_nb"


def test_environment_yml_lists_the_pyproject_dependencies():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    conda_names = {_name(d) for d in env["dependencies"] if isinstance(d, str)}
    assert "python" in conda_names
    pip_reqs = {_name(r): r.replace(" ", "") for r in pip_section}
    for req in _deps_pyproject():
        n = _name(req)
        assert n in pip_reqs, f"environment.yml pip section lacks {req!r} (from pyproject.toml)"
        assert pip_reqs[n] == req.replace(" ", ""), f"environment.yml pins {pip_reqs[n]!r}, pyproject {req!r}"
    extra = set(pip_reqs) - {_name(r) for r in _deps_pyproject()} - {"-e ."}
    assert not {e for e in extra if not e.startswith("-e")}, f"environment.yml has extra pip packages: {extra}"


def test_constraints_cover_every_pinned_dependency():
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        if line and not line.startswith("#"):
            n, v = line.split("==")
            pins[_name(n)] = v
    for req in _deps_pyproject():
        if "==" in req:
            n, v = _name(req), req.split("==")[1]
            assert pins.get(n) == v, f"constraints.txt pins {n}=={pins.get(n)}, pyproject.toml =={v}"


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    assert "make lab" in readme and "make test" in readme
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_every_data_file_is_described():
    described = (ROOT / "data" / "README.md").read_text()
    for f in sorted((ROOT / "data").rglob("*")):
        if f.is_file() and f.name != "README.md" and f.parent.name != "measured":
            assert f.name in described, f"data/README.md does not describe {f.name}"
