"""The simulator's per-op all-to-all cost (``simulate(..., a2a=...)``): expert-parallel dispatch and
combine sit inside every forward and input-gradient backward; DualPipe's overlapped FB pairs hide
one half's all-to-all behind the other half's compute (DeepSeek-V3, arXiv:2412.19437, Sec. 3.2.1)."""

import pytest

from mlsys_nb.pipeline import schedule, simulate


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b"])
def test_a2a_is_added_to_every_forward_and_backward(name):
    """Independent reference: the same schedule with the all-to-all folded into F and B by hand."""
    s = schedule(name, 4, 8, 2 if name.startswith("interleaved") else None)
    for a2a in (0.25, 1.0, 3.0):
        got = simulate(s, F=1.0, B=2.0, a2a=a2a, comm=0.1)
        ref = simulate(s, F=1.0 + a2a, B=2.0 + a2a, comm=0.1)
        assert got.makespan == pytest.approx(ref.makespan)
        assert got.busy == pytest.approx(ref.busy)


def test_split_backward_pays_a2a_in_b_not_in_w():
    s = schedule("zb-h1", 4, 8)
    got = simulate(s, F=1.0, B=1.0, W=1.0, a2a=0.5)
    ref = simulate(s, F=1.5, B=1.5, W=1.0)
    assert got.makespan == pytest.approx(ref.makespan)


@pytest.mark.parametrize("name", ["dualpipe", "dualpipev"])
def test_dualpipe_hides_the_a2a_inside_overlapped_pairs(name):
    s = schedule(name, 4, 8)
    F, B, W, a2a = 1.0, 1.0, 1.0, 0.75  # a2a below F and B: fully hidden in an FB pair
    base, with_a2a = simulate(s, F=F, B=B, W=W), simulate(s, F=F, B=B, W=W, a2a=a2a)
    n_fb = sum(a.kind == "FB" for a in s.compute[0])
    n_f = sum(a.kind == "F" for a in s.compute[0])
    n_b = sum(a.kind == "B" for a in s.compute[0])
    assert n_fb > 0
    # rank 0's busy time grows only by the all-to-alls of its *unpaired* F and B ops
    assert with_a2a.busy[0] - base.busy[0] == pytest.approx(a2a * (n_f + n_b) * s.chunk_weight)
    # and the makespan grows less than 1F1B's, which pays a2a in every op (same F, B+W, p, m)
    s1 = schedule("1f1b", 4, 8)
    grow_1f1b = simulate(s1, F=F, B=B + W, a2a=a2a).makespan - simulate(s1, F=F, B=B + W).makespan
    assert with_a2a.makespan - base.makespan < grow_1f1b
    # without the overlap (pair = F + B + W + 2·a2a) the same schedule is slower: the check above can fail
    serial = simulate(s, F=F, B=B, W=W, a2a=a2a, FB=F + B + W + 2 * a2a)
    assert serial.makespan > with_a2a.makespan
    assert serial.busy[0] - base.busy[0] == pytest.approx(a2a * (n_f + n_b + 2 * n_fb) * s.chunk_weight)


def test_a2a_longer_than_compute_is_exposed_in_pairs():
    s = schedule("dualpipe", 4, 8)
    res = simulate(s, F=1.0, B=1.0, W=1.0, a2a=3.0)
    fb = [a for a in s.compute[0] if a.kind == "FB"]
    base = simulate(s, F=1.0, B=1.0, W=1.0)
    n_f = sum(a.kind == "F" for a in s.compute[0])
    n_b = sum(a.kind == "B" for a in s.compute[0])
    # each pair costs max(F, a2a) + max(B + W, a2a) = 3 + 3 instead of 1 + 2
    want = base.busy[0] + s.chunk_weight * (3.0 * (n_f + n_b) + (6.0 - 3.0) * len(fb))
    assert res.busy[0] == pytest.approx(want)


def test_negative_a2a_is_rejected():
    with pytest.raises(ValueError, match="a2a"):
        simulate(schedule("1f1b", 2, 4), a2a=-1.0)
