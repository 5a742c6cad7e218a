"""Peak memory while code runs, measured: the kit's three meters, in one place.

- ``LiveBytes`` (a ``TorchDispatchMode``): the distinct tensor storages created inside a block and still
  alive, followed through the dispatcher with weak references; ``peak`` and ``now`` in bytes. One process,
  CPU or GPU; it sees tensors, not the allocator (a fused kernel's internal scratch is invisible).
  Notebook 09 measures what ring attention holds with it (``parallel.context`` re-exports it).
- ``MemoryPeak``: the allocator's events from ``torch.profiler(profile_memory=True)``, read by
  ``runtime.profiling.memory_timeline``: ``peak_bytes`` above the level at entry and ``net_bytes`` still
  held at exit; it also sees buffers that gloo's thread frees (``rl.weight_sync`` re-exports it, notebook 19).
- ``peak_forward_bytes(fn, *args)``: ``MemoryPeak`` around one ``fn(*args)`` under ``torch.no_grad``
  (``kernels.io`` re-exports it, notebook 21).

``models.measure`` counts something else: the tensors saved for backward and the states held, by owner.
"""

from __future__ import annotations

import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .profiling import memory_timeline

__all__ = ["LiveBytes", "MemoryPeak", "peak_forward_bytes"]


class LiveBytes(TorchDispatchMode):
    """Measure the memory a block of code really holds: ``with LiveBytes() as lb: ...``, then
    ``lb.peak`` (bytes) is the largest sum, at any moment, of the distinct tensor storages created
    inside the block that were still alive; ``lb.now`` what is still alive at the end.

    Every operation passes through PyTorch's dispatcher, so every tensor it returns is seen; each
    storage is counted once (views share it) and followed with a weak reference until its memory
    is freed. Not seen: tensors created before the block (the inputs), and scratch space a fused
    kernel allocates and frees internally. Works on CPU and GPU; ``tracemalloc`` cannot do this
    (it does not see torch's allocator)."""

    def __init__(self):
        super().__init__()
        self._live: dict[int, int] = {}
        self.now = 0
        self.peak = 0

    def _freed(self, key):
        self.now -= self._live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                st = t.untyped_storage()
                key, nbytes = id(st), st.nbytes()
                if nbytes and key not in self._live:
                    self._live[key] = nbytes
                    self.now += nbytes
                    self.peak = max(self.peak, self.now)
                    weakref.finalize(st, self._freed, key)
        return out


class MemoryPeak:
    """Measure the memory a block of code allocates: ``with MemoryPeak() as m: ...`` then ``m.peak_bytes``
    (the high-water mark, bytes above the level at entry) and ``m.net_bytes`` (still held at exit).

    Measured, not counted by the code under test: ``torch.profiler.profile(profile_memory=True)`` records
    every allocation and free of torch's CPU allocator made on this thread, each with its size and time
    (``tracemalloc`` does not see that allocator); the running sum of those, in time order, is the bytes
    held above the start (``runtime.profiling.memory_timeline`` of the finished profiler, read in memory).
    Temporaries of a collective (gloo's staging buffers) are included. The first use in a process starts
    the profiler (1-2 s of CPU); after that the overhead is microseconds per op."""

    def __enter__(self) -> MemoryPeak:
        from torch.profiler import ProfilerActivity, profile

        self._prof = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._prof.__exit__(*exc)
        timeline = memory_timeline(self._prof)  # CPU allocations and frees in time order, running sum
        self.peak_bytes = max([0] + [b for _, b in timeline])
        self.net_bytes = timeline[-1][1] if timeline else 0
        self.n_events = len(timeline)


def peak_forward_bytes(fn, *args, **kwargs) -> int:
    """Peak bytes allocated (above what was live before) while ``fn(*args, **kwargs)`` runs under
    ``torch.no_grad``: ``MemoryPeak``'s high-water mark, the CPU memory timeline of a ``torch.profiler``
    trace (``profile_memory=True``)."""
    with torch.no_grad(), MemoryPeak() as m:
        fn(*args, **kwargs)
    return m.peak_bytes
