"""Second routes: every family's answer recomputed from ``question.params`` WITHOUT the function
that computed its key.

A worked solution that printed ``question.answer`` and fed it back to ``question.check`` could not
fail: a wrong key would pass its own checker. Here each family has a route of its own, chosen to
share as little as possible with the key:

- hand formulas written out from the papers (α-β times, ZeRO bytes, 6·N·D, the Chinchilla closed
  form, speculative decoding's geometric sum, GAE, PPO/GRPO/DPO/k3 in plain Python);
- counts read off the kit's real ``Transformer`` built on the ``meta`` device (parameters, matmul
  weights), where the keys use ``memory.param_count``'s closed forms;
- FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on that model's graph;
- a hand roofline and a hand training-memory sum (states, each saved tensor of a block, the
  temporaries), where the keys use ``inference.roofline`` and ``memory.estimate``;
- brute force (the inference-optimal model size on a grid), a simulated two-worker timeline
  (asynchronous RLHF), and the pipeline's closed forms where the keys use its simulator.

``second_route(q)`` returns the answer (a number in ``q.unit`` or a choice string);
``worked_response(q)`` writes it as a learner would type it, for ``q.check``. A family without a
route raises ``KeyError`` (``tests/test_quiz_second_route.py`` checks every family has one and that
each agrees with its key).
"""

import importlib

from ..core import TOPICS
from .registry import ROUTES, register_route, second_route, worked_response

for _module in (*TOPICS, "cards", "cards_training", "cards_serving"):  # each module registers its topic's second routes
    importlib.import_module(f"{__name__}.{_module}")

__all__ = ["ROUTES", "register_route", "second_route", "worked_response"]
