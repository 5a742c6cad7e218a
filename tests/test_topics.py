"""The recipe for adding a topic (docs/adding-a-topic.md): each place a topic touches is checked
here or by the test the recipe names, and the notebook numbering rule (``NN`` or ``NNx`` for a
notebook inserted after ``NN``) is the one every parser of notebook names accepts."""

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "mlsys_nb"
NOTEBOOK_NAME = re.compile(r"(\d\d[a-z]?)_[a-z0-9_]+\.ipynb")
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
FRONT_PAGES = ["mlsys_nb"] + sorted(f"mlsys_nb.{p.name}" for p in PKG.iterdir() if (p / "__init__.py").exists())


def test_the_recipe_exists_and_names_tests_that_exist():
    recipe = (ROOT / "docs" / "adding-a-topic.md").read_text()
    named = set(re.findall(r"`(tests/test_[a-z0-9_]+\.py)(?:::(\w+))?`", recipe))  # NN: a placeholder
    assert len(named) >= 10, named
    for path, test in named:
        assert (ROOT / path).exists(), f"docs/adding-a-topic.md names {path}, which does not exist"
        if test:
            assert re.search(rf"^def {test}\b", (ROOT / path).read_text(), re.M), f"{path} has no {test}"


def test_every_notebook_follows_the_numbering_rule():
    for nb in NOTEBOOKS:
        assert NOTEBOOK_NAME.fullmatch(nb.name), f"{nb.name}: name must match {NOTEBOOK_NAME.pattern}"
    numbers = [NOTEBOOK_NAME.fullmatch(nb.name).group(1) for nb in NOTEBOOKS]
    assert len(numbers) == len(set(numbers)), f"two notebooks share a number: {numbers}"


def test_an_inserted_notebook_sorts_after_the_one_it_follows():
    nb = lambda number, topic: f"{number}_{topic}.ipynb"  # built, not written out: no file to cite
    names = [nb("05", "data_parallelism"), nb("06", "zero_and_fsdp"), nb("05b", "profiling"), nb("05c", "more")]
    assert all(NOTEBOOK_NAME.fullmatch(n) for n in names)
    assert sorted(names) == [names[0], names[2], names[3], names[1]]
    assert not NOTEBOOK_NAME.fullmatch(nb("5b", "profiling")) and not NOTEBOOK_NAME.fullmatch(nb("05B", "x"))


def test_every_notebook_has_its_papermill_test():
    """Notebook NN (NNx) is run with other parameters by tests/test_nb_NN.py (test_nb_NNx.py); the
    dashboard notebook 00 is driven by tests/test_dashboard*.py instead."""
    for nb in NOTEBOOKS:
        number = NOTEBOOK_NAME.fullmatch(nb.name).group(1)
        if number == "00":
            assert (ROOT / "tests" / "test_dashboard.py").exists()
            continue
        test = ROOT / "tests" / f"test_nb_{number}.py"
        assert test.exists(), f"{nb.name} has no {test.relative_to(ROOT)}"
        assert nb.name in test.read_text() or nb.stem in test.read_text(), f"{test.name} does not name {nb.name}"


def test_readme_table_lists_every_notebook():
    readme = (ROOT / "README.md").read_text()
    for nb in NOTEBOOKS:
        assert f"(notebooks/{nb.name})" in readme, f"README's notebook table has no row linking notebooks/{nb.name}"


def test_every_quiz_topic_names_existing_notebooks():
    from mlsys_nb.quiz.core import TOPICS

    have = {nb.name for nb in NOTEBOOKS}
    for topic, (_, where) in TOPICS.items():
        names = re.findall(r"(\d\d[a-z]?_[a-z0-9_]+\.ipynb)", where)
        assert names, f"quiz topic {topic!r} names no notebook"
        assert set(names) <= have, f"quiz topic {topic!r} names {set(names) - have}, which do not exist"


@pytest.mark.parametrize("front", FRONT_PAGES)
def test_every_front_page_exports_names_that_exist(front):
    mod = importlib.import_module(front)
    names = getattr(mod, "__all__", None)
    if names is None:
        pytest.skip(f"{front} declares no __all__")
    assert len(names) == len(set(names)), f"{front}.__all__ lists a name twice"
    missing = [n for n in names if not hasattr(mod, n)]
    assert not missing, f"{front}.__all__ names {missing}, which {front} does not define"


def test_data_readme_lists_every_measured_record():
    described = (ROOT / "data" / "README.md").read_text()
    # a benchmark's *.lock (git ignores it: benchmarks/portability.py shares the record through it) is no record
    records = sorted(f.name for f in (ROOT / "data" / "measured").iterdir() if f.is_file() and f.suffix != ".lock")
    missing = [name for name in records if name not in described]
    assert not missing, f"data/README.md does not list data/measured/{missing}"
