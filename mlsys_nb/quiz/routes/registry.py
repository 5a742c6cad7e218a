"""The registry of second routes: ``register_route`` registers one, ``second_route`` answers a question by it,
``worked_response`` writes that answer as a learner would type it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from ..core import Question

ROUTES: dict[str, Callable[[dict], float | str]] = {}


def register_route(*names: str):
    """Register ``fn(params) -> answer`` as the second route of the families ``names``."""

    def deco(fn):
        for n in names:
            ROUTES[n] = fn
        return fn

    return deco


def second_route(q: Question) -> float | str:
    """The answer to ``q`` by its family's second route (never the family's own calculator)."""
    if q.family not in ROUTES:
        raise KeyError(f"family {q.family!r} has no second route")
    return ROUTES[q.family](dict(q.params, _family=q.family, _text=q.text))


def worked_response(q: Question) -> str:
    """The second route's answer written with a unit, as a learner would type it."""
    v = second_route(q)
    if q.is_choice:
        return str(v)
    return dataclasses.replace(q, answer=float(v)).answer_response()
