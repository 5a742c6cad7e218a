"""Every notebook's "Try it yourself" exercises follow one convention (issue 22): worked solutions
sit in cells tagged ``solution``, hidden, that run only ``if solutions:``; the parameters cell
declares ``solutions = False``; the stored notebooks carry no outputs (tests/test_repo.py)."""

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = [p for p in sorted((ROOT / "notebooks").glob("*.ipynb")) if not p.name.startswith("00_")]


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.name)
def test_solutions_are_hidden_and_run_only_with_solutions(nb):
    cells = json.loads(nb.read_text())["cells"]
    src = ["".join(c["source"]) for c in cells]
    params = [s for c, s in zip(cells, src) if "parameters" in c["metadata"].get("tags", [])]
    assert params and re.search(r"^solutions = False", params[0], re.M), f"{nb.name}: no `solutions = False` parameter"
    assert any("Try it yourself" in s for c, s in zip(cells, src) if c["cell_type"] == "markdown"), nb.name
    sols = [i for i, c in enumerate(cells) if "solution" in c["metadata"].get("tags", [])]
    assert sols, f"{nb.name}: a 'Try it yourself' section without a worked solution cell"
    for i in sols:
        assert src[i].lstrip().startswith("if solutions:"), f"{nb.name} cell {i}: must run only `if solutions:`"
        assert cells[i]["metadata"].get("jupyter", {}).get("source_hidden"), f"{nb.name} cell {i}: not hidden"
    text = "\n".join(src)
    # mlsys_nb.exercises.exercise prints "not attempted" for an untouched stub (tests/test_exercises.py)
    says = "from mlsys_nb.exercises import" in text and "exercise(" in text
    assert says, f"{nb.name}: no check goes through mlsys_nb.exercises.exercise for an untouched stub"
