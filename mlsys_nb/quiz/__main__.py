"""``python -m mlsys_nb.quiz --topic pipeline -n 10``: practice in a terminal.

Interactive by default (type an answer, ``h`` for a hint, ``s`` to reveal, empty to skip).
Non-interactive: ``--show-solutions`` prints every question with its worked solution;
``--answers-file FILE`` checks one answer per line and prints a score.
``--html DIR`` writes printable worksheets and a separate answer key (what ``make worksheets`` runs).
"""

from __future__ import annotations

import argparse
import sys

from ..config import ArgumentError, check_int
from . import core, units


def _header(topic: str, questions) -> str:
    """A topic's header line: its title, the number of questions, the time suggested (``html.MINUTES``), the
    notebook that teaches it, and a note when the topic has fewer families than questions."""
    from .html import MINUTES

    title, nb = core.TOPICS[topic]
    n_fam = len(core.families(topic))
    minutes = sum(MINUTES[q.difficulty] for q in questions)
    again = f"; {n_fam} families, so some are asked again with other numbers" if len(questions) > n_fam else ""
    return f"== {title} ({topic}): {len(questions)} questions, about {minutes} minutes{again}; taught in {nb}"


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mlsys_nb.quiz", description=__doc__.splitlines()[0])
    ap.add_argument(
        "--topic", action="append", choices=list(core.TOPICS), help="topic (repeatable; default all topics)"
    )
    ap.add_argument("-n", type=int, default=5, help="questions per topic")
    ap.add_argument("--seed", default="0", help="same seed, same questions")
    ap.add_argument("--show-solutions", action="store_true", help="print the solutions (no prompt)")
    ap.add_argument("--answers-file", help="one answer per line, checked in order (no prompt)")
    ap.add_argument("--html", metavar="DIR", help="write printable HTML worksheets + answer keys to DIR")
    ap.add_argument("--list", action="store_true", help="list the families and exit")
    a = ap.parse_args(argv)
    try:
        check_int("-n", a.n, 1)
    except ArgumentError as e:
        ap.error(str(e))
    if a.list:
        for name in core.families():
            print(f"{core.family_info(name).topic:15s} {name}")
        return 0
    if a.html:
        from .html import write_worksheets

        for p in write_worksheets(a.html, seed=a.seed, n=a.n, topics=a.topic):
            print(p)
        return 0
    ws = core.worksheet(a.topic, a.n, seed=a.seed)
    answers = None
    if a.answers_file:
        with open(a.answers_file) as fh:
            answers = [line.strip() for line in fh]
    score = 0
    heads, i = {}, 1  # the index of each topic's first question -> the topic's header
    for topic, qs in ws.questions.items():
        heads[i] = _header(topic, qs)
        i += len(qs)
    for i, q in enumerate(ws, 1):
        if i in heads:
            print(f"\n{heads[i]}")
        print(f"\n[{i}] ({q.topic}, {q.family}) {q.text}")
        if q.is_choice:
            print("    options: " + ", ".join(f"{'abcdefgh'[j]}) {c}" for j, c in enumerate(q.choices)))
        else:
            print(f"    answer in {q.unit} (accepted: {units.accepted(q.unit)})")
        if a.show_solutions:
            print("    " + q.solution_text().replace("\n", "\n    "))
            continue
        if answers is not None:
            resp = answers[i - 1] if i - 1 < len(answers) else ""
            r = q.check(resp) if resp else None
            print(f"    your answer: {resp or '(none)'} -> {r.feedback if r else 'not attempted'}")
            score += bool(r and r.ok)
            continue
        hints = iter(q.hints)
        while True:
            try:
                resp = input("    > ").strip()
            except EOFError:
                resp = ""
            if resp == "h":
                print("    hint: " + next(hints, "no more hints; 's' reveals the solution"))
                continue
            if resp in ("", "s"):
                print("    " + q.solution_text().replace("\n", "\n    "))
                break
            r = q.check(resp)
            print("    " + r.feedback)
            if r.ok:
                score += 1
                break
    if not a.show_solutions:
        print(f"\nscore {score}/{len(ws)}")
    return 0


if __name__ == "__main__":
    sys.exit(_main())
