"""Printable HTML worksheets: one sheet per topic (a header with the topic, the time suggested and the
units accepted; each question with room to work) and a separate answer key whose worked solutions show
the arithmetic (``make worksheets SEED=...`` writes them to ``worksheets/``)."""

from __future__ import annotations

import html
import re
from pathlib import Path

from . import core, units

_CSS = (
    "body{font-family:sans-serif;max-width:48em;margin:2em auto;line-height:1.4}"
    "li{margin-bottom:1.4em}.ans{border-bottom:1px solid #999;height:1.6em;margin-top:.4em}"
    ".work{border:1px dashed #bbb;height:9em;margin-top:.4em}.work::before{content:'working';color:#bbb;"
    "font-size:.75em;padding:.2em}.meta{color:#666;font-size:.85em}.head{border:1px solid #ccc;padding:.4em .8em}"
    ".head td{padding:.1em .6em .1em 0;vertical-align:top}@media print{a{color:black}li{break-inside:avoid}}"
)
MINUTES = {1: 3, 2: 5, 3: 8}  # minutes suggested per question, by difficulty (1 easy, 2 medium, 3 hard)
# a calculator named in a worked step, "(memory.model_state_bytes)" or "(planner.evaluate(...).mfu)":
# the printed key keeps the arithmetic and lists these once, below the step
_CALL = re.compile(r"\s*\((?:see )?([a-z_][a-z_0-9]+(?:\.[a-z_][a-z_0-9]*)+)(?:\([^()]*\))?[^()]*\)")


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def worked_steps(q: core.Question) -> tuple[list[str], list[str]]:
    """``q``'s solution steps with the calculators they cite taken out (the arithmetic stays), and the
    names of those calculators (in order, once each)."""
    names: list[str] = []
    steps = []
    for step in q.solution:
        names += [m.group(1) for m in _CALL.finditer(step) if m.group(1) not in names]
        steps.append(_CALL.sub("", step))
    return steps, names


def key_text(q: core.Question) -> str:
    """The key as the printed answer line shows it: ``answer_text()``, without the unit name for a plain
    count or ratio (``"16"``, not ``"16 count"``)."""
    if q.is_choice or q.unit not in ("count", "ratio"):
        return q.answer_text()
    return f"{float(q.answer):.4g}"


def header(topic: str, questions, seed) -> str:
    """The sheet's header: topic, notebook, seed, time suggested, units accepted, and a note when the
    topic has fewer question families than questions on the sheet."""
    title, nb = core.TOPICS[topic]
    minutes = sum(MINUTES[q.difficulty] for q in questions)
    unit_rows = "".join(
        f"<tr><td>{html.escape(u)}</td><td>{html.escape(units.accepted(u))}</td></tr>"
        for u in dict.fromkeys(q.unit for q in questions if not q.is_choice)
    )
    if any(q.is_choice for q in questions):
        unit_rows += "<tr><td>options</td><td>the option's text or its letter (a, b, ...)</td></tr>"
    n_fam = len(core.families(topic))
    repeats = (
        f"<p class='meta'>This topic has {n_fam} question families: questions {n_fam + 1}-{len(questions)} ask "
        "the same families again with other numbers.</p>"
        if len(questions) > n_fam
        else ""
    )
    return (
        f"<div class='head'><table><tr><td><b>Topic</b></td><td>{html.escape(title)} ({html.escape(topic)}), "
        f"taught in {html.escape(nb)}</td></tr>"
        f"<tr><td><b>Questions</b></td><td>{len(questions)} (seed {html.escape(str(seed))})</td></tr>"
        f"<tr><td><b>Time suggested</b></td><td>{minutes} minutes (3 per easy, 5 per medium, 8 per hard question)"
        "</td></tr>"
        f"<tr><td><b>Units accepted</b></td><td><table>{unit_rows}</table>An answer without a unit is read in the "
        "question's unit; a unit of another quantity (ms for bytes) is refused, never converted.</td></tr>"
        f"</table>{repeats}</div>"
    )


def render(topic: str, questions, seed, answers: bool) -> str:
    title, _ = core.TOPICS[topic]
    items = []
    for q in questions:
        level = {1: "easy", 2: "medium", 3: "hard"}[q.difficulty]
        head = f"<p>{html.escape(q.text)} <span class='meta'>({level})</span></p>"
        if q.is_choice:
            head += "<p>Options: " + ", ".join(f"{'abcdefgh'[i]}) {html.escape(c)}" for i, c in enumerate(q.choices))
            head += "</p>"
        else:
            head += f"<p class='meta'>Answer in {html.escape(q.unit)}.</p>"
        if answers:
            steps, names = worked_steps(q)
            tools = f"computed in mlsys_nb by {', '.join(names)}; " if names else ""
            head += (
                f"<ol>{''.join(f'<li>{html.escape(s)}</li>' for s in steps)}</ol>"
                f"<p><b>Answer: {html.escape(key_text(q))}</b></p><p class='meta'>{html.escape(q.family)} · "
                f"{html.escape(tools)}see {html.escape(q.section)}; {html.escape(q.reference)}</p>"
            )
        else:
            head += "<div class='work'></div><div class='ans'></div>"
        items.append(f"<li>{head}</li>")
    kind = "answer key" if answers else "worksheet"
    return _page(f"{title}: {kind}", header(topic, questions, seed) + f"<ol>{''.join(items)}</ol>")


def write_worksheets(directory, seed=0, n: int = 8, topics=None) -> list[Path]:
    """Write ``<topic>.html`` and ``<topic>_answers.html`` per topic and an ``index.html``."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    ws = core.worksheet(topics, n, seed=seed)
    paths, links = [], []
    for topic, qs in ws.questions.items():
        for answers, suffix in ((False, ""), (True, "_answers")):
            p = out / f"{topic}{suffix}.html"
            p.write_text(render(topic, qs, seed, answers), encoding="utf-8")
            paths.append(p)
        links.append(
            f"<li><a href='{topic}.html'>{html.escape(core.TOPICS[topic][0])}</a> "
            f"(<a href='{topic}_answers.html'>answer key</a>)</li>"
        )
    index = out / "index.html"
    index.write_text(
        _page(f"mlsys_nb interview worksheets (seed {seed})", f"<ul>{''.join(links)}</ul>"), encoding="utf-8"
    )
    return [*paths, index]
