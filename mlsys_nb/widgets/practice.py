"""Interview practice: a question from ``mlsys_nb.quiz``, an answer box, Check / Hint / Reveal / New,
a running score by topic, and a timed mock-interview mode (``mock_n`` questions with a running clock,
then a table by topic). The widget computes nothing itself: questions, keys and feedback come from
``mlsys_nb.quiz``.

Scoring rule (shown on the tab): only the first Check of each question counts; a Reveal before it
counts as wrong; later Checks give feedback but leave the score alone. A Check the checker cannot read
(no number, a unit of another quantity, not an option) is not an attempt: the feedback says why.

``PracticeWidget().widget`` is the ipywidgets container; ``state()``/``set_state()``, ``figure``
(correct / attempted per topic), ``table()`` and ``error`` follow the dashboard protocol
(``mlsys_nb.widgets.base``). Headless use: ``answer(text)``, ``hint()``, ``reveal()``, ``new()``.
"""

from __future__ import annotations

import html
import time

import pandas as pd

from .. import quiz
from ..quiz.units import accepted
from ..config import check_int

from ..plots import PALETTE, label, style
from .base import Panel

DEFAULTS = {"topic": "any", "difficulty": "any", "seed": 0, "mode": "practice", "mock_n": 5}
RULE = (
    "<small><b>Scoring:</b> only your <b>first</b> Check of each question counts (a Reveal before it counts "
    "as wrong); later Checks show feedback but do not change the score. An answer that cannot be read "
    "(no number, a unit of another quantity) is not counted: enter it again.</small>"
)
NO_ANSWER_YET = "<i>The score by topic appears here after your first answer.</i>"


def clock_text(seconds: float) -> str:
    """``seconds`` (elapsed, s) as m:ss, e.g. 65.2 -> '1:05'."""
    s = int(seconds)
    return f"{s // 60}:{s % 60:02d}"


