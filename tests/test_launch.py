"""mlsys_nb.launch: real ranks from a function, and each failure behaviour of issue 2."""
import importlib
import threading

import pytest
import torch
import torch.distributed as dist

import mlsys_nb
from mlsys_nb.launch import RankError, RankTimeoutError, launch, resolve_backend

launch_module = importlib.import_module("mlsys_nb.launch")  # mlsys_nb.launch is the function


# ---------------------------------------------------------------- bad arguments, no processes
@pytest.fixture
def no_process_may_start(monkeypatch):
    def refuse(*a, **k):
        raise AssertionError("a rank process was started despite invalid arguments")

    monkeypatch.setattr(launch_module, "_start_rank", refuse)


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(world_size=0), ValueError, ["world_size", ">= 1"]),
        (dict(world_size=2.0), ValueError, ["world_size"]),
        (dict(backend="mpi"), ValueError, ["backend", "gloo", "nccl", "auto"]),
        (dict(backend="nccl"), ValueError, ["nccl", "device_count"]),
        (dict(timeout=0), ValueError, ["timeout", "> 0"]),
        (dict(threads=0), ValueError, ["threads", ">= 1"]),
        (dict(output="loud"), ValueError, ["output", "stream"]),
        (dict(args=(threading.Lock(),)), TypeError, ["args", "pickle"]),
        (dict(kwargs={"f": (x for x in [1])}), TypeError, ["kwargs", "pickle"]),
    ],
)
def test_bad_arguments_raise_before_any_process_starts(no_process_may_start, kwargs, error, words):
    if kwargs.get("backend") == "nccl" and torch.cuda.device_count() >= 2:
        pytest.skip("this machine has enough GPUs for NCCL")  # never on the CPU CI machine
    kwargs.setdefault("world_size", 2)
    with pytest.raises(error) as info:
        launch(lambda: 0, **kwargs)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


def test_resolve_backend_on_this_machine():
    n = torch.cuda.device_count()
    assert resolve_backend("auto", 1) == ("nccl" if n >= 1 else "gloo")
    assert resolve_backend("auto", n + 1) == "gloo"
    assert resolve_backend("gloo", 8) == "gloo"
    with pytest.raises(ValueError, match="world_size"):
        resolve_backend("gloo", -1)


def test_device_outside_a_group_is_cpu():
    assert mlsys_nb.device() == torch.device("cpu")


# ---------------------------------------------------------------- happy path on real ranks
@pytest.mark.slow
def test_closure_and_lambda_run_on_every_rank_and_results_come_back_by_rank():
    offset = 7.0  # captured by the closure: travels by value with cloudpickle

    def work(scale):
        x = torch.tensor([float(dist.get_rank() + 1)]) * scale + offset
        dist.all_reduce(x)
        return dist.get_rank(), dist.get_world_size(), x.item(), str(mlsys_nb.device()), torch.get_num_threads()

    world = 3
    results = launch(work, world, args=(2.0,), output="quiet")
    expected_sum = sum((r + 1) * 2.0 + offset for r in range(world))  # closed form of the all_reduce
    assert results == [(r, world, expected_sum, "cpu", 1) for r in range(world)]
    assert launch(lambda: dist.get_rank() ** 2, 2, output="quiet") == [0, 1]
