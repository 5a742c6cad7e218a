"""The differentiable collectives every parallel strategy is built from, in one file.

Each operator is an autograd function: its forward runs one collective over ``group`` and its
backward runs the *transpose* collective on the gradient (Shoeybi et al. 2019, arXiv:1909.08053;
Korthikanti et al. 2022, arXiv:2205.05198; Lepikhin et al. 2020, arXiv:2006.16668):

    operator                       forward                  backward                 used by
    copy_to(x)            (f)      identity                 all-reduce               tensor: entering a TP region
    reduce_from(x)        (g)      all-reduce               identity                 tensor: leaving a TP region
    gather_from(x, dim)            all-gather along dim     reduce-scatter along dim tensor (SP entry), context
    reduce_scatter_to(x, dim)      reduce-scatter along dim all-gather along dim     tensor (SP exit)
    gather_replicated(x, dim)      all-gather along dim     keep this rank's slice   tensor (gathered logits)
    all_to_all(x, in, out)         all-to-all (row splits)  all-to-all, splits       expert (dispatch, combine)
                                                            swapped

``f`` and ``g`` are each other's transpose, and so are ``gather_from`` and ``reduce_scatter_to``:
the gradient of an all-gather is a reduce-scatter because every rank's copy of the gathered tensor
feeds a different partial computation whose gradients must be summed. ``gather_replicated`` is for
an output every rank then uses identically (its gradient is the same on every rank, so each keeps
its slice). An all-to-all is its own transpose with the splits swapped.

The plain (not differentiable) collectives along a dimension, ``all_reduce``, ``all_gather`` and
``reduce_scatter``, are here too, for autograd functions that fuse communication with compute
(``tensor.GatherLinear``, the vocabulary-parallel cross-entropy, ring attention's neighbours).

All collectives are ``torch.distributed`` functions looked up at call time, so
``mlsys_nb.comm.counting.CommCounter`` sees (and counts the bytes of) every message.
``group=None`` means the world group. ``set_all_reduce(impl, group)`` makes every SUM all-reduce of that group
here (``f``'s backward, ``g``'s forward, the vocabulary-parallel cross-entropy's sums) call ``impl(x)``
instead, e.g. a ``mlsys_nb.comm.shm.ShmAllReduce`` (shared memory within one host; not counted by
``CommCounter``); ``set_all_reduce(None, group)`` restores ``dist.all_reduce``.
"""

from __future__ import annotations

import warnings

import torch
import torch.distributed as dist

__all__ = [
    "AllToAll",
    "CopyTo",
    "GatherFrom",
    "GatherReplicated",
    "ReduceFrom",
    "ReduceScatterTo",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "copy_to",
    "gather_from",
    "gather_replicated",
    "reduce_from",
    "reduce_scatter",
    "reduce_scatter_to",
    "set_all_reduce",
    "shard",
]

# torch 2.13 marks the *_tensor collectives deprecated in favour of *_single; the byte counter
# (mlsys_nb.comm.counting) and torch's own DTensor code still use these names.
warnings.filterwarnings(
    "ignore",
    message=r".*`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    category=FutureWarning,
)


# ---------------------------------------------------------------------------------------------
# Plain collectives along a dimension
# ---------------------------------------------------------------------------------------------
def shard(full: torch.Tensor, dim: int, rank: int, world: int) -> torch.Tensor:
    """Slice ``rank`` of ``world`` equal slices of ``full`` along ``dim`` (a view)."""
    if full.shape[dim] % world:
        raise ValueError(f"size {full.shape[dim]} of dim {dim} is not divisible by tp={world}")
    n = full.shape[dim] // world
    return full.narrow(dim, rank * n, n)


_ALL_REDUCE = {}  # group -> the in-place SUM all-reduce used instead of dist.all_reduce (set_all_reduce)


def set_all_reduce(impl, group=None):
    """Sum over ``group`` with ``impl(x)`` (in place, e.g. ``comm.shm.ShmAllReduce(group)``) in every
    ``all_reduce`` of this module; ``None`` restores ``dist.all_reduce``. Returns the previous ``impl``."""
    if impl is not None and not callable(impl):
        raise TypeError(f"impl={impl!r}: a callable summing a tensor in place over the group, or None")
    previous = _ALL_REDUCE.pop(group, None)
    if impl is not None:
        _ALL_REDUCE[group] = impl
    return previous


def all_reduce(x: torch.Tensor, group=None, op=dist.ReduceOp.SUM) -> torch.Tensor:
    """Reduce ``x`` over the ranks of ``group`` in place (``x`` made contiguous first); returns it."""
    x = x.contiguous()
    impl = _ALL_REDUCE.get(group)
    if impl is not None and op == dist.ReduceOp.SUM:
        impl(x)
    else:
        dist.all_reduce(x, op=op, group=group)
    return x