class PracticeWidget(Panel):
    """Controls: topic, difficulty, seed (same seed, same questions), mode (practice / mock), mock_n.

    ``ticker``: the hidden ``Play`` widget whose once-a-second count (in the page) calls ``tick()``, which redraws
    the mock interview's clock; ``now``: the clock it reads, in seconds (``time.monotonic``; a test sets another).
    """

    now = staticmethod(time.monotonic)

    def __init__(self, **state):
        import ipywidgets as w
        from matplotlib.figure import Figure

        s = DEFAULTS | state
        lay = w.Layout(width="300px")
        self.controls = {
            "topic": w.Dropdown(options=["any", *quiz.topics()], value=s["topic"], description="topic", layout=lay),
            "difficulty": w.Dropdown(
                options=["any", "1", "2", "3"], value=str(s["difficulty"]), description="difficulty", layout=lay
            ),
            "seed": w.IntText(value=s["seed"], description="seed", layout=lay),
            "mode": w.Dropdown(
                options=["practice", "mock interview"],
                value="mock interview" if s["mode"] in ("mock", "mock interview") else "practice",
                description="mode",
                layout=lay,
            ),
            "mock_n": w.IntText(value=s["mock_n"], description="mock: questions", layout=lay),
        }
        for c in self.controls.values():
            c.style = {"description_width": "130px"}  # the longest label, "mock: questions", in full
        self.question_html = w.HTML()
        self.answer_box = w.Text(
            placeholder="e.g. 3.2 GB, 12 ms, 45%, or an option", description="answer", layout=w.Layout(width="420px")
        )
        self.buttons = {}
        for name in ("Check", "Hint", "Reveal", "New"):
            b = w.Button(description=name, layout=w.Layout(width="90px"))
            b.add_class(f"mlsys-practice-{name.lower()}")
            self.buttons[name] = b
        self.answer_box.add_class("mlsys-practice-answer")
        self.question_html.add_class("mlsys-practice-question")
        self.buttons["Check"].on_click(lambda _: self.answer(self.answer_box.value))
        self.buttons["Hint"].on_click(lambda _: self.hint())
        self.buttons["Reveal"].on_click(lambda _: self.reveal())
        self.buttons["New"].on_click(lambda _: self.new())
        self.feedback = w.HTML()
        self.feedback.add_class("mlsys-practice-feedback")
        self.message = w.HTML()
        self.stats = w.HTML()
        self.rule = w.HTML(RULE)
        self.rule.add_class("mlsys-practice-rule")
        self.placeholder = w.HTML(NO_ANSWER_YET)
        self.placeholder.add_class("mlsys-practice-placeholder")
        self.summary = w.HTML()  # the mock interview's table by topic, once it is over
        self.summary.add_class("mlsys-practice-summary")
        self.clock = w.HTML()  # the mock interview's running clock
        self.clock.add_class("mlsys-practice-clock")
        # the browser ticks the clock: a Play widget counts in the page (its timer runs in the
        # widget model, so it runs hidden) and each tick asks the kernel to redraw the clock
        self.ticker = w.Play(value=0, min=0, max=10**7, interval=1000, layout=w.Layout(display="none"))
        self.ticker.observe(lambda _: self.tick(), names="value")
        self._mock_start = None  # self.now() when the mock interview began; None outside one
        self._mock_end = None
        self.image = self._make_image()
        with style():
            self.figure = Figure(figsize=(6.5, 2.6), layout="constrained")
            self._ax = self.figure.subplots()
        self.results: list[dict] = []  # one per question attempted: topic, family, ok, hints, revealed, seconds
        self.question = None
        self._round = 0  # questions drawn since the settings last changed
        self._current = None
        self.error = None
        c = list(self.controls.values())
        self.widget = w.VBox(
            [
                w.HBox([w.VBox(c[:3]), w.VBox(c[3:])]),
                self.rule,
                self.message,
                self.clock,
                self.question_html,
                w.HBox([self.answer_box, *self.buttons.values()]),
                self.feedback,
                self.stats,
                self.summary,
                self.placeholder,
                self.image,
                self.ticker,
            ]
        )
        self._wire()
        self.update()

    # ---- the protocol ------------------------------------------------------------------------
    def _settings(self, s: dict) -> dict:
        check_int("seed", s["seed"], 0)
        check_int("mock_n (questions)", s["mock_n"], 1, 50)

        topic = None if s["topic"] == "any" else s["topic"]
        diff = None if s["difficulty"] == "any" else int(s["difficulty"])
        if (
            topic is not None
            and diff is not None
            and not [f for f in quiz.families(topic) if quiz.family_info(f).difficulty == diff]
        ):
            raise ValueError(f"no {topic} question at difficulty {diff}: choose another difficulty or 'any'")
        return {"topic": topic, "difficulty": diff}

    def update(self) -> None:
        """Settings changed: start over (score kept in practice mode, reset for a new mock interview)."""
        s = self.state()
        try:
            self._settings(s)
        except ValueError as e:
            self._show_error(str(e), "Invalid setting")
            self.question_html.value = ""
            return
        self.error = None
        self.message.value = ""
        if s["mode"] == "mock interview":
            self.results = []
            self._mock_start, self._mock_end = self.now(), None
        else:
            self._mock_start = self._mock_end = None
        self.ticker.playing = self._mock_start is not None
        self._round = 0
        self._draw_question()
        if self._mock_start is not None:  # the clock starts when the first question is shown
            self._mock_start = self._current["start"]
            self.tick()

    def _draw_question(self) -> None:
        s = self.state()
        k = self._settings(s)
        self.question = quiz.draw(topic=k["topic"], difficulty=k["difficulty"], seed=f"{s['seed']}:{self._round}")
        self._current = {
            "topic": self.question.topic,
            "family": self.question.family,
            "ok": False,
            "hints": 0,
            "revealed": False,
            "checked": False,
            "start": self.now(),
        }
        q = self.question
        opts = (
            "<br>Options: " + ", ".join(f"{'abcdefgh'[i]}) {html.escape(c)}" for i, c in enumerate(q.choices))
            if q.is_choice
            else f"<br><i>Answer in {html.escape(q.unit)}</i> <small>(accepted: {html.escape(accepted(q.unit))})"
            "</small>"
        )
        mock = (
            f"<b>Mock interview, question {self._round + 1} of {s['mock_n']}.</b> "
            if s["mode"] == "mock interview"
            else ""
        )
        self.question_html.value = (
            f"<p>{mock}<span style='color:#666'>[{q.topic} · {q.family}]</span><br>{html.escape(q.text)}{opts}</p>"
        )
        self.answer_box.value = ""
        self.feedback.value = ""
        self._refresh()

    @property
    def mock_over(self) -> bool:
        """True once a mock interview has asked and scored its ``mock_n`` questions."""
        return self._mock_end is not None

    def tick(self) -> None:
        """Redraw the mock interview's clock (time on this question and in total)."""
        if self._mock_start is None or self.question is None:
            self.clock.value = ""
            return
        now = self._mock_end if self._mock_end is not None else self.now()
        on_q = 0.0 if self.mock_over else now - self._current["start"]
        s = self.state()
        where = "over" if self.mock_over else f"question {self._round + 1} of {s['mock_n']}"
        self.clock.value = (
            f"<b>Time {clock_text(now - self._mock_start)}</b> in total · {clock_text(on_q)} on this question "
            f"<small>(mock interview, {where})</small>"
        )

    def _refresh(self) -> None:
        rows = []
        for t in sorted({r["topic"] for r in self.results}):
            rs = [r for r in self.results if r["topic"] == t]
            rows.append(
                {
                    "topic": t,
                    "attempted": len(rs),
                    "correct": sum(r["ok"] for r in rs),
                    "hints": sum(r["hints"] for r in rs),
                    "seconds": round(sum(r["seconds"] for r in rs), 1),
                }
            )
        df = pd.DataFrame(rows, columns=["topic", "attempted", "correct", "hints", "seconds"]).set_index("topic")
        q = self.question
        df.loc["(current question)"] = [0, 0, 0, 0]
        df = df.astype(float)
        df.attrs["question"] = f"{q.family} seed {q.seed}"
        self._table = df.rename(index={"(current question)": f"(now: {q.family}, seed {q.seed})"})
        done, correct = len(self.results), sum(r["ok"] for r in self.results)
        s = self.state()
        report = ""
        self.summary.value = ""
        if s["mode"] == "mock interview" and done >= s["mock_n"]:
            if self._mock_end is None:
                self._mock_end = self.now()
                self.ticker.playing = False
            report = "<br><b>Mock interview over.</b> By topic:"
            self.summary.value = self.summary_html(df.iloc[:-1])
        self.stats.value = f"Score: <b>{correct}/{done}</b> answered correctly (first attempts).{report}"
        self._draw(df.iloc[:-1])
        self._show()
        answered = len(self.results) > 0
        self.placeholder.layout.display = "none" if answered else None
        self.placeholder.value = "" if answered else NO_ANSWER_YET
        self.image.layout.display = "none" if not answered or self.error is not None else None
        self.tick()

    @staticmethod
    def summary_html(df) -> str:
        """The per-topic table shown when a mock interview ends: first-attempt score, hints, time (s)."""
        rows = "".join(
            f"<tr><td>{html.escape(str(t))}</td><td style='text-align:right'>{int(r['correct'])}/{int(r['attempted'])}"
            f"</td><td style='text-align:right'>{int(r['hints'])}</td>"
            f"<td style='text-align:right'>{clock_text(r['seconds'])}</td></tr>"
            for t, r in df.iterrows()
        )
        return (
            "<table class='mlsys-practice-summary-table'><tr><th>topic</th><th>correct (first attempt)</th>"
            f"<th>hints</th><th>time (m:ss)</th></tr>{rows}</table>"
        )

    def _draw(self, df) -> None:
        ax = self._ax
        ax.clear()
        with style():
            if len(df):
                y = range(len(df))
                ax.barh(list(y), df["attempted"], color="#dddddd", label="attempted")
                ax.barh(list(y), df["correct"], color=PALETTE[2], label="correct")
                ax.set_yticks(list(y), list(df.index), fontsize=8)
                ax.legend(fontsize=8, loc="lower right")
            label(ax, "questions (count)", "topic (name)")
            q = self.question
            ax.set_title(f"Score by topic (first attempts) · now: {q.family}", fontsize=9, loc="left")
            ax.xaxis.get_major_locator().set_params(integer=True)

    # ---- actions -----------------------------------------------------------------------------
    def _record(self) -> None:
        cur = self._current
        if cur is not None and not cur["checked"]:
            cur["checked"] = True
            cur["seconds"] = self.now() - cur["start"]
            self.results.append(cur)

    def answer(self, text: str):
        """Check ``text`` against the current question; the first check the checker can read is what the
        score counts (an unreadable answer, e.g. ``"banana"`` or a unit of another quantity, is refused with
        the reason and can be entered again)."""
        if self.error is not None or self.question is None:
            return None
        self.answer_box.value = str(text)
        r = self.question.check(text)
        if r.value is None:  # unreadable ("banana", "12 ms" for bytes, not an option): not an attempt
            self.feedback.value = (
                f"<b style='color:#D55E00'>?</b> {html.escape(r.feedback)}<br><i>Not counted as an attempt: "
                "enter your answer again.</i>"
            )
            return r
        if self._current is not None and not self._current["checked"]:
            self._current["ok"] = r.ok and not self._current["revealed"]
            self._record()
        colour = "#009E73" if r.ok else "#D55E00"
        self.feedback.value = f"<b style='color:{colour}'>{'✓' if r.ok else '✗'}</b> {html.escape(r.feedback)}"
        self._refresh()
        return r

    def hint(self) -> str | None:
        if self.question is None or self.error is not None:
            return None
        cur = self._current
        i = cur["hints"]
        text = self.question.hints[i] if i < len(self.question.hints) else "No more hints: Reveal shows the solution."
        cur["hints"] = min(i + 1, len(self.question.hints))
        self.feedback.value = f"<b>Hint {i + 1}:</b> {html.escape(text)}"
        return text

    def reveal(self) -> str | None:
        if self.question is None or self.error is not None:
            return None
        self._current["revealed"] = True
        self._record()
        text = self.question.solution_text()
        self.feedback.value = "<pre style='white-space:pre-wrap'>" + html.escape(text) + "</pre>"
        self._refresh()
        return text

    def new(self) -> None:
        """Next question (in a mock interview, until ``mock_n`` questions have been asked)."""
        if self.error is not None:
            return
        s = self.state()
        if s["mode"] == "mock interview" and self._round + 1 >= s["mock_n"]:
            self._record()
            self._refresh()
            return
        self._round += 1
        self._draw_question()
        for cb in self._listeners:
            cb()
