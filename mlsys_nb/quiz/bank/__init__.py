"""Every question family, one module per quiz topic (``quiz.core.TOPICS``) plus the spot-the-error
cards; importing this package registers them all in ``quiz.core.REGISTRY``. A family's topic is the
name of the module that declares it (``tests/test_quiz.py`` checks it for every family)."""

from . import (  # noqa: F401
    cards,
    checkpoint,
    comm,
    compute,
    data_parallel,
    expert_context,
    inference,
    kernels,
    layout,
    memory,
    pipeline,
    precision,
    profiling,
    quant,
    rl,
    scaling,
    serving,
    tensor,
)
