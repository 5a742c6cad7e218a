"""Printable HTML worksheets: one sheet per topic (questions, blank answer lines) and a separate
answer key with the worked solutions (``make worksheets SEED=...`` writes them to ``worksheets/``)."""

from __future__ import annotations

import html
from pathlib import Path

from . import core

_CSS = (
    "body{font-family:sans-serif;max-width:48em;margin:2em auto;line-height:1.4}"
    "li{margin-bottom:1.4em}.ans{border-bottom:1px solid #999;height:1.6em;margin-top:.4em}"
    ".meta{color:#666;font-size:.85em}@media print{a{color:black}}"
)


def _page(title: str, body: str) -> str:
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{_CSS}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def render(topic: str, questions, seed, answers: bool) -> str:
    title, nb = core.TOPICS[topic]
    items = []
    for q in questions:
        head = f"<p>{html.escape(q.text)}</p>"
        if q.is_choice:
            head += "<p>Options: " + ", ".join(html.escape(c) for c in q.choices) + "</p>"
        else:
            head += f"<p class='meta'>Answer in {html.escape(q.unit)}.</p>"
        if answers:
            steps = "".join(f"<li>{html.escape(s)}</li>" for s in q.solution)
            head += (
                f"<ol>{steps}</ol><p><b>Answer: {html.escape(q.answer_text())}</b></p>"
                f"<p class='meta'>{html.escape(q.family)} · see {html.escape(q.section)}; "
                f"{html.escape(q.reference)}</p>"
            )
        else:
            head += "<div class='ans'></div>"
        items.append(f"<li>{head}</li>")
    kind = "answer key" if answers else "worksheet"
    body = f"<p class='meta'>Seed {html.escape(str(seed))} · taught in {html.escape(nb)}</p><ol>{''.join(items)}</ol>"
    return _page(f"{title}: {kind}", body)


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
