import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

# Every package a test imports with ``pytest.importorskip`` is in an extra that ``make`` installs
# (test, inference, rl, ...). On a laptop a missing one skips its tests; under CI (``CI`` set, as
# ``.ci/run`` does) it is a failure that names the package, never a silent skip.
_importorskip = pytest.importorskip


def importorskip_or_fail_in_ci(modname, minversion=None, reason=None, **kwargs):
    """``pytest.importorskip``, except that with ``CI`` set a missing module fails the test."""
    try:
        return _importorskip(modname, minversion=minversion, reason=reason, **kwargs)
    except pytest.skip.Exception as exc:
        if os.environ.get("CI"):
            pytest.fail(
                f"{modname} cannot be imported under CI ({exc}); `make setup` installs it "
                "(pyproject.toml's extras): a broken install must not skip tests silently",
                pytrace=False,
            )
        raise


pytest.importorskip = importorskip_or_fail_in_ci


ENGINE_VOCAB = 300  # > 256: the byte tokenizer has an end-of-sequence id


@pytest.fixture(scope="module")
def engine_test_model():
    """The ``tiny`` preset with ``ENGINE_VOCAB`` tokens and its random weights scaled 5x (well separated
    logits: no near-ties for argmax, so greedy outputs compare exactly), in eval mode; one per module."""
    import torch

    from mlsys_nb.config import load_model_preset
    from mlsys_nb.models import Transformer

    torch.manual_seed(0)
    m = Transformer(load_model_preset("tiny").replace(vocab_size=ENGINE_VOCAB)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(5)
    return m


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of tiny-tensor tests (``pytestmark = pytest.mark.usefixtures(...)``): on a
    shared 2-core machine two threads beside a busy neighbour wait on each other (engine runs took 2-50x longer);
    the previous count is restored after the module. torch is imported here, not at the top: the GPU pack loads
    this file on a machine where only pytest may be imported at collection."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="session")
def tiny_server():
    """One OpenAI-compatible server process (``serve_helpers.serve_process()``: the ``tiny`` preset, defaults) shared
    by tests/test_server.py and tests/test_server_robust.py, whose tests compare /metrics before and after
    themselves: one start (seconds of imports) instead of two. -> (url, pid); stopped at the end of the session."""
    from serve_helpers import serve_process

    with serve_process() as (url, proc):
        yield url, proc.pid
