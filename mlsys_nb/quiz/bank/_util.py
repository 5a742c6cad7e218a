"""Small helpers shared by the family modules: a seeded picker, formatting for question text, and
``ratio_family`` (a family whose answer is one calculator under two settings)."""

from __future__ import annotations

import sys

from ..core import family

GB = 1e9
MB = 1e6


class LazyModule:
    """The module ``name`` imported on first attribute access: ``mlsys_nb.inference`` imports torch (about 2 s of
    start-up), which the quiz CLI and most families never need."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


def pick(rng, seq):
    """One element of ``seq`` drawn by ``rng`` (a ``random.Random``)."""
    return seq[rng.randrange(len(seq))]


def gb(x: float) -> str:
    """Bytes written in GB (1e9 B)."""
    return f"{x / GB:.4g} GB"


def us(x: float) -> str:
    """Seconds written in microseconds."""
    return f"{x * 1e6:.3g} us"


def gbps(x: float) -> str:
    """Bytes/s written in GB/s."""
    return f"{x / GB:.4g} GB/s"


def _setting(s, p) -> dict:
    return s(p) if callable(s) else s


def ratio_family(
    name: str,
    topic: str,
    *,
    draw,
    calc,
    over,
    under,
    text,
    hints: list[str],
    solution,
    diagnostics=(),
    unit: str = "ratio",
    **registration,
):
    """Declare family ``name`` whose answer is ONE calculator under two settings:
    ``calc(p, **over) / calc(p, **under)``.

    ``draw(rng) -> p`` draws the question's params; ``over`` and ``under`` are keyword dicts for
    ``calc``, or functions of ``p`` returning one; ``text(p)`` words the question and
    ``solution(p, num, den, ratio)`` its steps; ``diagnostics`` is a list of (factor, hint) or
    ``fn(p, num, den, ratio)`` returning one; ``registration`` goes to ``core.family`` (difficulty,
    section, reference, kind). The family's function names the caller's module as its own (as
    ``collections.namedtuple`` does), so a family belongs to the topic module that declares it."""

    def make(rng):
        p = draw(rng)
        num = calc(p, **_setting(over, p))
        den = calc(p, **_setting(under, p))
        r = num / den
        return dict(
            text=text(p),
            params=p,
            answer=r,
            unit=unit,
            hints=list(hints),
            solution=solution(p, num, den, r),
            diagnostics=list(diagnostics(p, num, den, r) if callable(diagnostics) else diagnostics),
        )

    make.__module__ = sys._getframe(1).f_globals["__name__"]
    make.__qualname__ = make.__name__ = f"ratio_family({name!r})"
    return family(name, topic, **registration)(make)


__all__ = ["GB", "MB", "pick", "gb", "us", "gbps", "ratio_family"]
