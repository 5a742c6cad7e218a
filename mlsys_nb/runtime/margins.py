"""Checks that say how close they came: ``check_margin`` asserts a measured value against its bound and prints
one ``margin:`` line, so a run on another seed or another CPU can be compared with this one.

A stochastic check (a reward that must rise, a loss that must stay in a band, a speed-up that must appear)
depends on the machine as well as on the seed: another SIMD width sums in another order, and a chaotic run such
as RL then takes another path. ``benchmarks/portability.py`` runs the notebooks whose checks depend on training,
sampling or timing at several seeds under each ``ATEN_CPU_CAPABILITY`` and reads these lines back into
``data/measured/portability.md``; the margin tells whether a check holds with room or by luck.

    >>> check_margin("PPO: rise of the true reward", 2.31, ">", 1.5)
    margin: PPO: rise of the true reward = 2.31 > 1.5 (margin +0.81)
    2.31

The printed line is ``margin: <label> = <value> <op> <bound> (margin <value - bound, signed so that + is room>)``;
``parse_margins`` reads it back. A failing check raises ``AssertionError`` with the same numbers and ``why``.
"""

from __future__ import annotations

import math
import operator
import re

from .notebook import record_check

__all__ = ["MARGIN_RE", "check_margin", "parse_margins"]

_OPS = {">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}
MARGIN_RE = re.compile(
    r"^margin: (?P<label>.+?) = (?P<value>\S+) (?P<op>>=|<=|>|<) (?P<bound>\S+) \(margin (?P<room>\S+)\)"
)


def check_margin(label: str, value: float, op: str, bound: float, why: str = "") -> float:
    """Assert ``value <op> bound`` (op one of ``>``, ``>=``, ``<``, ``<=``); print ``margin: label = value op bound
    (margin room)``, where room is ``value - bound`` for ``>``/``>=`` and ``bound - value`` for ``<``/``<=``
    (positive: the check holds with that much to spare, in the value's own units). Returns ``value``.

    ``label`` names the quantity (no `` = `` in it); ``why`` is added to the assertion's message. A NaN value fails."""
    if op not in _OPS:
        raise ValueError(f"op={op!r}: one of {sorted(_OPS)}")
    if " = " in label or "\n" in label:
        raise ValueError(f"label={label!r}: must not contain ' = ' or a newline (the margin line is parsed)")
    value, bound = float(value), float(bound)
    room = value - bound if op in (">", ">=") else bound - value
    line = f"margin: {label} = {value:.4g} {op} {bound:.4g} (margin {room:+.3g})"
    print(line)
    record_check("margin", label, value=value, op=op, bound=bound, room=room)
    if math.isnan(value) or not _OPS[op](value, bound):
        raise AssertionError(f"{label}: {value:.4g} is not {op} {bound:.4g}" + (f": {why}" if why else ""))
    return value


def parse_margins(text: str) -> list[dict]:
    """The ``margin:`` lines in printed text -> ``[{"label", "value", "op", "bound", "room"}]`` in order."""
    out = []
    for line in text.splitlines():
        m = MARGIN_RE.match(line.strip())
        if m:
            d = m.groupdict()
            out.append(
                {
                    "label": d["label"],
                    "value": float(d["value"]),
                    "op": d["op"],
                    "bound": float(d["bound"]),
                    "room": float(d["room"]),
                }
            )
    return out
