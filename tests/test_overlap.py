"""The overlap check of notebook 02 (``mlsys_nb.comm.overlap``): a non-blocking send overlaps a
CPU-free wait of the same length (non-blocking <= 0.8 x blocking), and the same check FAILS when the
"non-blocking" variant really blocks (the idea broken), in every one of its attempts, although the
check re-measures up to ``ATTEMPTS`` times."""

import pytest

import mlsys_nb
from mlsys_nb.comm.overlap import ATTEMPTS, OVERLAP_LIMIT, check_overlap, overlap_timings
from mlsys_nb.runtime import RankError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def timings():
    def both():
        return {nb: overlap_timings(nonblocking=nb) for nb in (True, False)}

    return mlsys_nb.launch(both, world_size=2, backend="gloo", timeout=180)


def test_nonblocking_send_overlaps_a_cpu_free_wait(timings):
    for rank, t in enumerate(timings):
        assert t[True]["payload_ok"], f"rank {rank}: payload corrupted"
        check_overlap(t[True])
    # the ranks decide together: both stop after the same attempt
    assert len(timings[0][True]["tries"]) == len(timings[1][True]["tries"]) <= ATTEMPTS


def test_check_fails_all_attempts_when_the_send_blocks(timings):
    for t in timings:
        broken = t[False]
        assert len(broken["tries"]) == ATTEMPTS, "a blocking send must miss the limit in every attempt"
        assert all(r > OVERLAP_LIMIT for r, _, _ in broken["tries"])
        with pytest.raises(AssertionError, match="did not proceed") as err:
            check_overlap(broken)
        assert f"in {ATTEMPTS} attempt(s)" in str(err.value) and "load average" in str(err.value)


def test_failure_message_names_attempts_control_and_load():
    t = dict(ratio=0.93, tries=[(0.95, 1.01, 0.02), (0.97, 0.99, 0.02), (0.93, 1.0, 0.03)], load_avg=3.25, limit=0.8)
    with pytest.raises(AssertionError) as err:
        check_overlap(t)
    msg = str(err.value)
    assert "0.95, 0.97, 0.93x" in msg and "control measured 1.01, 0.99, 1.00x" in msg and "load average 3.2" in msg
    assert check_overlap(dict(t, ratio=0.6)) == 0.6


def test_bad_input_is_rejected():
    with pytest.raises(RankError, match="ranks 0 and 1"):
        mlsys_nb.launch(lambda: overlap_timings(repeats=1), world_size=3, backend="gloo", timeout=60)
    with pytest.raises(RankError, match="attempts=0"):
        mlsys_nb.launch(lambda: overlap_timings(attempts=0), world_size=2, backend="gloo", timeout=60)
