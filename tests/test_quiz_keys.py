"""Every key the quiz prints reads back through its own checker as correct (issue 53, "Practice")."""

from __future__ import annotations

import re

import pytest

from mlsys_nb import quiz
from mlsys_nb.quiz import units

FAMILIES = quiz.families()
SEEDS = range(4)


def printed_forms(q) -> list[str]:
    """The key as the quiz prints it: ``answer_text()`` whole (``"28 GB (2.8e+10 B = 26.08 GiB)"``), each
    of its parts (``"28 GB"``, ``"2.8e+10 B"``, ``"26.08 GiB"``) and ``answer_response()``."""
    text = q.answer_text()
    parts = [p.strip() for p in re.split(r" \(|\)| = ", text) if p.strip()]
    return [text, *parts, q.answer_response()]


@pytest.mark.parametrize("topic", quiz.topics())
def test_every_printed_key_round_trips_through_the_checker(topic):
    for name in quiz.families(topic):
        for seed in SEEDS:
            q = quiz.make(name, seed)
            forms = [q.answer] if q.is_choice else printed_forms(q)
            for form in forms:
                r = q.check(form)
                assert r.ok, (name, seed, form, r.feedback)


def test_a_bytes_per_parameter_key_written_10_B_is_ten_not_ten_billion():
    """The key of memory.bytes_per_param (a count) prints "... = 10 B."; "10 B" must check as 10, while
    "7 B" parameters still reads 7 billion."""
    q = next(q for q in (quiz.make("memory.bytes_per_param", s) for s in range(50)) if q.answer == 10)
    assert q.solution[-1].endswith("= 10 B.")
    assert q.check("10 B").ok and q.check("10 count").ok and not q.check("16 B").ok
    assert units.parse("7 B", "params") == 7e9 and units.readings("10 B", "count") == [10e9, 10]
    assert units.parse("28 GB (2.8e+10 B = 26.08 GiB)", "bytes") == 28e9


def test_an_unreadable_answer_is_not_a_number():
    q = quiz.make("memory.model_states", 0)
    r = q.check("banana")
    assert not r.ok and r.value is None and "could not read" in r.feedback
