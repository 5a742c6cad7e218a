"""From-scratch collectives on real ranks: equal to torch.distributed, bytes equal the closed forms.

One launch per world size (2..8) runs every algorithm inside it (``verify_against_torch``); the
byte counts the ranks report are compared here with ``mlsys_nb.comm``'s closed forms.
"""

import pandas as pd
import pytest

import mlsys_nb
from mlsys_nb import comm
from mlsys_nb.comm.collectives import chunk_bounds, verify_against_torch

TOL = 1e-5
E = 4  # float32 bytes


def _numels(n):
    # none divisible by n (1, n+1, 1000n+1) plus one multiple of n for the textbook form
    return (1, n + 1, 1000 * n + 1, 64 * n)


def _expected_bytes(row, n, r):
    a, numel = row["algorithm"], row["numel"]
    if a.startswith("all_reduce/ring") or a == "all_reduce/rs+ag":
        return comm.ring_bytes_sent("all_reduce", numel, n, r, E)
    if a == "all_reduce/recursive_doubling":
        return comm.recursive_doubling_bytes_sent(numel * E, n, r)
    if a == "all_reduce/tree":
        return comm.tree_bytes_sent(numel * E, n, r, root=0)
    if a == "reduce_scatter/ring":
        return comm.ring_bytes_sent("reduce_scatter", numel, n, r, E)
    if a == "all_gather/ring":
        return comm.ring_bytes_sent("all_gather", numel, n, r, E)
    if a == "all_gather/ring/unequal":
        base = (numel - n * (n - 1) // 2) // n
        sizes = [base + k for k in range(n)]
        return (sum(sizes) - sizes[(r + 1) % n]) * E
    if a == "broadcast/tree":
        return comm.tree_bytes_sent(numel * E, n, r, root=n - 1, phase="broadcast")
    if a == "reduce/tree":
        return comm.tree_bytes_sent(numel * E, n, r, root=n - 1, phase="reduce")
    if a == "all_to_all/pairwise":
        return comm.bytes_sent_per_rank("all_to_all", numel * E, n)
    raise AssertionError(f"no closed form for {a}")


@pytest.mark.slow
@pytest.mark.parametrize("n", [2, 3, 4, 5, 6, 7, 8])
def test_from_scratch_collectives_equal_torch_and_count_closed_form_bytes(n):
    per_rank = mlsys_nb.launch(
        verify_against_torch, n, kwargs=dict(numels=_numels(n), seed=n), backend="gloo", timeout=120, output="quiet"
    )
    df = pd.DataFrame([row for rows in per_rank for row in rows])
    assert set(df["rank"]) == set(range(n))
    expected_algos = {
        "all_reduce/ring",
        "all_reduce/ring/max",
        "all_reduce/ring/noncontiguous",
        "all_reduce/ring/batched",
        "all_reduce/rs+ag",
        "all_reduce/tree",
        "all_reduce/recursive_doubling",
        "reduce_scatter/ring",
        "all_gather/ring",
        "all_gather/ring/unequal",
        "broadcast/tree",
        "reduce/tree",
        "all_to_all/pairwise",
    }
    assert set(df["algorithm"]) == expected_algos
    worst = df.groupby("algorithm")["max_abs_err"].max()
    assert (worst <= TOL).all(), f"n={n}: differs from torch.distributed:\n{worst[worst > TOL]}"
    for _, row in df.iterrows():
        want = _expected_bytes(row, n, row["rank"])
        assert row["bytes_sent"] == want, (
            f"n={n} rank {row['rank']} {row['algorithm']} numel {row['numel']}: "
            f"sent {row['bytes_sent']} B, closed form {want} B"
        )
    # bytes are conserved: what all ranks send, all ranks receive
    tot = df.groupby(["algorithm", "numel"])[["bytes_sent", "bytes_received"]].sum()
    assert (tot["bytes_sent"] == tot["bytes_received"]).all()
    # the textbook forms hold exactly when n divides the size
    ring = df[(df["algorithm"] == "all_reduce/ring") & (df["numel"] == 64 * n)]
    assert (ring["bytes_sent"] == 2 * (n - 1) / n * 64 * n * E).all()
    rs = df[(df["algorithm"] == "reduce_scatter/ring") & (df["numel"] == 64 * n)]
    assert (rs["bytes_sent"] == (n - 1) / n * 64 * n * E).all()
    if n & (n - 1) == 0:  # power of two: every rank sends log2(n)·S in recursive doubling
        rd = df[(df["algorithm"] == "all_reduce/recursive_doubling") & (df["numel"] == 64 * n)]
        assert (rd["bytes_sent"] == comm.bytes_sent_per_rank("all_reduce", 64 * n * E, n, "recursive_doubling")).all()


def test_chunk_bounds_match_tensor_split():
    import torch

    for numel in (0, 1, 5, 17, 100):
        for n in (1, 2, 3, 7, 8):
            sizes = [b - a for a, b in chunk_bounds(numel, n)]
            assert sizes == [c.numel() for c in torch.tensor_split(torch.arange(numel), n)]
    with pytest.raises(ValueError, match="n must be an int >= 1, got 0"):
        chunk_bounds(4, 0)


@pytest.mark.slow
def test_semantics_pictures_match_torch_distributed():
    """The symbolic before/after that the notebook draws is what torch.distributed does."""
    from mlsys_nb.comm.collectives import SEMANTICS_OPS, check_semantics

    per_rank = mlsys_nb.launch(
        check_semantics, 3, kwargs=dict(root=1, seed=5), backend="gloo", timeout=60, output="quiet"
    )
    for r, errs in enumerate(per_rank):
        assert set(errs) == set(SEMANTICS_OPS)
        assert max(errs.values()) <= TOL, f"rank {r}: {errs}"


def test_semantics_shapes_by_hand():
    from mlsys_nb.comm.collectives import collective_semantics

    before, after = collective_semantics("all_to_all", 3)
    assert after[2] == [frozenset({(0, 2)}), frozenset({(1, 2)}), frozenset({(2, 2)})]
    before, after = collective_semantics("reduce", 3, root=2)
    assert after[0] == [None] * 3 and after[2][1] == frozenset({(0, 1), (1, 1), (2, 1)})
    _, after = collective_semantics("reduce_scatter", 4)
    assert after[1] == [frozenset({(s, 1) for s in range(4)})]
    with pytest.raises(ValueError, match="op='allgather'"):
        collective_semantics("allgather", 4)
