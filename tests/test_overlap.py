"""The overlap check of notebook 02 (``mlsys_nb.comm.overlap``): a non-blocking send overlaps a
CPU-free wait of the same length (non-blocking <= 0.8 x blocking), and the same check FAILS when the
"non-blocking" variant really blocks (the idea broken)."""

import pytest

import mlsys_nb
from mlsys_nb.runtime import RankError
from mlsys_nb.comm.overlap import check_overlap, overlap_timings

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def timings():
    def both():
        return {nb: overlap_timings(nonblocking=nb) for nb in (True, False)}

    return mlsys_nb.launch(both, world_size=2, backend="gloo", timeout=120)


def test_nonblocking_send_overlaps_a_cpu_free_wait(timings):
    for rank, t in enumerate(timings):
        assert t[True]["payload_ok"], f"rank {rank}: payload corrupted"
        check_overlap(t[True])


def test_check_fails_when_the_send_blocks(timings):
    for t in timings:
        with pytest.raises(AssertionError, match="did not proceed"):
            check_overlap(t[False])


def test_bad_input_is_rejected():
    with pytest.raises(RankError, match="ranks 0 and 1"):
        mlsys_nb.launch(lambda: overlap_timings(repeats=1), world_size=3, backend="gloo", timeout=60)
