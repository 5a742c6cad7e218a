"""The rank factory (forkserver) preloads what every training rank would import on its own.

A process's first ``torch.optim`` optimizer imports ``torch._dynamo`` (torch._compile's lazy import: several seconds
of CPU, with DTensor and sympy). Ranks are forked from a forkserver that imported it once, so a rank that trains
imports nothing when it builds its optimizer; without the preload, every rank of every launch pays the import.
"""

import subprocess
import sys

import pytest

from mlsys_nb.runtime import ranks
from mlsys_nb.runtime.launcher import launch

MODULES_AN_OPTIMIZER_ADDS = """
import sys
import torch
before = set(sys.modules)
torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
print(sorted(set(sys.modules) - before))
"""


def modules_an_optimizer_adds() -> list[str]:
    """The modules that building a first SGD optimizer imports in this process (sorted names)."""
    import torch

    before = set(sys.modules)
    torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
    return sorted(set(sys.modules) - before)


@pytest.mark.slow
def test_a_rank_builds_its_first_optimizer_without_importing_anything():
    assert "torch._dynamo" in ranks.PRELOAD
    added = launch(modules_an_optimizer_adds, 2, output="quiet")
    assert added == [[], []], f"modules imported in the ranks by their first optimizer: {added}"


@pytest.mark.slow
def test_without_the_preload_a_first_optimizer_imports_dynamo():
    # the idea broken: a process that imported only torch (what the forkserver preloaded before) imports
    # torch._dynamo when it builds its first optimizer, so the check above would see it
    out = subprocess.run(
        [sys.executable, "-c", MODULES_AN_OPTIMIZER_ADDS], capture_output=True, text=True, timeout=120, check=True
    )
    assert "'torch._dynamo'" in out.stdout, out.stdout[-2000:]
