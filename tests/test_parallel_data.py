"""mlsys_nb.parallel.data: DistributedSampler's shards as a closed form, the checks on them, the batch recipe and
the critical-batch-size model (notebook 05's sections 8 and 9). Each check is shown to fail on a broken input."""

import pytest
import torch
from torch.utils.data import DistributedSampler

from mlsys_nb.config import ArgumentError
from mlsys_nb.parallel.data import (
    critical_batch_tradeoff,
    decompose_batch,
    noise_scale_from_two_batches,
    sampler_problems,
    samples_per_rank,
    shard_indices,
)


def epochs_of(n, world, epochs=3, drop_last=False, set_epoch=True, seed_of_rank=lambda r: 0):
    """epochs[e][r]: what torch's DistributedSampler gives rank r in epoch e (no process group needed)."""
    samplers = [
        DistributedSampler(range(n), num_replicas=world, rank=r, drop_last=drop_last, seed=seed_of_rank(r))
        for r in range(world)
    ]
    out = []
    for e in range(epochs):
        if set_epoch:
            for s in samplers:
                s.set_epoch(e)
        out.append([list(s) for s in samplers])
    return out


@pytest.mark.parametrize("n", [1, 5, 10, 12])
@pytest.mark.parametrize("world", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_shard_indices_is_distributed_samplers_rule(n, world, drop_last):
    if drop_last and n < world:
        pytest.skip("drop_last with fewer samples than ranks leaves nothing")
    for e in range(2):
        order = torch.randperm(n, generator=torch.Generator().manual_seed(e)).tolist()  # seed + epoch, seed 0
        for r in range(world):
            s = DistributedSampler(range(n), num_replicas=world, rank=r, drop_last=drop_last)
            s.set_epoch(e)
            assert list(s) == shard_indices(order, world, r, drop_last)
            assert len(s) == samples_per_rank(n, world, drop_last)


def test_samples_per_rank_is_ceil_or_floor():
    assert samples_per_rank(10, 3) == 4 and samples_per_rank(10, 3, drop_last=True) == 3
    assert samples_per_rank(12, 3) == samples_per_rank(12, 3, drop_last=True) == 4
    with pytest.raises(ArgumentError, match="world must be an int >= 1"):
        samples_per_rank(10, 0)
    with pytest.raises(ArgumentError, match=r"rank must be an int in \[0, 2\]"):
        shard_indices(range(10), 3, 3)


@pytest.mark.parametrize("drop_last", [False, True])
def test_a_sampler_with_set_epoch_has_no_problems(drop_last):
    assert sampler_problems(epochs_of(10, 3, drop_last=drop_last), 10, drop_last) == []


def test_a_sampler_without_set_epoch_repeats_every_epoch():
    """The mutation: nobody calls set_epoch, so every epoch reads the same order."""
    problems = sampler_problems(epochs_of(10, 3, set_epoch=False), 10)
    assert problems == [
        "epoch 1: the same order as epoch 0 (was set_epoch called?)",
        "epoch 2: the same order as epoch 1 (was set_epoch called?)",
    ]


def test_a_sampler_seeded_per_rank_overlaps_and_misses_samples():
    """The mutation: each rank shuffles with its own seed, so the shards are cut from different permutations."""
    problems = sampler_problems(epochs_of(10, 3, epochs=1, seed_of_rank=lambda r: r), 10)
    assert any("read twice" in p for p in problems) and any("read by no rank" in p for p in problems), problems


def test_shards_of_the_wrong_size_are_flagged():
    shards = [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]  # contiguous, unpadded: sizes differ
    assert sampler_problems([shards], 10) == [
        "epoch 0: shard sizes [4, 3, 3], expected 4 each",
        "epoch 0: 0 samples read twice, expected 2 (the padding)",
    ]


def test_the_batch_recipe_multiplies_and_decomposes():
    for dp, acc, mbs in ((1, 4, 2), (2, 2, 2), (4, 1, 2)):
        r = decompose_batch(8, dp, mbs, seq_len=16)
        assert (r.dp, r.accumulation, r.micro_batch, r.global_batch, r.tokens) == (dp, acc, mbs, 8, 128)
        assert r.per_rank == acc * mbs
    llama = decompose_batch(2048, 128, 1, seq_len=8192)  # Llama 3 405B at 16,384 GPUs (arXiv:2407.21783, Table 4)
    assert (llama.accumulation, llama.tokens) == (16, 2**24)


def test_a_recipe_whose_accumulation_does_not_divide_is_refused():
    """The mutation: 8 sequences on 3 ranks of 2 leave no whole number of micro-batches."""
    with pytest.raises(ArgumentError, match="global_batch must be a multiple of dp x micro_batch = 3 x 2 = 6, got 8"):
        decompose_batch(8, 3, 2)


@pytest.mark.parametrize("batch", [1.0, 37.0, 1e3, 1e6])
def test_the_critical_batch_tradeoff(batch):
    s, e = critical_batch_tradeoff(batch, 1e3)
    assert abs((s - 1) * (e - 1) - 1) < 1e-12  # (S/Smin - 1)(E/Emin - 1) = 1 at every batch size
    if batch == 1e3:
        assert (s, e) == (2.0, 2.0)  # at B = B_noise: twice the fewest steps and twice the fewest examples
    with pytest.raises(ArgumentError, match="noise_scale must be"):
        critical_batch_tradeoff(batch, 0)


def test_the_noise_scale_from_two_batch_sizes():
    g2, trace = 4.0, 200.0  # |G|^2 and tr(Sigma): B_noise = 50 examples
    expected = lambda b: g2 + trace / b  # E|G_B|^2
    assert abs(noise_scale_from_two_batches(8, expected(8), 64, expected(64)) - 50.0) < 1e-9
    with pytest.raises(ValueError, match="measure more batches"):
        noise_scale_from_two_batches(8, 100.0, 64, 1.0)
