"""Rank-side checks for test_ddp_zero_ranks.py, run on every rank of one launch per world size.

``rank_checks`` trains with every data-parallel implementation through the package's own worker
(``mlsys_nb.parallel.harness.compare_implementations``, which notebooks 05-06 also launch) and adds
``count_probe``: each collective the byte counter wraps, run once on random sizes.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlsys_nb.comm.counting import CommCounter
from mlsys_nb.parallel.harness import IMPLEMENTATIONS, compare_implementations


def count_probe(sizes):
    """Run each wrapped collective once on random sizes; return what the counter saw and results."""
    rank, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for op, k in zip(("all_reduce", "reduce_scatter_single", "all_gather_single", "broadcast"), sizes):
        x = torch.arange(k * n, dtype=torch.float32) + rank
        with CommCounter() as cc:
            if op == "all_reduce":
                y = x.clone()
                dist.all_reduce(y)
                ok = torch.equal(y, n * torch.arange(k * n, dtype=torch.float32) + n * (n - 1) / 2)
            elif op == "reduce_scatter_single":
                y = torch.empty(k)
                dist.reduce_scatter_single(y, x)
                ok = torch.equal(y, n * torch.arange(rank * k, (rank + 1) * k, dtype=torch.float32) + n * (n - 1) / 2)
            elif op == "all_gather_single":
                y = torch.empty(k * n)
                dist.all_gather_single(y, torch.full((k,), float(rank)))
                ok = torch.equal(y, torch.arange(n, dtype=torch.float32).repeat_interleave(k))
            else:
                dist.broadcast(x, src=0)
                ok = True
        out[op] = dict(ok=ok, **cc.by_op()[op])
    # counters nest, and functions are restored afterwards
    with CommCounter() as outer:
        with CommCounter() as inner:
            dist.all_reduce(torch.ones(3))
        dist.all_reduce(torch.ones(5))
    out["nested"] = (outer.calls, inner.calls, dist.all_reduce is dist.distributed_c10d.all_reduce)
    return out


def rank_checks(sizes):
    """Rank function: every data-parallel implementation against single-process training, and the probe."""
    result = compare_implementations(impls=IMPLEMENTATIONS, optimizers=("adamw", "sgd-momentum"), steps=3)
    result["probe"] = count_probe(sizes)
    return result