def all_gather(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Concatenate every rank's ``x`` along ``dim`` (the collective runs on a dim-0 layout)."""
    t = dist.get_world_size(group)
    x0 = x.movedim(dim, 0).contiguous()
    out = x0.new_empty((t * x0.shape[0],) + tuple(x0.shape[1:]))
    dist.all_gather_into_tensor(out, x0, group=group)
    return out.movedim(0, dim)


def reduce_scatter(x: torch.Tensor, dim: int, group=None) -> torch.Tensor:
    """Sum ``x`` over ranks and keep this rank's slice along ``dim``."""
    t = dist.get_world_size(group)
    if x.shape[dim] % t:
        raise ValueError(f"size {x.shape[dim]} of dim {dim} is not divisible by tp={t}")
    x0 = x.movedim(dim, 0).contiguous()
    out = x0.new_empty((x0.shape[0] // t,) + tuple(x0.shape[1:]))
    dist.reduce_scatter_tensor(out, x0, group=group)
    return out.movedim(0, dim)


# ---------------------------------------------------------------------------------------------
# The autograd functions: a collective in forward, its transpose in backward
# ---------------------------------------------------------------------------------------------
class CopyTo(torch.autograd.Function):
    """f: identity forward, all-reduce backward (each rank's input gradient is a partial sum)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, dy):
        return all_reduce(dy.clone(), ctx.group), None  # dy may be shared with other branches


class ReduceFrom(torch.autograd.Function):
    """g: all-reduce forward (sum the partial products), identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        return all_reduce(x.clone(), group)

    @staticmethod
    def backward(ctx, dy):
        return dy, None


class GatherFrom(torch.autograd.Function):
    """All-gather the shards along ``dim`` forward; reduce-scatter the gradient backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return all_gather(x, dim, group)

    @staticmethod
    def backward(ctx, dy):
        return reduce_scatter(dy, ctx.dim, ctx.group), None, None


class ReduceScatterTo(torch.autograd.Function):
    """Reduce-scatter along ``dim`` forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, dim, group):
        ctx.dim, ctx.group = dim, group
        return reduce_scatter(x, dim, group)

    @staticmethod
    def backward(ctx, dy):
        return all_gather(dy, ctx.dim, ctx.group), None, None


class GatherReplicated(GatherFrom):
    """``GatherFrom``'s all-gather along ``dim``, into an output every rank uses alike: backward keeps this
    rank's slice of the (identical) gradient."""

    @staticmethod
    def backward(ctx, dy):
        rank, world = dist.get_rank(ctx.group), dist.get_world_size(ctx.group)
        return shard(dy, ctx.dim, rank, world).contiguous(), None, None


class AllToAll(torch.autograd.Function):
    """Rows ``x[sum(in_splits[:j]) : ...]`` go to rank j; backward sends the gradients back the
    same way with the splits swapped (an all-to-all is its own transpose)."""

    @staticmethod
    def forward(ctx, x, in_splits, out_splits, group):
        ctx.in_splits, ctx.out_splits, ctx.group = in_splits, out_splits, group
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), out_splits, in_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, dy):
        dx = dy.new_empty((sum(ctx.in_splits),) + tuple(dy.shape[1:]))
        dist.all_to_all_single(dx, dy.contiguous(), ctx.in_splits, ctx.out_splits, group=ctx.group)
        return dx, None, None, None


def copy_to(x, group=None):
    """f: identity forward, all-reduce of the gradient backward."""
    return CopyTo.apply(x, group)


def reduce_from(x, group=None):
    """g: all-reduce forward, identity backward."""
    return ReduceFrom.apply(x, group)


def gather_from(x, dim: int, group=None):
    """All-gather along ``dim`` forward, reduce-scatter of the gradient backward."""
    return GatherFrom.apply(x, dim, group)


def reduce_scatter_to(x, dim: int, group=None):
    """Reduce-scatter along ``dim`` forward, all-gather of the gradient backward."""
    return ReduceScatterTo.apply(x, dim, group)


def gather_replicated(x, dim: int, group=None):
    """All-gather along ``dim`` forward; backward keeps this rank's slice of the gradient."""
    return GatherReplicated.apply(x, dim, group)


def all_to_all(x, in_splits: list[int], out_splits: list[int], group=None):
    """Rows of ``x`` split by ``in_splits`` go to ranks 0, 1, ...; returns ``sum(out_splits)`` rows
    received (differentiable: the backward sends the gradients back with the splits swapped)."""
    return AllToAll.apply(x, in_splits, out_splits, group)
