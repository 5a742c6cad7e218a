"""Under CI a test whose package cannot be imported fails instead of skipping (tests/conftest.py),
and ``.ci/run`` sets ``CI`` itself, so a broken install cannot turn the suite green by skipping."""

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MISSING = "mlsys_nb_no_such_module_for_this_test"


def test_missing_module_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=MISSING):
        pytest.importorskip(MISSING)


def test_missing_module_skips_on_a_laptop(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        pytest.importorskip(MISSING)


def test_present_module_is_returned_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert pytest.importorskip("json").dumps([1]) == "[1]"


def test_ci_script_exports_ci():
    text = (ROOT / ".ci" / "run").read_text()
    assert "export CI=true" in text, ".ci/run must set CI itself so missing extras fail loudly"
