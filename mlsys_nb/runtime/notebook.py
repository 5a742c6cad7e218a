"""What a notebook's first cell and its checks call: one parameter check, and checks a run records.

``check_parameters(globals(), world_size=range(2, 9), block_size=(1, 2, 4, 8, 16, 32))`` checks the notebook's
parameters (read by name from the namespace given) against what each may be, before any work starts, and
raises ``ArgumentError`` naming the first bad one, what it may be and what it was:

    >>> check_parameters({"world_size": 9}, world_size=range(2, 9))
    Traceback (most recent call last):
    ...
    mlsys_nb.config.ArgumentError: world_size must be an int in 2..8, got 9

What a parameter may be: a ``range`` (an int in it), a tuple / list / set (one of those values; a ``range`` among
them admits its ints, so ``(None, range(1, 1001))`` is "None or an int in 1..1000"), or a function
``f(name, value)`` that raises (``config.check_number`` and friends, e.g.
``lambda n, v: check_number(n, v, 0, 1)``). When the parameters include ``world_size`` the notebook runs ranks,
so the rank factory (a forkserver that imports torch once) starts now, in the background
(``runtime.ranks.prestart``), and the first ``launch`` does not wait for it.

``passed(label)`` prints ``check passed: <label>`` after a check's assertions and records it;
``check_margin`` (``runtime/margins.py``) records its margin the same way. The record is a list in this process
(``RECORD``) and, when the environment variable ``MLSYS_NB_CHECK_LOG`` names a file, one JSON line per check
appended there: ``tests/nbrun.run_notebook`` sets it, so a notebook test asserts on the checks a run recorded
(``tests.nbrun.recorded_checks``) instead of searching printed text.
"""

from __future__ import annotations

import json
import os
from ..config import ArgumentError

__all__ = ["CHECK_LOG_ENV", "RECORD", "check_parameters", "passed", "read_check_log", "record_check"]

CHECK_LOG_ENV = "MLSYS_NB_CHECK_LOG"
RECORD: list[dict] = []  # every check recorded in this process, in order


def record_check(kind: str, label: str, **fields) -> dict:
    """Record one check (``kind``: "passed" or "margin"); append it to ``$MLSYS_NB_CHECK_LOG`` when that is set."""
    entry = {"kind": kind, "label": label, **fields}
    RECORD.append(entry)
    path = os.environ.get(CHECK_LOG_ENV)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")
    return entry


def passed(label: str) -> None:
    """Print ``check passed: <label>`` and record it: call it after a check's assertions hold."""
    if not isinstance(label, str) or not label or "\n" in label:
        raise ArgumentError(f"label must be a non-empty one-line str, got {label!r}")
    print(f"check passed: {label}")
    record_check("passed", label)


def read_check_log(path) -> list[dict]:
    """The checks recorded in a ``MLSYS_NB_CHECK_LOG`` file, in order (``[]`` if there is none)."""
    try:
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    except FileNotFoundError:
        return []


def _describe(allowed) -> str:
    if isinstance(allowed, range):
        if allowed.step != 1:
            return f"one of {tuple(allowed)}"
        return f"an int in {allowed.start}..{allowed.stop - 1}"
    parts = [_describe(a) if isinstance(a, range) else repr(a) for a in allowed]
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " or " + parts[-1]


def _admits(allowed, value) -> bool:
    if isinstance(allowed, range):
        return type(value) is int and value in allowed  # not a bool, not a float that equals an int
    return any(_admits(a, value) if isinstance(a, range) else (type(value) is type(a) and value == a) for a in allowed)


def check_parameters(namespace: dict, **allowed) -> None:
    """Check each named parameter of ``namespace`` (a notebook's ``globals()``) against what it may be (see the
    module docstring); raise ``ArgumentError`` naming the first bad one. Starts the rank factory when
    ``world_size`` is among them."""
    if not isinstance(namespace, dict):
        raise ArgumentError(f"namespace must be a dict such as globals(), got {type(namespace).__name__}")
    for name, rule in allowed.items():
        if name not in namespace:
            raise ArgumentError(f"{name} is not defined: set it in the parameters cell")
        value = namespace[name]
        if callable(rule):
            rule(name, value)
        elif not isinstance(rule, (range, tuple, list, set, frozenset)):
            raise ArgumentError(f"the rule for {name} must be a range, a collection or a function, got {rule!r}")
        elif not _admits(rule, value):
            raise ArgumentError(f"{name} must be {_describe(rule)}, got {value!r}")
    if "world_size" in allowed:
        from .ranks import prestart

        prestart()
