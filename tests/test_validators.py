"""The one validator (issue 29): range checks go through ``mlsys_nb.config``'s ``check_*`` helpers.

What the scan flags, precisely: in every ``mlsys_nb/**/*.py`` except ``config.py``, a
``raise ValueError(...)`` (or ``ArgumentError(...)``) whose message text (its string constants and
f-string parts joined) matches ``RANGE_WORDS``: the wordings of a hand-written range or choice check
("is out of range", ": allowed ...", "allowed an int", "must be >= / positive / in [ / one of /
at least / a power ...", "need x >= ...", "both must be"). Shape mismatches between two arguments,
state errors and type errors (``TypeError``) are not flagged. There is no allow-list.
"""

from __future__ import annotations

import ast
import math
import random
import re
from pathlib import Path

import pytest

from mlsys_nb import config
from mlsys_nb.config import (
    ArgumentError,
    check_choice,
    check_divides,
    check_int,
    check_multiple,
    check_number,
    check_power_of_two,
    check_probability,
)

PACKAGE = Path(config.__file__).resolve().parent
RANGE_WORDS = re.compile(
    r"is out of range"
    r"|: allowed\b"
    r"|\ballowed:? (an? |[\[(<>]|\d|>=|one of|ints? )"
    r"|must be (an? )?(positive|non-?negative|finite|int\b|integer|number|in\b|one of|at least|[<>]|a power|between)"
    r"|\bneeds? [\w.]+ ?[<>]=? ?\d"
    r"|both must be",
    re.IGNORECASE,
)
FLAGGED_ERRORS = {"ValueError", "ArgumentError"}


def _message(call: ast.Call) -> str:
    return "".join(n.value for n in ast.walk(call) if isinstance(n, ast.Constant) and isinstance(n.value, str))


