"""Notebook 20 under papermill: another seed and size with the worked solutions filled in and checked
(the defaults, seed 0 and n=3 with no answers, run under nbval), under PyTorch's kernels of another CPU
capability than this machine's (``other_capability``: the keys of the float32 families move by an ulp there)."""

import json
from pathlib import Path

import pytest
from nbrun import other_capability, passed_labels, printed_text, run_notebook

from mlsys_nb import quiz

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "20_interview_worksheets.ipynb"


def _cells():
    return json.loads(NOTEBOOK.read_text())["cells"]


def topics_missing(labels: list[str], n: int) -> list[str]:
    """The bank's topics (``quiz.topics()``, never a list written here) whose worksheet the recorded checks
    (``passed_labels``) do not show as answered and checked: ``<topic> worksheet, n/n answered correctly``."""
    return [t for t in quiz.topics() if f"{t} worksheet, {n}/{n} answered correctly" not in labels]


@pytest.mark.notebook
def test_notebook_20_solutions_pass_for_another_seed():
    seed, n = 7, 2
    nb = run_notebook("20_interview_worksheets.ipynb", capability=other_capability(), seed=seed, n=n, solutions=True)
    text = printed_text(nb)
    labels = passed_labels(nb)
    assert f"seed={seed}, n={n}: {n * len(quiz.topics())} questions over {len(quiz.topics())} topics" in text
    assert topics_missing(labels, n) == [], "topics drawn but never answered and checked in notebook 20"
    assert any(label.startswith(f"all {len(quiz.topics())} topics of the bank shown, answered") for label in labels)
    assert len(labels) == len(quiz.topics()) + 3, labels  # + the demo, the coverage, the mock interview
    assert "not attempted" not in text


def test_a_missing_topic_is_caught():
    """The coverage check bites: recorded checks that lack one topic's checked worksheet name that topic (here
    the last of the bank's list), and every topic of the bank has its section (show, stub, solution, check)."""
    n = 2
    full = [f"{t} worksheet, {n}/{n} answered correctly" for t in quiz.topics()]
    assert topics_missing(full, n) == []
    last = quiz.topics()[-1]
    cut = [label for label in full if not label.startswith(f"{last} worksheet")]
    assert topics_missing(cut, n) == [last]
    sources = ["".join(c["source"]) for c in _cells() if c["cell_type"] == "code"]
    for t in quiz.topics():
        for want in (f'show("{t}")', f'answers["{t}"] = [...] * n', f'worked_solutions("{t}")', f'check("{t}")'):
            assert sum(s.strip().endswith(want) for s in sources) == 1, f"notebook 20 has no single {want!r} cell"


def test_the_notebooks_coverage_cell_names_a_topic_left_out(capsys, monkeypatch):
    """The notebook's own closing check bites: its set-up cell and closing cell, run with every topic shown but
    the last of the bank's list, fail naming that topic; with all shown they pass. (One stub question per
    topic stands in for the worksheet: drawing the kernels families imports torch, seconds for nothing here.)"""
    from types import SimpleNamespace

    stub = SimpleNamespace(text="?", is_choice=False, unit="bytes", family="stub")
    fake = lambda topics, n, seed: quiz.Worksheet(seed, {t: [stub] * n for t in quiz.topics()})  # noqa: E731
    monkeypatch.setattr(quiz, "worksheet", fake)
    cells = {c["id"]: "".join(c["source"]) for c in _cells()}
    closing = next(src for src in cells.values() if src.startswith("missing = [t for t in quiz.topics()"))
    for left_out in (quiz.topics()[-1], None):
        ns = {"seed": 0, "n": 1, "solutions": False}
        exec(cells["nb20-02"], ns)
        for t in quiz.topics():
            if t != left_out:
                ns["show"](t)
        if left_out is None:
            exec(closing, ns)
            assert f"check passed: all {len(quiz.topics())} topics of the bank shown" in capsys.readouterr().out
        else:
            with pytest.raises(AssertionError, match=left_out):
                exec(closing, ns)


def test_stored_notebook_shows_no_answers():
    for c in _cells():
        if c["cell_type"] == "code":
            assert not c.get("outputs"), "the stored notebook must have no outputs"
            src = "".join(c["source"])
            if "solution" in c["metadata"].get("tags", []):
                assert src.startswith("if solutions:") and c["metadata"]["jupyter"]["source_hidden"]
            elif src.startswith("# Try it yourself"):
                assert src.rstrip().endswith("[...] * n"), src
