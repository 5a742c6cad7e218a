"""Pinned quiz questions: a digest of every family's question (text, answer, unit) for seeds 0-9.

A refactor must leave every question unchanged; a deliberate change to a family rewrites its digests:
``python tests/quiz_golden.py --write`` (then say in the commit message which families changed and why)."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

PINNED = Path(__file__).parent / "data" / "quiz_seeds.json"
SEEDS = range(10)


def digest(q) -> str:
    """16 hex digits of sha256 over the question's text, answer (repr) and unit."""
    return hashlib.sha256(f"{q.text}\x00{q.answer!r}\x00{q.unit}".encode()).hexdigest()[:16]


def pinned() -> dict[str, list[str]]:
    return json.loads(PINNED.read_text())


def write() -> None:
    from mlsys_nb import quiz

    table = {f: [digest(quiz.make(f, s)) for s in SEEDS] for f in quiz.families()}
    PINNED.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"{len(table)} families x {len(SEEDS)} seeds -> {PINNED}")


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python tests/quiz_golden.py --write")
    write()
