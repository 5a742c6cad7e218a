"""``mlsys_nb.runtime.notebook``: the one parameter check of a notebook's first cell, and the checks a run records
(``passed`` and ``check_margin``), read back by ``tests/nbrun.recorded_checks`` from a real papermill run."""

import json

import nbformat
import pytest

import nbrun
from mlsys_nb.config import ArgumentError, check_number
from mlsys_nb.runtime import check_margin, notebook
from mlsys_nb.runtime.notebook import check_parameters, passed


@pytest.mark.parametrize(
    "params, rules, message",
    [
        ({"world_size": 9}, {"world_size": range(2, 9)}, "world_size must be an int in 2..8, got 9"),
        ({"world_size": 2.0}, {"world_size": range(2, 9)}, "world_size must be an int in 2..8, got 2.0"),
        ({"world_size": True}, {"world_size": range(1, 9)}, "world_size must be an int in 1..8, got True"),
        ({"k": 3}, {"k": range(2, 9, 2)}, "k must be one of (2, 4, 6, 8), got 3"),
        ({"it": 0}, {"it": (None, range(1, 1001))}, "it must be None or an int in 1..1000, got 0"),
        ({"backend": "mpi"}, {"backend": ("auto", "gloo")}, "backend must be 'auto' or 'gloo', got 'mpi'"),
        ({"use_ray": 1}, {"use_ray": (True, False)}, "use_ray must be True or False, got 1"),
        ({"lr": 2.0}, {"lr": lambda n, v: check_number(n, v, 0, 1)}, "lr must be a finite number >= 0 and <= 1"),
        ({}, {"steps": range(1, 5)}, "steps is not defined: set it in the parameters cell"),
        ({"steps": 3}, {"steps": 3}, "the rule for steps must be a range, a collection or a function"),
    ],
)
def test_a_bad_parameter_is_named_with_what_it_may_be(params, rules, message):
    with pytest.raises(ArgumentError) as e:
        check_parameters(params, **rules)
    assert message in str(e.value)


def test_good_parameters_pass_and_world_size_starts_the_rank_factory(monkeypatch):
    started = []
    monkeypatch.setattr("mlsys_nb.runtime.ranks.prestart", lambda: started.append(True))
    ns = {"steps": 4, "backend": "gloo", "it": None, "lr": 0.5}
    check_parameters(ns, steps=range(1, 5), backend=("auto", "gloo"), it=(None, range(1, 9)), lr=lambda n, v: v)
    assert started == []  # no world_size: no ranks
    check_parameters({"world_size": 2}, world_size=range(2, 9))
    assert started == [True]


def test_passed_and_check_margin_record_in_order(tmp_path, monkeypatch, capsys):
    log = tmp_path / "checks.jsonl"
    monkeypatch.setenv(notebook.CHECK_LOG_ENV, str(log))
    monkeypatch.setattr(notebook, "RECORD", [])
    check_margin("reward rise", 2.5, ">", 1.5)
    passed("the reward rises")
    with pytest.raises(AssertionError):
        check_margin("loss", 3.0, "<", 2.0)  # a failing margin is recorded too (with negative room)
    with pytest.raises(ArgumentError, match="label"):
        passed("two\nlines")
    out = capsys.readouterr().out
    assert "check passed: the reward rises\n" in out
    got = notebook.read_check_log(log)
    assert [(c["kind"], c["label"]) for c in got] == [
        ("margin", "reward rise"),
        ("passed", "the reward rises"),
        ("margin", "loss"),
    ]
    assert got[0]["room"] == pytest.approx(1.0) and got[2]["room"] == pytest.approx(-1.0)
    assert got == notebook.RECORD
    assert notebook.read_check_log(tmp_path / "none.jsonl") == []
    assert all(json.loads(line) for line in log.read_text().splitlines())


@pytest.mark.notebook
def test_a_notebook_run_records_its_checks(tmp_path, monkeypatch):
    """A real papermill run: the kernel inherits MLSYS_NB_CHECK_LOG and records each check; a second run of the
    same notebook starts a fresh record; a check not reached is not recorded."""
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("x = 0"),
        nbformat.v4.new_code_cell(
            "from mlsys_nb import passed\nfrom mlsys_nb.runtime import check_margin\n"
            'check_margin("x plus one", x + 1, ">", 0.5)\npassed("x is set")'
        ),
        nbformat.v4.new_code_cell('assert x < 2, "x too big"\npassed("x is small")'),
    ]
    nb.cells[0].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"name": nbrun.kernel_name(), "display_name": "Python 3", "language": "python"}
    name = "tiny_checks" + ".ipynb"  # a scratch notebook built here (so tests/test_sources.py reads no citation)
    nbformat.write(nb, tmp_path / name)
    monkeypatch.setattr(nbrun, "NOTEBOOKS", tmp_path)
    monkeypatch.setattr(nbrun, "ARTIFACTS", tmp_path / "out")
    for _ in range(2):
        run = nbrun.run_notebook(name, x=1)
        assert nbrun.passed_labels(run) == ["x is set", "x is small"]
    assert [c["kind"] for c in nbrun.recorded_checks(run)] == ["margin", "passed", "passed"]
    assert nbrun.recorded_checks(run, "margin")[0]["value"] == 2.0
    with pytest.raises(Exception, match="x too big"):
        nbrun.run_notebook(name, x=5)
    out = nbrun.check_log_path(tmp_path / "out" / ("tiny_checks__x-5" + ".ipynb"))
    assert [c["label"] for c in notebook.read_check_log(out)] == ["x plus one", "x is set"]
