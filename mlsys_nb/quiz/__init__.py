"""Interview practice: randomized, auto-checked questions whose answer keys are the kit's own calculators.

- ``draw(family=None, topic=None, seed=None, difficulty=None)`` -> ``Question`` (``.family``,
  ``.topic``, ``.text``, ``.params``, ``.answer`` in ``.unit``, ``.tolerance`` (2 % relative by
  default), ``.check(response)`` -> ``CheckResult(ok, value, feedback)``, ``.hints``, ``.solution``).
- ``families(topic=None)``: sorted family names; ``topics()``; ``worksheet(topics, n, seed)``.
- Same family and seed, same question in every process (seeded from sha256, not ``hash()``). A worksheet
  takes a topic's families in rendezvous order (sha256 of seed and family name) and seeds each question by
  (seed, family, repeat k): adding a family leaves the question of every family that stays selected.
- ``routes.second_route(q)`` / ``routes.worked_response(q)``: the answer by a second route that never calls
  the family's key (hand formulas, the real model on the meta device, FlopCounterMode, brute force); the
  worked solutions of notebook 20 answer with it, so a wrong key fails its check.
- Inference premises are physical: ``bank.inference.fits_on_gpus`` (weights / tp + KV cache within 90 % of
  each GPU) is the one check every inference family draws through; ``inference.fits_tp`` asks the TP
  (``inference.kv_cache.min_tp_that_fits``).
- ``units.parse``: ``"3.2 GB"``, ``"3.2GiB"``, ``"3.2e9"``, ``"3,200 MB"``, ``"12 ms"``, ``"45%"``; a unit
  of the wrong dimension raises ``UnitError`` (``check`` reports it, never converts it).
- ``python -m mlsys_nb.quiz --topic pipeline -n 10``: practice in a terminal; ``html.write_worksheets``:
  printable sheets and a separate answer key (``make worksheets``).
- Families live in ``quiz.bank``, one module per topic named after it (``bank.memory`` holds the
  ``memory`` families, and a family's topic is its module's name); spot-the-error cards in ``bank.cards``.
  A family whose answer is one calculator call is a declaration,
  ``numeric_family(family(name, section=..., reference=...), draw=..., calc=..., ...)`` (``bank._util``:
  draw the params, call the calculator that owns the formula, word the question, hints and solution as
  ``str.format`` templates), or ``ratio_family`` (one calculator under two settings); choice questions and
  searches stay functions registered by ``@family(name, ...)``. Second routes: ``quiz.routes``, the same
  split by topic.
"""

from .core import TOPICS, CheckResult, Question, Worksheet, draw, families, family_info, make, topics, worksheet
from .units import UnitError, parse

__all__ = [
    "TOPICS",
    "CheckResult",
    "Question",
    "Worksheet",
    "UnitError",
    "draw",
    "families",
    "family_info",
    "make",
    "parse",
    "topics",
    "worksheet",
]
