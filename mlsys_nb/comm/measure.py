"""Communication measured: the copy bandwidth of this process and collectives timed on real ranks.

- ``memcpy_bandwidth(nbytes, repeats)``: ``dst.copy_(src)`` timed (``MemcpyBandwidth``: median and quartiles,
  bytes/s), the physical ceiling for moving bytes between ranks on one machine.
- ``sweep(ops, sizes, world_sizes, impls)``: every (collective, implementation, size) timed on real ranks, one
  ``mlsys_nb.launch`` per world size (``torch.distributed``'s own and the from-scratch algorithms of
  ``collectives``, see ``IMPLEMENTATIONS``; ``shm`` / ``shm_barrier``: ``comm.shm.ShmAllReduce`` with flags /
  barriers, CPU ranks of one host); a DataFrame with algbw and busbw from ``cost``.

Both are re-exported by ``mlsys_nb.comm`` (``comm.sweep``, ``comm.memcpy_bandwidth``; notebook 04). Seconds come
from ``runtime.timing``; ``cost`` holds the closed forms they are compared with.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import check_int
from ..runtime.timing import Timer, lower_quartile, median, repeat
from .cost import algbw, busbw

__all__ = ["MemcpyBandwidth", "memcpy_bandwidth", "IMPLEMENTATIONS", "sweep"]


@dataclass(frozen=True)
class MemcpyBandwidth:
    """Copy bandwidth ``nbytes / t`` (bytes/s; each byte is read once and written once)."""

    nbytes: int
    median_bytes_per_s: float
    q25_bytes_per_s: float
    q75_bytes_per_s: float
    repeats: int


def memcpy_bandwidth(
    nbytes: int = 64 << 20, repeats: int = 9, warmup: int = 2, device=None, threads: int | None = None
) -> MemcpyBandwidth:
    """Measure ``dst.copy_(src)`` into a preallocated tensor of ``nbytes`` bytes (median of
    ``repeats``). This is the physical ceiling for moving bytes between ranks on one machine:
    every shared-memory or loopback transfer is at least one such copy. ``threads``: torch's intra-op
    threads for the copy (None: as they are). On a busy machine a copy split over all threads waits for
    the slowest, which another process may have descheduled; one thread measures what one rank's copy does."""
    import torch

    check_int("nbytes", nbytes, 1)
    check_int("repeats", repeats, 1)
    if threads is not None:
        check_int("threads", threads, 1)
    device = torch.device(device) if device is not None else torch.device("cpu")
    src = torch.ones(nbytes // 4 or 1, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    size = src.numel() * 4
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def copy():
        dst.copy_(src)
        sync()

    before = torch.get_num_threads()
    torch.set_num_threads(threads or before)
    try:
        sync()  # nothing queued before the first copy; each copy ends synchronized
        bw = size / np.asarray(repeat(copy, repeats, warmup))
    finally:
        torch.set_num_threads(before)
    return MemcpyBandwidth(size, median(bw), lower_quartile(bw), float(np.percentile(bw, 75)), repeats)


IMPLEMENTATIONS = {
    "all_reduce": ("torch", "ring", "tree", "recursive_doubling", "shm", "shm_barrier"),
    "all_gather": ("torch", "ring"),
    "reduce_scatter": ("torch", "ring"),
    "all_to_all": ("torch", "pairwise"),
    "broadcast": ("torch", "tree"),
}


def _make_call(op, impl, nbytes, n, device, dtype, comm, shm=None):
    """A zero-argument callable doing one collective of ``nbytes`` (nccl-tests' S) and the bytes
    actually used (rounded to whole elements divisible by n where the op needs it). ``shm``: a dict in which
    the shared-memory all-reduces are made once per sweep (a collective call: every rank makes the same)."""
    import torch
    import torch.distributed as dist

    from . import collectives as C

    # torch 2.13 renamed the *_tensor forms to *_single (the old names warn)
    _all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    _reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    esize = torch.empty((), dtype=dtype).element_size()
    numel = max(1, int(nbytes) // esize)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        numel = max(n, numel - numel % n)
    x = torch.zeros(numel, dtype=dtype, device=device)
    if op == "all_reduce":
        fns = {
            "torch": lambda: dist.all_reduce(x),
            "ring": lambda: C.ring_all_reduce(x, comm),
            "tree": lambda: C.tree_all_reduce(x, comm),
            "recursive_doubling": lambda: C.recursive_doubling_all_reduce(x, comm),
        }
        if impl in ("shm", "shm_barrier") and shm is not None:
            from .shm import ShmAllReduce

            sync = "flags" if impl == "shm" else "barrier"
            reduce = shm[impl] = shm.get(impl) or ShmAllReduce(sync=sync)
            fns[impl] = lambda: reduce(x)
    elif op == "all_gather":
        inp = torch.zeros(numel // n, dtype=dtype, device=device)
        fns = {"torch": lambda: _all_gather_single(x, inp), "ring": lambda: C.ring_all_gather(inp, comm)}
    elif op == "reduce_scatter":
        out = torch.empty(numel // n, dtype=dtype, device=device)
        fns = {"torch": lambda: _reduce_scatter_single(out, x), "ring": lambda: C.ring_reduce_scatter(x, comm)}
    elif op == "all_to_all":
        out = torch.empty_like(x)
        fns = {"torch": lambda: dist.all_to_all_single(out, x), "pairwise": lambda: C.pairwise_all_to_all(x, comm)}
    elif op == "broadcast":
        fns = {"torch": lambda: dist.broadcast(x, 0), "tree": lambda: C.tree_broadcast(x, comm)}
    else:
        raise ValueError(f"op={op!r} cannot be swept: choose one of {list(IMPLEMENTATIONS)}")
    if impl not in fns:
        raise ValueError(f"impl={impl!r} is not available for {op}: choose one of {list(fns)}")
    return fns[impl], numel * esize


def _sweep_worker(cases, warmup: int, repeats: int, dtype_name: str):
    """Runs on every rank: times each (op, impl, nbytes) case, ``warmup`` untimed calls first, then
    ``repeats`` rounds that visit every case once (interleaved, so noise from other processes is
    shared fairly). A barrier precedes every timed call (never inside it); on CUDA the clock is
    read after a synchronize."""
    import torch
    import torch.distributed as dist

    from ..config import torch_dtype
    from ..runtime.ranks import device as _device
    from . import collectives as C

    dev = _device()
    dtype = torch_dtype(dtype_name)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    comm = C.CountingComm(count=False)
    n = dist.get_world_size()
    shm = {}  # the shared-memory all-reduces, made on first use and closed at the end
    calls = [_make_call(op, impl, nbytes, n, dev, dtype, comm, shm) for op, impl, nbytes in cases]
    for fn, _ in calls:
        for _ in range(warmup):
            fn()
    times = [[] for _ in cases]
    for _ in range(repeats):  # round-robin over the cases: background noise hits them all alike
        for i, (fn, _) in enumerate(calls):
            dist.barrier()
            sync()
            with Timer() as t:
                fn()
                sync()
            times[i].append(t.seconds)
    for reduce in shm.values():
        reduce.close()
    return [(op, impl, int(nbytes), used, t) for (op, impl, nbytes), (_, used), t in zip(cases, calls, times)]


def sweep(
    ops=("all_reduce",),
    sizes=(1 << 10, 1 << 16, 1 << 20),
    world_sizes=(2, 4),
    impls=("torch",),
    backend: str = "auto",
    warmup: int = 2,
    repeats: int = 5,
    dtype="fp32",
    timeout: float = 120.0,
    progress: bool = True,
):
    """Benchmark collectives on real ranks: one ``mlsys_nb.launch`` per world size.

    ``sizes`` are nccl-tests' S in bytes; ``impls`` picks ``"torch"`` (``torch.distributed``'s
    own) and/or the from-scratch algorithms (see ``IMPLEMENTATIONS``; pairs that do not exist are
    skipped), either for every op or per op as a dict ``{op: impls}``. The time of one call is the
    slowest rank's (per iteration), summarised over ``repeats`` by median and quartiles. Returns a
    DataFrame with columns ``op, impl, backend, world_size, bytes, median_s, q25_s, q75_s, min_s,
    algbw_Bps, busbw_Bps, repeats``.
    ``dtype``: element type of the buffers, a name of ``mlsys_nb.config.DTYPE_BYTES`` or a
    ``torch.dtype``.
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ..config import dtype_name, torch_dtype
    from ..runtime.launcher import launch, resolve_backend

    dtype = dtype_name(dtype)
    torch_dtype(dtype)  # a name without a torch tensor type (int4) is refused before any rank starts
    for op in ops:
        if op not in IMPLEMENTATIONS:
            raise ValueError(f"op={op!r} cannot be swept: choose one of {list(IMPLEMENTATIONS)}")
    check_int("warmup", warmup, 0)
    check_int("repeats", repeats, 1)

    per_op = impls if isinstance(impls, dict) else {op: impls for op in ops}
    cases = [
        (op, impl, int(s)) for op in ops for impl in per_op.get(op, ()) if impl in IMPLEMENTATIONS[op] for s in sizes
    ]
    if not cases:
        raise ValueError(f"no (op, impl) pair to run among ops={ops}, impls={impls}")
    rows = []
    for ws in tqdm(list(world_sizes), desc="world sizes", disable=not progress):
        be = resolve_backend(backend, ws)
        per_rank = launch(_sweep_worker, ws, args=(cases, warmup, repeats, dtype), backend=backend, timeout=timeout)
        for i, (op, impl, _, used, _) in enumerate(per_rank[0]):
            t = np.max(np.array([r[i][4] for r in per_rank]), axis=0)  # slowest rank per iteration
            med = float(np.median(t))
            rows.append(
                dict(
                    op=op,
                    impl=impl,
                    backend=be,
                    world_size=ws,
                    bytes=used,
                    median_s=med,
                    q25_s=float(np.percentile(t, 25)),
                    q75_s=float(np.percentile(t, 75)),
                    min_s=float(t.min()),
                    algbw_Bps=algbw(used, med),
                    busbw_Bps=busbw(op, used, med, ws),
                    repeats=repeats,
                )
            )
    return pd.DataFrame(rows)
