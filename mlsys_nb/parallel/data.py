"""Per-rank data and the batch-size recipe, as closed forms (no torch: a calculator).

- ``shard_indices(order, world, rank, drop_last)``: the sample indices rank ``rank`` of ``world`` reads from
  one epoch's order, by ``torch.utils.data.DistributedSampler``'s rule: pad the order with its own first
  indices up to a multiple of ``world`` (or, with ``drop_last``, cut it down to one), then take every
  ``world``-th index starting at ``rank``. ``samples_per_rank(n, world, drop_last)``: ⌈N/W⌉ (⌊N/W⌋).
- ``sampler_problems(epochs, n, drop_last)``: what is wrong with the shards a sampler gave the ranks over
  several epochs (sizes, overlap beyond padding, samples missing, an epoch that repeats the previous
  one's order: the sampler whose ``set_epoch`` nobody called). Empty when all is well.
- ``BatchRecipe`` / ``decompose_batch(global_batch, dp, micro_batch, seq_len)``: global batch = DP ×
  gradient accumulation × micro-batch (sequences), and its tokens.
- ``critical_batch_tradeoff(batch, noise_scale)`` and ``noise_scale_from_two_batches(...)``: McCandlish et
  al. 2018's model of the critical batch size (arXiv:1812.06162): S/S_min = 1 + B_noise/B steps and
  E/E_min = 1 + B/B_noise examples, so (S/S_min − 1)(E/E_min − 1) = 1; B_crit ≈ B_noise = tr(Σ)/|G|².
  A model, not a law: it holds for SGD near a point where the gradient's noise dominates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ArgumentError, check_int, check_number


def samples_per_rank(n: int, world: int, drop_last: bool = False) -> int:
    """Samples each of ``world`` ranks reads per epoch from ``n`` samples: ⌈n/world⌉ (the last shards
    padded with repeated samples), or ⌊n/world⌋ with ``drop_last`` (the tail dropped)."""
    n, world = check_int("n", n, 1), check_int("world", world, 1)
    return n // world if drop_last else -(-n // world)


def shard_indices(order, world: int, rank: int, drop_last: bool = False) -> list[int]:
    """The indices rank ``rank`` (0..world−1) reads from one epoch's ``order`` (a permutation of the
    dataset's indices, the same on every rank), by ``DistributedSampler``'s rule: ``order`` padded with
    its own first indices to ``world·⌈N/W⌉`` (or cut to ``world·⌊N/W⌋`` with ``drop_last``), then every
    ``world``-th index from position ``rank``."""
    order = list(order)
    world = check_int("world", world, 1)
    rank = check_int("rank", rank, 0, world - 1)
    total = world * samples_per_rank(len(order), world, drop_last)
    padded = (order * math.ceil(total / len(order)))[:total]  # the first indices again, as often as needed
    return padded[rank:total:world]


def sampler_problems(epochs, n: int, drop_last: bool = False) -> list[str]:
    """What is wrong with the shards a distributed sampler gave: ``epochs[e][r]`` is the list of sample
    indices rank ``r`` read in epoch ``e`` from a dataset of ``n`` samples. Checked: every rank reads
    ``samples_per_rank(n, W, drop_last)`` samples; the shards overlap only by the padding (W·⌈N/W⌉ − N
    repeats) and miss nothing (with ``drop_last``: no overlap, N − W·⌊N/W⌋ samples left out); each
    epoch's order differs from the previous epoch's. Returns one sentence per problem, [] when none."""
    n = check_int("n", n, 1)
    problems = []
    for e, shards in enumerate(epochs):
        world = len(shards)
        want = samples_per_rank(n, world, drop_last)
        if any(len(s) != want for s in shards):
            problems.append(f"epoch {e}: shard sizes {[len(s) for s in shards]}, expected {want} each")
        seen = [i for s in shards for i in s]
        repeats, missing = len(seen) - len(set(seen)), n - len(set(seen))
        padding = 0 if drop_last else world * want - n
        if repeats != padding:
            problems.append(f"epoch {e}: {repeats} samples read twice, expected {padding} (the padding)")
        if missing != (n - world * want if drop_last else 0):
            problems.append(f"epoch {e}: {missing} samples read by no rank")
        if e and [list(s) for s in shards] == [list(s) for s in epochs[e - 1]]:
            problems.append(f"epoch {e}: the same order as epoch {e - 1} (was set_epoch called?)")
    return problems


@dataclass(frozen=True)
class BatchRecipe:
    """A global batch split over data-parallel ranks, accumulation steps and micro-batches: sequences
    per optimizer step ``global_batch = dp · accumulation · micro_batch``; ``tokens`` = global_batch ·
    seq_len."""

    dp: int  # data-parallel ranks (replicas)
    accumulation: int  # micro-batches each rank runs per optimizer step (pipeline micro-batches too)
    micro_batch: int  # sequences per micro-batch
    seq_len: int = 1  # tokens per sequence

    @property
    def global_batch(self) -> int:
        """Sequences per optimizer step."""
        return self.dp * self.accumulation * self.micro_batch

    @property
    def per_rank(self) -> int:
        """Sequences each data-parallel rank processes per optimizer step."""
        return self.accumulation * self.micro_batch

    @property
    def tokens(self) -> int:
        """Tokens per optimizer step."""
        return self.global_batch * self.seq_len


def decompose_batch(global_batch: int, dp: int, micro_batch: int = 1, seq_len: int = 1) -> BatchRecipe:
    """The recipe that gives ``global_batch`` sequences per step on ``dp`` ranks with micro-batches of
    ``micro_batch`` sequences: accumulation = global_batch / (dp · micro_batch), which must be a whole
    number (an ``ArgumentError`` naming ``global_batch`` otherwise)."""
    global_batch = check_int("global_batch", global_batch, 1)
    dp, micro_batch = check_int("dp", dp, 1), check_int("micro_batch", micro_batch, 1)
    if global_batch % (dp * micro_batch):
        raise ArgumentError(
            f"global_batch must be a multiple of dp x micro_batch = {dp} x {micro_batch} = {dp * micro_batch}, "
            f"got {global_batch}"
        )
    return BatchRecipe(dp, global_batch // (dp * micro_batch), micro_batch, check_int("seq_len", seq_len, 1))


def critical_batch_tradeoff(batch: float, noise_scale: float) -> tuple[float, float]:
    """McCandlish et al. 2018's model (arXiv:1812.06162): training to a given loss at batch size
    ``batch`` takes S/S_min = 1 + B_noise/B optimizer steps and E/E_min = 1 + B/B_noise examples, relative
    to the fewest possible (S_min at a huge batch, E_min at a tiny one). ``noise_scale``: B_noise, in the
    same unit as ``batch`` (examples or tokens). Returns (S/S_min, E/E_min); both are 2 at B = B_noise,
    the critical batch size."""
    b = check_number("batch", batch, 0, lo_open=True)
    bn = check_number("noise_scale", noise_scale, 0, lo_open=True)
    return 1 + bn / b, 1 + b / bn


def noise_scale_from_two_batches(b_small: float, g2_small: float, b_big: float, g2_big: float) -> float:
    """B_simple = tr(Σ)/|G|² from the squared norms of gradients measured at two batch sizes
    (McCandlish et al. 2018, arXiv:1812.06162, its unbiased estimate from two batch sizes): E|G_B|² = |G|² + tr(Σ)/B, so
    |G|² = (B_big·g2_big − B_small·g2_small)/(B_big − B_small) and tr(Σ) = (g2_small − g2_big)/(1/B_small −
    1/B_big). Batch sizes in examples; the result in examples."""
    b_small = check_number("b_small", b_small, 0, lo_open=True)
    b_big = check_number("b_big", b_big, b_small, lo_open=True)
    g2 = (b_big * g2_big - b_small * g2_small) / (b_big - b_small)
    trace = (g2_small - g2_big) / (1 / b_small - 1 / b_big)
    if g2 <= 0:
        raise ValueError(f"the estimated |G|^2 is {g2:.3g} <= 0: measure more batches (noise dominates)")
    return trace / g2
