"""The Practice tab headless: answer / check / hint / reveal / new, the score, mock-interview report."""

import pytest

from mlsys_nb.widgets.base import Widget
from mlsys_nb.widgets.practice import PracticeWidget


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


def test_mock_interview_reports_by_topic():
    w = PracticeWidget(mode="mock", mock_n=3, seed=1)
    for _ in range(3):
        q = w.question
        w.answer(q.answer)
        w.new()
    assert "Mock interview over" in w.stats.value
    assert w.table()["attempted"].iloc[:-1].sum() == 3
    assert "3/3" in w.stats.value
