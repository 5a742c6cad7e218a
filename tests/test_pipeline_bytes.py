"""pipeline.closed_forms.boundary_bytes / pp_bytes_per_step (notebook 08 section 10) against a second route: the
SEND actions of the kit's schedules, each carrying one micro-batch's activations or their gradient."""

import pytest

from mlsys_nb.config import ArgumentError
from mlsys_nb.pipeline import schedule
from mlsys_nb.pipeline.closed_forms import boundary_bytes, pp_bytes_per_step

CASES = [
    ("gpipe", 4, 8, None),
    ("1f1b", 4, 8, None),
    ("1f1b", 3, 5, None),
    ("zb-h1", 4, 8, None),
    ("zb-h2", 4, 8, None),
    ("interleaved-1f1b", 4, 8, 2),
    ("interleaved-1f1b", 2, 4, 3),
]


def sends_times_bytes(name, p, m, v, x):
    """Per rank, the schedule's SEND_F and SEND_B actions times the bytes of one (the second route)."""
    s = schedule(name, p, m, v)
    return [x * sum(a.kind in ("SEND_F", "SEND_B") for a in s.actions[r]) for r in range(p)]


def mismatches(formula):
    """The cases where ``formula`` (pp_bytes_per_step's signature) disagrees with the schedules' sends."""
    x = boundary_bytes(2, 16, 64, "bf16")
    return [
        (name, p, m, v)
        for name, p, m, v in CASES
        if formula(p, m, 2, 16, 64, v=v or 1, dtype="bf16") != sends_times_bytes(name, p, m, v, x)
    ]


def test_boundary_bytes_is_mbs_seq_hidden_bytes():
    assert boundary_bytes(1, 8192, 16384) == 1 * 8192 * 16384 * 2  # Llama 3 405B, bf16: 268 MB each way
    assert boundary_bytes(4, 8, 32, "fp32") == 4 * 8 * 32 * 4
    with pytest.raises(ArgumentError, match="mbs must be an int >= 1"):
        boundary_bytes(0, 8, 32)


def test_per_step_bytes_match_the_schedules_sends():
    assert mismatches(pp_bytes_per_step) == []
    middle = pp_bytes_per_step(4, 8, 2, 16, 64)[1]
    assert middle == 2 * 8 * boundary_bytes(2, 16, 64)  # a middle rank: m round trips of 2·mbs·seq·h·bytes
    assert pp_bytes_per_step(1, 8, 2, 16, 64) == [0.0]  # one stage: no boundary


def test_a_wrong_factor_two_is_caught():
    """The mutation: counting a round trip per direction (4·m·x for a middle rank), or one direction only."""
    doubled = lambda *a, **k: [2 * b for b in pp_bytes_per_step(*a, **k)]
    halved = lambda *a, **k: [b / 2 for b in pp_bytes_per_step(*a, **k)]
    assert mismatches(doubled) == CASES and mismatches(halved) == CASES