def hand_written_checks(source: str, filename: str = "<string>") -> list[str]:
    """``file:line: message`` of each ``raise ValueError/ArgumentError(...)`` in ``source`` whose
    message reads like a range check (``RANGE_WORDS``)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
            func = node.exc.func
            name = getattr(func, "id", None) or getattr(func, "attr", None)
            text = _message(node.exc)
            if name in FLAGGED_ERRORS and RANGE_WORDS.search(text):
                found.append(f"{filename}:{node.lineno}: {text[:100]}")
    return found


def test_no_hand_written_range_check_outside_config():
    files = [p for p in sorted(PACKAGE.rglob("*.py")) if p.name != "config.py" or p.parent != PACKAGE]
    assert len(files) > 50  # the scan sees the package
    found = [hit for p in files for hit in hand_written_checks(p.read_text(), str(p.relative_to(PACKAGE.parent)))]
    assert not found, "use the mlsys_nb.config check_* helpers instead of:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "planted",
    [
        'def f(n):\n    if n < 1:\n        raise ValueError(f"n={n} is out of range: allowed >= 1")\n',
        'def f(p):\n    if not 0 <= p <= 1:\n        raise ValueError(f"p must be in [0, 1], got {p}")\n',
        'def f(m):\n    if m not in ("a", "b"):\n        raise ValueError(f"m={m!r}: allowed a, b")\n',
        'def f(k):\n    if k < 1:\n        raise ValueError("k must be a positive int")\n',
        'def f(a, b):\n    if a < 0 or b < 1:\n        raise ValueError(f"need a >= 0 and b >= 1, got {a}, {b}")\n',
        'def f(x):\n    if x & (x - 1):\n        raise ValueError(f"x must be a power of two, got {x}")\n',
    ],
)
def test_scan_flags_a_planted_hand_written_check(planted):
    assert hand_written_checks(planted), planted


def test_scan_passes_helpers_and_non_range_errors():
    ok = (
        "from mlsys_nb.config import check_int\n"
        "def f(n, a, b):\n"
        "    check_int('n', n, 1)\n"
        "    if a.shape != b.shape:\n"
        "        raise ValueError(f'a has shape {a.shape} but b has {b.shape}')\n"
        "    if n is None:\n"
        "        raise TypeError('n must be an int, got None')\n"
    )
    assert hand_written_checks(ok) == []


def _bad_message(call) -> str:
    with pytest.raises(ArgumentError) as info:
        call()
    assert isinstance(info.value, ValueError)  # callers' `except ValueError` still catches it
    return str(info.value)


def _name(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz_") for _ in range(rng.randint(1, 12))) + "x"


@pytest.mark.parametrize("seed", range(20))
def test_int_and_number_messages_name_parameter_range_and_value(seed):
    rng = random.Random(seed)
    name, lo = _name(rng), rng.randint(-5, 5)
    hi = lo + rng.randint(0, 10)
    for bad in (lo - rng.randint(1, 100), hi + rng.randint(1, 100), float(lo), True, "1", None):
        msg = _bad_message(lambda bad=bad: check_int(name, bad, lo, hi))
        assert msg.startswith(f"{name} must be an int in [{lo}, {hi}]") and msg.endswith(f"got {bad!r}"), msg
    assert check_int(name, hi, lo, hi) == hi and check_int(name, lo, lo) == lo
    x_lo = rng.uniform(-10, 10)
    x_hi = x_lo + rng.uniform(0.1, 10)
    lo_open, hi_open = rng.random() < 0.5, rng.random() < 0.5
    for bad in (x_lo - rng.uniform(0.01, 5), x_hi + rng.uniform(0.01, 5), math.nan, math.inf, "0.5", None):
        msg = _bad_message(lambda bad=bad: check_number(name, bad, x_lo, x_hi, lo_open=lo_open, hi_open=hi_open))
        assert msg.startswith(f"{name} must be a finite number {'>' if lo_open else '>='} {x_lo:g}"), msg
        assert f"{'<' if hi_open else '<='} {x_hi:g}" in msg and msg.endswith(f"got {bad!r}"), msg
    # the bounds themselves: in unless open
    for bound, is_open in ((x_lo, lo_open), (x_hi, hi_open)):
        if is_open:
            _bad_message(lambda bound=bound: check_number(name, bound, x_lo, x_hi, lo_open=lo_open, hi_open=hi_open))
        else:
            assert check_number(name, bound, x_lo, x_hi, lo_open=lo_open, hi_open=hi_open) == bound


@pytest.mark.parametrize("seed", range(20))
def test_probability_choice_multiple_divides_power_of_two(seed):
    rng = random.Random(seed)
    name = _name(rng)
    for bad in (-rng.random() - 1e-9, 1 + rng.random() + 1e-9, math.nan):
        msg = _bad_message(lambda bad=bad: check_probability(name, bad))
        assert msg.startswith(f"{name} must be a finite number >= 0 and <= 1") and msg.endswith(repr(bad)), msg
    assert "> 0 and < 1" in _bad_message(lambda: check_probability(name, 0.0, lo_open=True, hi_open=True))
    assert check_probability(name, p := rng.random()) == p

    choices = tuple(_name(rng) for _ in range(rng.randint(1, 5)))
    bad = _name(rng) + "!"
    msg = _bad_message(lambda: check_choice(name, bad, choices))
    assert f"{name}={bad!r}" in msg and f"{name} must be one of {choices}" in msg
    assert check_choice(name, choices[-1], choices) == choices[-1]

    of = rng.randint(2, 64)
    k = rng.randint(1, 50)
    assert check_multiple(name, k * of, of, "w") == k * of
    bad = k * of + rng.randint(1, of - 1)
    msg = _bad_message(lambda: check_multiple(name, bad, of, "w"))
    assert msg == f"{name} must be a multiple of w={of} (an int >= 1), got {bad!r}"
    assert ">= 1" in _bad_message(lambda: check_multiple(name, 0, of, "w"))

    d = rng.randint(2, 16)
    total = d * rng.randint(1, 20)
    assert check_divides(name, d, total, "heads") == d
    bad = next(v for v in range(d + 1, total + d + 2) if total % v)
    msg = _bad_message(lambda: check_divides(name, bad, total, "heads"))
    assert msg == f"{name} must be an int >= 1 that divides heads={total}, got {bad!r}"

    p = 2 ** rng.randint(0, 40)
    assert check_power_of_two(name, p) == p
    for bad in (p * 3, 0, -p, float(p), True):
        if bad == 1 and not isinstance(bad, bool):
            continue
        msg = _bad_message(lambda bad=bad: check_power_of_two(name, bad))
        assert msg == f"{name} must be a power of two (1, 2, 4, ...), got {bad!r}"
