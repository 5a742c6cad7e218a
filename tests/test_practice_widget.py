"""The Practice tab headless: answer / check / hint / reveal / new, the score, mock-interview report."""

import re

import pytest

from mlsys_nb.widgets.base import Widget
from mlsys_nb.widgets.practice import PracticeWidget, clock_text


@pytest.fixture
def w():
    return PracticeWidget(topic="inference", seed=3)


def test_protocol_and_a_right_answer_scores(w):
    assert isinstance(w, Widget)
    q = w.question
    assert q.topic == "inference" and w.error is None
    assert w.answer(q.answer_text().split(" (")[0] if not q.is_choice else q.answer).ok
    assert "1/1" in w.stats.value
    assert w.table().loc["inference", "correct"] == 1


def test_wrong_answer_hint_reveal_and_new(w):
    q = w.question
    wrong = q.choices[1 - q.choices.index(q.answer)] if q.is_choice else q.answer * 3
    r = w.answer(wrong)
    assert not r.ok and "✗" in w.feedback.value
    assert w.hint() == q.hints[0] and "Hint 1" in w.feedback.value
    assert "Answer:" in w.reveal()
    assert w.answer(q.answer).ok  # a later right answer does not change the first verdict
    assert "0/1" in w.stats.value
    before = q.text
    w.new()
    assert w.question.text != before or w.question.family != q.family


def test_same_seed_same_question_and_settings_are_validated():
    a, b = PracticeWidget(topic="pipeline", seed=5), PracticeWidget(topic="pipeline", seed=5)
    assert a.question.text == b.question.text
    a.set_state({"seed": -1})
    assert a.error and "seed" in a.error
    a.set_state({"seed": 2, "topic": "memory", "difficulty": "3"})
    assert a.error is None and a.question.topic == "memory"
    with pytest.raises(ValueError, match="allowed"):
        a.set_state({"nope": 1})


def test_rule_shown_and_no_empty_axes_before_an_answer(w):
    assert "first" in w.rule.value and "Check" in w.rule.value  # the scoring rule is on the tab
    assert w.image.layout.display == "none" and "after your first answer" in w.placeholder.value
    w.answer("no such answer")  # unreadable: not an attempt (issue 53), so still no score to draw
    assert w.image.layout.display == "none" and not w.results
    q = w.question
    w.answer(q.choices[1 - q.choices.index(q.answer)] if q.is_choice else q.answer * 3)
    assert w.image.layout.display is None and w.placeholder.layout.display == "none"
    assert w.clock.value == "" and not w.ticker.playing  # no clock outside a mock interview


def test_clock_text():
    assert [clock_text(t) for t in (0, 59.9, 65.2, 600)] == ["0:00", "0:59", "1:05", "10:00"]


def test_mock_interview_clock_and_summary_by_topic(monkeypatch):
    t = [1000.0]  # the widget's clock, in seconds, moved by the test
    monkeypatch.setattr(PracticeWidget, "now", staticmethod(lambda: t[0]))
    w = PracticeWidget(mode="mock", mock_n=3, seed=1)
    assert w.ticker.playing and "question 1 of 3" in w.clock.value
    oks = []
    for i in range(3):
        q = w.question
        wrong = q.choices[1 - q.choices.index(q.answer)] if q.is_choice else q.answer * 3
        oks.append(i != 1)
        if i == 1:  # question 2 shown 58 s into the interview; 7 s later the page's ticker calls tick()
            t[0] += 7
            w.tick()
            assert "1:05" in w.clock.value and "0:07 on this question" in w.clock.value
        w.answer(q.answer if i != 1 else wrong)
        t[0] += 58 if i == 0 else 1
        w.new()
    assert "Mock interview over" in w.stats.value and "2/3" in w.stats.value
    assert w.table()["attempted"].iloc[:-1].sum() == 3
    assert not w.ticker.playing and "over" in w.clock.value  # the clock stops at the end
    summary = dict(re.findall(r"<tr><td>([^<]+)</td><td[^>]*>(\d+/\d+)</td>", w.summary.value))
    want = {}  # the per-topic score counted from the questions asked, independently of the widget
    for r, ok in zip(w.results, oks):
        a, c = want.get(r["topic"], (0, 0))
        want[r["topic"]] = (a + 1, c + ok)
    assert summary == {t: f"{c}/{a}" for t, (a, c) in want.items()}


@pytest.mark.parametrize("unreadable", ["banana", "12 ms", ""])
def test_an_unreadable_answer_does_not_use_up_the_first_attempt(unreadable):
    """ "banana" (or a time for a question in bytes) is refused with the reason and can be entered again:
    the answer after it is the first attempt the score counts."""
    w = PracticeWidget(topic="memory", seed=3)
    q = w.question
    assert not q.is_choice and q.unit == "bytes"
    r = w.answer(unreadable)
    assert not r.ok and r.value is None
    assert "Not counted" in w.feedback.value and "enter your answer again" in w.feedback.value
    assert w.results == [] and "0/0" in w.stats.value
    assert w.answer(q.answer_response()).ok
    assert "1/1" in w.stats.value and w.table().loc["memory", "correct"] == 1


def test_the_question_says_which_units_are_accepted():
    w = PracticeWidget(topic="memory", seed=3)  # a question in bytes
    assert w.question.unit == "bytes"
    assert "Answer in bytes" in w.question_html.value and "KiB, MiB, GiB" in w.question_html.value
