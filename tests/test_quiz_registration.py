"""How a quiz family is registered: its topic is the name of the bank module that declares it, and a declared
family (``numeric_family`` / ``ratio_family``) takes its registration as one ``family(...)`` call."""

from __future__ import annotations

import pytest

from mlsys_nb.config import ArgumentError
from mlsys_nb.quiz import core
from mlsys_nb.quiz.bank._util import numeric_family


@pytest.fixture
def registry(monkeypatch):
    """A copy of the registry, so that the families these tests register vanish after each one."""
    core.families()  # the bank is loaded before the copy
    monkeypatch.setattr(core, "REGISTRY", dict(core.REGISTRY))
    return core.REGISTRY


def _question(rng) -> dict:
    return dict(text="?", params={}, answer=1.0, unit="count", hints=[], solution=[])


def test_the_topic_is_the_name_of_the_declaring_bank_module(registry):
    """Catches a topic read off the wrong part of the module path (``mlsys_nb`` or the package ``bank``)."""
    _question.__module__ = "mlsys_nb.quiz.bank.comm"
    core.family("comm.zz_topic", section="s", reference="r")(_question)
    assert registry["comm.zz_topic"].topic == "comm"
    assert core.make("comm.zz_topic", 0).topic == "comm"


def test_a_family_declared_outside_a_bank_module_must_name_its_topic(registry):
    """Catches a derived topic that is never checked: this module's name is no quiz topic."""
    with pytest.raises(ArgumentError, match="topic"):
        core.family("comm.zz_nowhere")(lambda rng: _question(rng))
    core.family("comm.zz_named", "comm")(lambda rng: _question(rng))
    assert registry["comm.zz_named"].topic == "comm"


def test_a_declared_family_takes_its_registration_whole(registry):
    """``numeric_family(family(name, ...), ...)`` registers under that name with those options; options given
    twice (inside ``family(...)`` and to the builder) are refused. Catches a builder that drops the registration's
    difficulty or section, or that registers under its own idea of the name."""
    words = dict(draw=lambda rng: {"a": 2}, calc=lambda p: 3 * p["a"], unit="count", text="{a}?", hints=[])
    numeric_family(core.family("comm.zz_whole", "comm", difficulty=3, section="§9"), solution=["{result}"], **words)
    fam = registry["comm.zz_whole"]
    assert (fam.topic, fam.difficulty, fam.section) == ("comm", 3, "§9")
    q = core.make("comm.zz_whole", 0)
    assert (q.answer, q.text, q.difficulty, q.section) == (6.0, "2?", 3, "§9")
    with pytest.raises(TypeError, match="comm.zz_twice"):
        numeric_family(core.family("comm.zz_twice", "comm"), difficulty=2, solution=[], **words)
    assert "comm.zz_twice" not in registry
