"""Rank-side workers for test_mesh.py: ``mlsys_nb.parallel.mesh.train_worker`` with and without
the data-parallel gradient sync, in one launch.

Breaking the idea on purpose happens here, on the test side: the sync is taken out by replacing
``mlsys_nb.parallel.ddp.DataParallel`` with the bare model and ``allreduce_gradients`` with nothing
for the second set of cases (the mesh code looks both up at call time), so the replicas never
synchronise and the comparison with single-process training must fail.
"""

from __future__ import annotations


def train_with_and_without_dp_sync(cases, unsynced, steps=3, lr=0.1, seed=0):
    """Rank function: ``(train_worker(cases), train_worker(unsynced) with no dp gradient sync)``."""
    from mlsys_nb.parallel import ddp, mesh

    synced = mesh.train_worker(cases, steps, lr, seed)
    orig = ddp.DataParallel, ddp.allreduce_gradients
    ddp.DataParallel = lambda model, **kwargs: model  # each replica keeps its own gradients
    ddp.allreduce_gradients = lambda *args, **kwargs: None
    try:
        broken = mesh.train_worker(unsynced, steps, lr, seed)
    finally:
        ddp.DataParallel, ddp.allreduce_gradients = orig
    return synced, broken
