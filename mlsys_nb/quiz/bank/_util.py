"""Small helpers shared by the family modules: a seeded picker, formatting for question text, and the two
declarations a family module uses instead of writing a family function: ``numeric_family`` (the answer is one
calculator call with drawn inputs) and ``ratio_family`` (one calculator under two settings)."""

from __future__ import annotations

import sys

from ...memory import GB
from ..core import family

MB = 1e6


class LazyModule:
    """The module ``name`` imported on first attribute access: ``mlsys_nb.inference`` imports torch (about 2 s of
    start-up), which the quiz CLI and most families never need."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr):
        import importlib

        return getattr(importlib.import_module(self._name), attr)


# The kit's modules a family imports on first use (one handle each; torch only when a family needs it)
inference = LazyModule("mlsys_nb.inference")
paged = LazyModule("mlsys_nb.inference.paged")
speculative = LazyModule("mlsys_nb.inference.speculative")
inference_metrics = LazyModule("mlsys_nb.inference.metrics")
tensor_parallel = LazyModule("mlsys_nb.parallel.tensor")
zero = LazyModule("mlsys_nb.parallel.zero")
expert_parallel = LazyModule("mlsys_nb.parallel.expert")
context_parallel = LazyModule("mlsys_nb.parallel.context")
rl_sizing = LazyModule("mlsys_nb.rl.sizing")
rl_ppo = LazyModule("mlsys_nb.rl.ppo")
rlhf = LazyModule("mlsys_nb.rl.rlhf")
placement = LazyModule("mlsys_nb.rl.placement")
quant = LazyModule("mlsys_nb.quant")
kernels = LazyModule("mlsys_nb.kernels")
hierarchy = LazyModule("mlsys_nb.kernels.hierarchy")
fusion = LazyModule("mlsys_nb.kernels.fusion")


def pick(rng, seq):
    """One element of ``seq`` drawn by ``rng`` (a ``random.Random``)."""
    return seq[rng.randrange(len(seq))]


def picks(rng, **choices) -> dict:
    """A question's params, each keyword drawn by ``rng`` from its list (or tuple) of choices in the order
    given; any other value is taken as it is: ``picks(rng, n=[2, 4, 8], alpha=5e-6)``."""
    return {k: pick(rng, v) if isinstance(v, list | tuple) else v for k, v in choices.items()}


def gb(x: float) -> str:
    """Bytes written in GB (1e9 B)."""
    return f"{x / GB:.4g} GB"


def us(x: float) -> str:
    """Seconds written in microseconds."""
    return f"{x * 1e6:.3g} us"


def gbps(x: float) -> str:
    """Bytes/s written in GB/s."""
    return f"{x / GB:.4g} GB/s"


def gb_over_under(p, over, under, ratio) -> dict:
    """``fields`` of a ratio family of two byte counts: both written in GB, as ``over_gb`` and ``under_gb``."""
    return {"over_gb": gb(over), "under_gb": gb(under)}


def _setting(s, p) -> dict:
    return s(p) if callable(s) else s


def _declare(name, topic: str | None, make, registration: dict, builder: str):
    """Register ``make`` under ``name``: the family's registration ``family("topic.x", difficulty=...,
    section=..., reference=...)`` (the bank's form, as on a ``@family`` function), or its name as a string
    (then ``topic`` and ``registration`` go to ``core.family``). The module that called the builder is
    named as ``make``'s own (as ``collections.namedtuple`` does), so a family belongs to the topic module
    that declares it and takes that module's name as its topic."""
    if isinstance(name, str):
        name = family(name, topic, **registration)
    elif topic is not None or registration:
        raise TypeError(f"{builder}: give the options of {name.name!r} inside its family(...) registration")
    make.__module__ = sys._getframe(2).f_globals["__name__"]
    make.__qualname__ = make.__name__ = f"{builder}({name.name!r})"
    return name(make)


def _worded(words, *args, names: dict):
    """``words`` (a template, a list of templates, or a function of ``args``) filled in from ``names``."""
    if callable(words):
        return words(*args)
    if isinstance(words, str):
        return words.format(**names)
    return [w.format(**names) for w in words]


def numeric_family(
    name,
    topic: str | None = None,
    *,
    draw,
    calc,
    unit,
    text,
    hints,
    solution,
    fields=None,
    key=None,
    diagnostics=(),
    tolerance: float | None = None,
    params: tuple[str, ...] | None = None,
    **registration,
):
    """Declare family ``name`` whose answer is ONE calculator call with drawn inputs: ``calc(p)``.

    ``draw(rng) -> p`` draws the question's params (what the second route reads); ``calc(p)`` calls the
    calculator that owns the formula; ``key(result)`` picks the answer out of its result when that is a
    record (``lambda est: est.days``; default: the result itself). The words are templates
    (``str.format``) filled in from the params, ``result`` and ``fields(p, result)`` (a dict of derived
    values the words show): ``text`` the question, ``hints`` and ``solution`` lists of lines; each may
    instead be a function (``text(p)``, ``hints(p)``, ``solution(p, result)``). ``unit`` is a value or a
    function of ``p``; ``diagnostics`` a list of (factor, hint) or ``fn(p, result)`` returning one;
    ``tolerance`` is relative (None: the default 2 %); ``params`` names the keys of ``p`` the question
    keeps (None: all of them; a draw may hold an input the question does not show).

    ``name`` is the family's registration, ``family("topic.x", difficulty=..., section=..., reference=...)``
    (``core.family``, as on a function family); its topic is the name of the bank module that declares it.
    A plain name also works: then ``topic`` and ``registration`` (difficulty, section, reference) go to
    ``core.family``."""

    def make(rng):
        p = draw(rng)
        v = calc(p)
        names = {**p, **(fields(p, v) if fields else {}), "result": v}
        d = dict(
            text=_worded(text, p, names=names),
            params=p if params is None else {k: p[k] for k in params},
            answer=v if key is None else key(v),
            unit=unit(p) if callable(unit) else unit,
            hints=list(_worded(hints, p, names=names)),
            solution=list(_worded(solution, p, v, names=names)),
            diagnostics=list(diagnostics(p, v) if callable(diagnostics) else diagnostics),
        )
        if tolerance is not None:
            d["tolerance"] = tolerance
        return d

    return _declare(name, topic, make, registration, "numeric_family")


def ratio_family(
    name,
    topic: str | None = None,
    *,
    draw,
    calc,
    over,
    under,
    text,
    hints: list[str],
    solution,
    fields=None,
    diagnostics=(),
    unit: str = "ratio",
    **registration,
):
    """Declare family ``name`` whose answer is ONE calculator under two settings:
    ``calc(p, **over) / calc(p, **under)``.

    ``draw(rng) -> p`` draws the question's params; ``over`` and ``under`` are keyword dicts for
    ``calc``, or functions of ``p`` returning one. The words are templates as ``numeric_family``'s, filled
    in from the params, ``over``, ``under`` and ``ratio`` (the two results and their ratio) and
    ``fields(p, over, under, ratio)``; ``text`` may instead be ``text(p)`` and ``solution``
    ``solution(p, over, under, ratio)``. ``diagnostics`` is a list of (factor, hint) or
    ``fn(p, over, under, ratio)`` returning one. ``name`` is the family's registration
    ``family("topic.x", ...)`` or a plain name, as for ``numeric_family``."""

    def make(rng):
        p = draw(rng)
        num = calc(p, **_setting(over, p))
        den = calc(p, **_setting(under, p))
        r = num / den
        names = {**p, **(fields(p, num, den, r) if fields else {}), "over": num, "under": den, "ratio": r}
        return dict(
            text=_worded(text, p, names=names),
            params=p,
            answer=r,
            unit=unit,
            hints=list(_worded(hints, p, names=names)),
            solution=list(_worded(solution, p, num, den, r, names=names)),
            diagnostics=list(diagnostics(p, num, den, r) if callable(diagnostics) else diagnostics),
        )

    return _declare(name, topic, make, registration, "ratio_family")


__all__ = [
    "GB",
    "MB",
    "LazyModule",
    "context_parallel",
    "expert_parallel",
    "fusion",
    "gb",
    "gb_over_under",
    "gbps",
    "hierarchy",
    "inference",
    "inference_metrics",
    "kernels",
    "numeric_family",
    "paged",
    "pick",
    "picks",
    "placement",
    "quant",
    "ratio_family",
    "rl_ppo",
    "rl_sizing",
    "rlhf",
    "speculative",
    "tensor_parallel",
    "us",
    "zero",
]
