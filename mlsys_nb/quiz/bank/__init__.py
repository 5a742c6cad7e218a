"""Every question family, by topic (importing this module registers them in ``quiz.core.REGISTRY``)."""

from . import comm, training, pipeline, inference, cards  # noqa: F401
