"""Cost models, busbw factors and fits against hand-worked values (nccl-tests PERFORMANCE.md, Thakur et al. 2005)."""

import numpy as np
import pytest

from mlsys_nb import comm

GiB = 2**30


@pytest.mark.parametrize(
    "n,S,alpha,beta,ring_ms,tree_ms",
    [
        (8, 1e9, 5e-6, 100e9, 17.5700, 20.0300),
        (64, 1e6, 5e-6, 50e9, 0.6694, 0.1000),
        (4, 419_430_400, 0.0, 450e9, 1.3981, 1.8641),
        (1024, 1e3, 5e-6, 50e9, 10.2300, 0.1000),
    ],
)
def test_ring_and_tree_all_reduce_times_match_hand_worked_table(n, S, alpha, beta, ring_ms, tree_ms):
    assert comm.collective_time("all_reduce", S, n, alpha, beta, "ring") * 1e3 == pytest.approx(ring_ms, abs=5e-5)
    assert comm.collective_time("all_reduce", S, n, alpha, beta, "tree") * 1e3 == pytest.approx(tree_ms, abs=5e-5)


def test_one_gigabyte_on_eight_gpus_nvlink_vs_pcie():
    # 2(n-1)/n · S / β: 1.75 GB at 450 GB/s = 3.89 ms, at 16 GB/s = 109 ms (not S/β = 2.2 / 62 ms)
    assert comm.collective_time("all_reduce", 1e9, 8, 0.0, 450e9) * 1e3 == pytest.approx(3.889, abs=1e-3)
    assert comm.collective_time("all_reduce", 1e9, 8, 0.0, 16e9) * 1e3 == pytest.approx(109.375, abs=1e-3)
    nv = comm.AlphaBeta.from_link("nvlink4")
    assert nv.beta_bytes_per_s == 450e9  # per direction, not the 900 GB/s bidirectional figure


def test_other_algorithms_coefficients_by_hand():
    # all_gather ring, n=4: 3 steps, 3/4 of S
    assert comm.cost_coefficients("all_gather", "ring", 4) == (3.0, 0.75)
    # recursive doubling, n=8: 3 exchanges of S; n=6: p=4 -> 2 + fold + unfold = 4
    assert comm.cost_coefficients("all_reduce", "recursive_doubling", 8) == (3.0, 3.0)
    assert comm.cost_coefficients("all_reduce", "recursive_doubling", 6) == (4.0, 4.0)
    # binomial tree, n=5: ceil(log2 5) = 3 up and 3 down, whole tensor each step
    assert comm.cost_coefficients("all_reduce", "binomial_tree", 5) == (6.0, 6.0)
    # Rabenseifner, n=16: 8 steps, ring volume 30/16
    assert comm.cost_coefficients("all_reduce", "rabenseifner", 16) == (8.0, 1.875)
    assert comm.cost_coefficients("all_to_all", "pairwise", 8) == (7.0, 0.875)
    assert comm.cost_coefficients("broadcast", "binomial_tree", 8) == (3.0, 3.0)
    # 1 MB ring reduce_scatter on 4 ranks at α=10 µs, β=10 GB/s: 3·10 µs + 0.75 MB / 10 GB/s = 105 µs
    assert comm.collective_time("reduce_scatter", 1e6, 4, 10e-6, 10e9) == pytest.approx(105e-6)


def test_busbw_factors_and_worked_example():
    assert comm.busbw_factor("all_reduce", 4) == 1.5
    assert comm.busbw_factor("all_gather", 8) == 0.875
    assert comm.busbw_factor("reduce_scatter", 2) == 0.5
    assert comm.busbw_factor("broadcast", 8) == 1.0
    # nccl-tests busbw, worked by hand: 4 ranks, 419,430,400 B
    assert comm.algbw(419_430_400, 2.15e-3) / 1e9 == pytest.approx(195.08, abs=0.01)
    assert comm.busbw("all_reduce", 419_430_400, 2.15e-3, 4) / 1e9 == pytest.approx(292.63, abs=0.01)
    assert comm.busbw("all_reduce", 419_430_400, 2.15e-3, 4) / GiB == pytest.approx(272.53, abs=0.01)
    # reduce_scatter: S is the full input (4 × output); the output alone under-reports 4×
    full = comm.busbw("reduce_scatter", 4 * 419_430_400, 3.98e-3, 4)
    assert full / GiB == pytest.approx(294.44, abs=0.01)
    assert full / 1e9 == pytest.approx(316.15, abs=0.01)
    assert comm.busbw("reduce_scatter", 419_430_400, 3.98e-3, 4) / GiB == pytest.approx(73.61, abs=0.01)


