"""Module-level rank functions for the launcher tests (torchrun can only import, not unpickle)."""

import os

import torch
import torch.distributed as dist


def rank_report(scale=1.0):
    """(rank, world size, local rank, all_reduce sum of scale * rank**2, intra-op threads)."""
    x = torch.tensor([scale * dist.get_rank() ** 2])
    dist.all_reduce(x)
    return (dist.get_rank(), dist.get_world_size(), int(os.environ["LOCAL_RANK"]), x.item(), torch.get_num_threads())


def all_reduce_one():
    """The benchmark job: one 1-element all_reduce; returns the sum of ranks."""
    x = torch.ones(1) * dist.get_rank()
    dist.all_reduce(x)
    return x.item()
