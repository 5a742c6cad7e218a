"""Pinned quiz questions: what a learner sees of each family's question for seeds 0-9.

Each pin is ``[digest, key]``. The digest hashes the question text, the options of a choice question
(and its answer), the unit and the tolerance. A numeric answer key is never hashed as a raw float: it is
pinned as the learner sees it, written to ``key_digits(tolerance)`` significant digits (the precision
the checker resolves: its rounding step is at most a tenth of the tolerance), and a key matches its pin
when it lies within half a rounding step (plus ``EDGE``, relative) of it. Why not hash the rounded key:
numpy's and PyTorch's vector kernels (``ATEN_CPU_CAPABILITY`` = ``default`` / ``avx2`` / ``avx512``,
another CPU, another BLAS) round the last bits differently (``scaling.inference_optimal``'s ternary
search turns that into 1e-8 relative; ``rl.dpo_loss``'s float32 ``logsigmoid`` moves by one ulp), and
any rounding has edges where such noise flips the rounded digits: 30 of the pinned keys are exact
decimals or binary fractions sitting on a 4-digit edge (0.21875, 4122.5). A comparison has no edges.
Both sides are checked for every pinned key in ``tests/test_quiz.py``: moved by its slack (``EDGE``,
1e-6 relative, or a hundredth of the tolerance if less) it still matches; moved by a tenth of its
tolerance (far less than any slip the checker must reject) it does not.

A refactor must leave every question unchanged; a deliberate change to a family rewrites its pins:
``python tests/quiz_golden.py --write FAMILY ...`` (only those; ``--write`` alone re-pins all), then say in
the commit message which families changed and why."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

PINNED = Path(__file__).parent / "data" / "quiz_seeds.json"
SEEDS = range(10)
EDGE = 1e-6  # relative slack: last-bit noise across CPUs is ~1e-8 (float64 keys), <= 1.2e-7 (a float32 ulp)


def key_digits(tolerance: float) -> int | None:
    """Significant digits of a key checked to ``tolerance`` (relative): the fewest whose rounding
    step, at most 10^(1-d) of the value, is at most a tenth of the tolerance (2 % -> 4 digits,
    0.5 % -> 5, 1e-6 -> 8). None for an exact key (tolerance 0: a count)."""
    if tolerance <= 0:
        return None
    return max(1, math.ceil(2 - math.log10(tolerance) - 1e-9))


def shown_key(q) -> str:
    """The answer key at the precision the checker accepts: a choice as its text, an exact key
    (tolerance 0) as the integer it must be, any other to ``key_digits(q.tolerance)`` digits."""
    if q.is_choice:
        return str(q.answer)
    a = float(q.answer)
    digits = key_digits(q.tolerance)
    if digits is None:
        if not a.is_integer():
            raise ValueError(f"{q.family}: an exact key (tolerance 0) must be an integer, got {a!r}")
        return str(int(a))
    return f"{a:.{digits}g}"


def digest(q) -> str:
    """16 hex digits of sha256 over the text, options, unit and tolerance (and a choice's answer):
    everything of the question but a numeric key, which ``pin`` keeps as ``shown_key``."""
    choices = "\x01".join(q.choices or ())
    answer = q.answer if q.is_choice else ""
    seen = f"{q.text}\x00{choices}\x00{answer}\x00{q.unit}\x00{q.tolerance!r}"
    return hashlib.sha256(seen.encode()).hexdigest()[:16]


def pin(q) -> list:
    """``[digest(q), shown_key(q)]``; the key is None for a choice question (its answer is in the digest)."""
    return [digest(q), None if q.is_choice else shown_key(q)]


def mismatch(q, pinned_pin) -> str | None:
    """Why ``q`` does not match its pin (None when it does): the digest differs, or the key lies
    more than half a rounding step of ``key_digits(q.tolerance)`` digits from the pinned key, plus a slack
    of ``EDGE`` or a hundredth of the tolerance if less (so all of it stays below a tenth of the tolerance)."""
    want_digest, want_key = pinned_pin
    if digest(q) != want_digest:
        return f"text, options, unit or tolerance changed: {q.text!r}"
    if q.is_choice:
        return None
    a = float(q.answer)
    digits = key_digits(q.tolerance)
    if digits is None:
        return None if shown_key(q) == want_key else f"exact key {shown_key(q)} != pinned {want_key}"
    p = float(want_key)
    half_step = 0.5 * 10.0 ** (math.floor(math.log10(abs(p))) - digits + 1)
    if abs(a - p) <= half_step + min(EDGE, q.tolerance / 100) * abs(a):
        return None
    return f"key {a!r} is not {want_key} to {digits} significant digits (tolerance {q.tolerance})"


def pinned() -> dict[str, list[list]]:
    return json.loads(PINNED.read_text())


def write(names=None) -> None:
    """Pin every family (``names`` None) or only ``names``, keeping the other families' pins as they are."""
    from mlsys_nb import quiz

    table = {} if names is None else pinned()
    for f in quiz.families() if names is None else names:
        quiz.family_info(f)  # a name that is not a family fails here, naming the families
        table[f] = [pin(quiz.make(f, s)) for s in SEEDS]
    table = dict(sorted(table.items()))
    rows = (
        f" {json.dumps(f)}: [\n" + ",\n".join(f"  {json.dumps(p)}" for p in pins) + "\n ]" for f, pins in table.items()
    )
    PINNED.write_text("{\n" + ",\n".join(rows) + "\n}\n")  # one pin a line
    assert pinned() == table
    print(f"{len(names or table)} families x {len(SEEDS)} seeds pinned -> {PINNED}")


if __name__ == "__main__":
    if sys.argv[1:2] != ["--write"]:
        sys.exit("usage: python tests/quiz_golden.py --write [FAMILY ...]  (no family: all of them)")
    write(sys.argv[2:] or None)
