"""The launcher and the live cluster with ``backend="nccl"`` at world size 1 (NCCL refuses two ranks on
one GPU; multi-rank paths stay on gloo): ``device()`` is ``cuda:<local rank>`` and a collective runs on it."""

import time

import pytest
import torch

pytestmark = pytest.mark.gpu


def _job():
    """Nested in a factory so that cloudpickle sends it by value (the rank cannot import this module)."""

    def on_rank(scale):
        import torch
        import torch.distributed as dist

        from mlsys_nb import device

        dev = device()
        x = torch.full((4,), float(scale), device=dev)
        dist.all_reduce(x)
        return str(dev), dist.get_backend(), x.device.type, x.sum().item()

    return on_rank


def test_launch_nccl_world_size_1(record):
    from mlsys_nb import launch
    from mlsys_nb.runtime import resolve_backend

    assert resolve_backend("auto", 1) == "nccl"
    t0 = time.perf_counter()
    (got,) = launch(_job(), world_size=1, backend="nccl", args=(2.5,), timeout=120)
    record("launch(world_size=1, nccl) wall", time.perf_counter() - t0, "s", "start, one all_reduce, exit")
    assert got == ("cuda:0", "nccl", "cuda", 10.0)


def test_cluster_nccl_world_size_1(record):
    from mlsys_nb import Cluster

    t0 = time.perf_counter()
    with Cluster(1, backend="nccl", timeout=120) as c:
        assert c.backend == "nccl"
        (got,) = c.run(_job(), args=(1.5,))
        (again,) = c.run(_job(), args=(2.0,))
    record("Cluster(1, nccl): start, 2 runs, shutdown", time.perf_counter() - t0, "s")
    assert got == ("cuda:0", "nccl", "cuda", 6.0) and again == ("cuda:0", "nccl", "cuda", 8.0)


def test_nccl_refuses_more_ranks_than_gpus():
    from mlsys_nb.runtime import resolve_backend

    n = torch.cuda.device_count()
    with pytest.raises(ValueError, match="one CUDA device per rank"):
        resolve_backend("nccl", n + 1)
