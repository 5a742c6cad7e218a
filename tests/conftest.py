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
