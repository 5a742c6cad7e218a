"""Every question family, one module per quiz topic (``quiz.core.TOPICS``) plus the spot-the-error
cards; importing this package registers them all in ``quiz.core.REGISTRY``. A family's topic is the
name of the module that declares it (``tests/test_quiz.py`` checks it for every family)."""

import importlib

from ..core import TOPICS

for _module in (*TOPICS, "cards", "cards_training", "cards_serving"):  # each module registers its topic's families
    importlib.import_module(f"{__name__}.{_module}")
