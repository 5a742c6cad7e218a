"""Worksheets (issue 53): no question twice on a sheet, a header (topic, time, units accepted), room to
work, and answer keys that show the arithmetic rather than a calculator call."""

from __future__ import annotations

import re

import pytest

from mlsys_nb import quiz
from mlsys_nb.quiz import core, html


@pytest.mark.parametrize("seed", [0, 3, "x"])
def test_a_sheet_never_asks_the_same_question_twice(seed):
    """Twice as many questions as the topic has families (profiling at seed 3, n=8 drew one question twice
    before): every text differs, and a family's first question is still ``make(f, f"{seed}:0")``."""
    for topic in quiz.topics():
        n = 2 * len(quiz.families(topic))
        qs = quiz.worksheet(topic, n, seed=seed).questions[topic]
        texts = [q.text for q in qs]
        assert len(set(texts)) == n, (topic, seed, [t for t in texts if texts.count(t) > 1][:1])
        for q in qs[: len(quiz.families(topic))]:
            assert q.text == quiz.make(q.family, f"{seed}:0").text


def _sheet(tmp_path, topic, n, seed=3, answers=False):
    html.write_worksheets(tmp_path, seed=seed, n=n, topics=[topic])
    return (tmp_path / f"{topic}{'_answers' if answers else ''}.html").read_text()


def test_the_sheet_has_a_header_room_to_work_and_says_when_families_repeat(tmp_path):
    n_fam = len(quiz.families("profiling"))
    sheet = _sheet(tmp_path, "profiling", n_fam + 3)
    qs = quiz.worksheet("profiling", n_fam + 3, seed=3).questions["profiling"]
    minutes = sum(html.MINUTES[q.difficulty] for q in qs)
    assert "Profiling: traces, overlap, memory over time" in sheet and "05b_profiling" in sheet
    assert f"{minutes} minutes" in sheet
    assert "Units accepted" in sheet and "KB, MB, GB" in sheet  # profiling asks in bytes, among others
    assert sheet.count("<div class='work'>") == n_fam + 3
    assert f"This topic has {n_fam} question families: questions {n_fam + 1}-{n_fam + 3}" in sheet
    assert "question families" not in _sheet(tmp_path, "profiling", n_fam)


def test_answer_keys_show_arithmetic_not_calculator_calls(tmp_path):
    """No worked step cites a calculator inline ("(planner.evaluate(...).mfu)"): the names move to the
    line under the answer; a count's answer is the number ("16", not "16 count")."""
    for name in quiz.families():
        q = quiz.make(name, 0)
        steps, names = html.worked_steps(q)
        for step in steps:
            assert not re.search(r"\((?:see )?[a-z_]{2,}\.[a-z_]", step), (name, step)
        assert all(n in " ".join(q.solution) for n in names)
    q = quiz.make("layout.modelled_mfu", 0)
    steps, names = html.worked_steps(q)
    assert names == ["planner.evaluate"] and steps[-1] == f"MFU = {q.answer:.4g}."
    counts = [q for q in (quiz.make(f, 0) for f in quiz.families()) if q.unit == "count"]
    assert counts and all(not html.key_text(q).endswith("count") for q in counts)
    key = _sheet(tmp_path, "layout", 5, answers=True)
    assert "computed in mlsys_nb by planner.evaluate" in key and "(planner.evaluate" not in key


def test_every_unit_has_words_for_what_it_accepts():
    from mlsys_nb.quiz import units

    for u in units.UNITS:
        assert units.accepted(u)
    q = core.make("memory.model_states", 0)
    assert q.check("28.84 GB").value is not None  # the header's "GB" is read by the checker


def test_the_terminal_worksheet_starts_each_topic_with_its_header():
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-m", "mlsys_nb.quiz", "--topic", "profiling", "-n", "6", "--show-solutions"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    qs = quiz.worksheet("profiling", 6, seed="0").questions["profiling"]
    minutes = sum(html.MINUTES[q.difficulty] for q in qs)
    head = out.strip().splitlines()[0]
    assert head.startswith("== Profiling: traces, overlap, memory over time (profiling): 6 questions")
    assert f"about {minutes} minutes" in head and "asked again with other numbers" in head