def test_closed_form_bytes_by_hand():
    # 10 elements on 4 ranks: chunks 3,3,2,2 (tensor_split)
    assert [comm.ring_bytes_sent("all_reduce", 10, 4, r, 1) for r in range(4)] == [14, 15, 16, 15]
    assert [comm.ring_bytes_sent("reduce_scatter", 10, 4, r, 1) for r in range(4)] == [7, 7, 8, 8]
    assert comm.ring_bytes_sent("all_reduce", 12, 4, 0, 4) == 2 * 3 / 4 * 12 * 4
    assert comm.bytes_sent_per_rank("all_reduce", 1e9, 8) == 1.75e9
    # binomial tree on 6 ranks, root 0: children 0->{1,2,4}, 2->{3}, 4->{5}
    assert [comm.tree_bytes_sent(1, 6, r, phase="broadcast") for r in range(6)] == [3, 0, 1, 0, 1, 0]
    assert [comm.tree_bytes_sent(1, 6, r, phase="reduce") for r in range(6)] == [0, 1, 1, 1, 1, 1]
    for n in range(1, 10):  # each phase moves (n-1)·S in total
        assert sum(comm.tree_bytes_sent(1, n, r, root=n // 2, phase="broadcast") for r in range(n)) == n - 1
    # recursive doubling on 6 ranks: p=4, rem=2; ranks 0,2 fold in (S), 1,3 do 2 steps + unfold
    assert [comm.recursive_doubling_bytes_sent(1, 6, r) for r in range(6)] == [1, 3, 1, 3, 2, 2]


def test_crossover_ring_vs_tree():
    # S* = n(n-1-ceil(log2 n))·α·β = 8·4·5e-6·100e9 = 16 MB
    s = comm.crossover_bytes(8, 5e-6, 100e9)
    assert s == pytest.approx(16e6)
    t_ring = comm.collective_time("all_reduce", s, 8, 5e-6, 100e9, "ring")
    t_tree = comm.collective_time("all_reduce", s, 8, 5e-6, 100e9, "tree")
    assert t_ring == pytest.approx(t_tree)
    t_tree, t_ring = (comm.collective_time("all_reduce", s / 2, 8, 5e-6, 100e9, a) for a in ("tree", "ring"))
    assert t_tree < t_ring
    # n = 2: the ring and the tree both take 2 steps; the ring moves less, so it always wins
    assert comm.crossover_bytes(2, 5e-6, 100e9) is None


def test_fit_recovers_alpha_beta_and_predicts_held_out_sizes():
    sizes = np.logspace(3, 8, 12)
    true = comm.AlphaBeta(30e-6, 2e9)
    t = true.time("all_reduce", sizes, 4)
    fit = comm.fit_alpha_beta(sizes[::2], t[::2], "all_reduce", 4, "ring")
    assert fit.alpha_s == pytest.approx(30e-6, rel=1e-6)
    assert fit.beta_bytes_per_s == pytest.approx(2e9, rel=1e-6)
    assert fit.rel_error(sizes[1::2], t[1::2]).max() < 1e-6
    # with ±10 % multiplicative noise the held-out error stays near the noise level
    rng = np.random.default_rng(0)
    noisy = t * rng.uniform(0.9, 1.1, size=t.shape)
    fit = comm.fit_alpha_beta(sizes[::2], noisy[::2], "all_reduce", 4)
    assert fit.rel_error(sizes[1::2], t[1::2]).max() < 0.15
    assert 0.8 < fit.beta_bytes_per_s / 2e9 < 1.25


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: comm.busbw_factor("all_reduce", 0), "world size"),
        (lambda: comm.busbw_factor("allreduce", 4), "op='allreduce'"),
        (lambda: comm.cost_coefficients("all_reduce", "butterfly", 4), "algorithm='butterfly'"),
        (lambda: comm.collective_time("all_reduce", 1e6, 4, 1e-6, 0.0), "beta"),
        (lambda: comm.algbw(1e6, 0.0), "seconds"),
        (lambda: comm.fit_alpha_beta([1e3, 1e3], [1e-3, 1e-3]), "distinct"),
        (lambda: comm.ring_bytes_sent("all_reduce", 10, 4, 4), r"rank must be an int in \[0, 3\], got 4"),
        (lambda: comm.bytes_sent_per_rank("all_reduce", 1e6, 4, "tree"), "tree_bytes_sent"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_memcpy_bandwidth_counts_bytes_over_the_timed_copies(monkeypatch):
    # a fake clock instead of wall time (no wall-clock bound holds beside a busy neighbour): the 2 warm-up
    # copies do not read the clock, the timed ones take 4, 1 and 2 ms; the bandwidth must be
    # bytes / time of the timed copies
    from types import SimpleNamespace

    from mlsys_nb.runtime import timing

    starts = [0.0, 5.0, 6.0]
    ticks = iter([t for s, dt in zip(starts, [4e-3, 1e-3, 2e-3]) for t in (s, s + dt)])
    monkeypatch.setattr(timing, "time", SimpleNamespace(perf_counter=lambda: float(next(ticks))))
    m = comm.memcpy_bandwidth(nbytes=4 << 20, repeats=3, warmup=2)
    bw = (4 << 20) / np.array([4e-3, 1e-3, 2e-3])  # bytes (not elements) per second of each timed copy
    assert m.nbytes == 4 << 20 and m.repeats == 3
    assert m.median_bytes_per_s == pytest.approx((4 << 20) / 2e-3, rel=1e-9)
    assert (m.q25_bytes_per_s, m.q75_bytes_per_s) == pytest.approx(tuple(np.percentile(bw, [25, 75])), rel=1e-9)


def test_memcpy_bandwidth_on_this_machine_is_consistent():
    m = comm.memcpy_bandwidth(nbytes=4 << 20, repeats=3)
    assert m.nbytes == 4 << 20 and m.median_bytes_per_s > 0
    assert m.q25_bytes_per_s <= m.median_bytes_per_s <= m.q75_bytes_per_s


def test_memcpy_bandwidth_copies_on_the_threads_asked_and_restores_them(monkeypatch):
    import torch

    before, seen = torch.get_num_threads(), []
    real_copy = torch.Tensor.copy_
    monkeypatch.setattr(
        torch.Tensor, "copy_", lambda dst, src: seen.append(torch.get_num_threads()) or real_copy(dst, src)
    )
    comm.memcpy_bandwidth(nbytes=1 << 16, repeats=2, warmup=1, threads=1)
    assert seen and set(seen) == {1}  # every copy (warm-up and timed) ran on one thread
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="threads must be an int"):
        comm.memcpy_bandwidth(nbytes=1 << 16, threads=0)


@pytest.mark.slow
def test_sweep_on_real_ranks_returns_consistent_frame():
    df = comm.sweep(
        ops=("all_reduce", "reduce_scatter"),
        sizes=(4096, 65536),
        world_sizes=(2,),
        impls=("torch", "ring"),
        warmup=1,
        repeats=3,
        progress=False,
    )
    assert len(df) == 2 * 2 * 2
    assert set(df["impl"]) == {"torch", "ring"} and set(df["backend"]) == {"gloo"}
    assert (df["q25_s"] <= df["median_s"]).all() and (df["median_s"] <= df["q75_s"]).all()
    for _, r in df.iterrows():
        assert r["busbw_Bps"] == pytest.approx(r["bytes"] / r["median_s"] * comm.busbw_factor(r["op"], 2))
    with pytest.raises(ValueError, match="op='gather'"):
        comm.sweep(ops=("gather",))
