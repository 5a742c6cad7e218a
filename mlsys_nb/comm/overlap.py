"""Does a non-blocking send overlap with independent work? A measurement between two ranks.

``overlap_timings`` (a rank function for ranks 0 and 1) times, as medians of ``repeats``:

- ``comm``: a blocking ``send`` (rank 0) / ``recv`` (rank 1) of ``payload_numel`` float32 elements;
- ``compute``: the independent work, a **CPU-free wait** of ``comm`` seconds (``time.sleep``): like a
  GPU kernel, it leaves the host's cores to gloo's I/O thread. (On 2 CPU cores a matmul would
  compete with that thread for the same cores and hide nothing: that is the machine, not the idea.)
- ``blocking``: ``send`` then compute: about ``comm + compute``;
- ``nonblocking``: ``isend``, compute, ``wait()``: about ``max(comm, compute)`` if the transfer
  proceeds while the rank waits.

``nonblocking=False`` replaces ``isend``/``irecv`` by their blocking twins (what a mistaken
"overlap" does): ``check_overlap`` must then fail; ``tests/test_overlap.py`` shows it does.
"""

from __future__ import annotations

import statistics
import time

OVERLAP_LIMIT = 0.8  # non-blocking <= 0.8 x blocking when compute ~ comm (perfect overlap: 0.5)


def overlap_timings(
    payload_numel: int = 8_000_000, repeats: int = 9, group=None, device=None, nonblocking: bool = True
) -> dict:
    """Rank function for ranks 0 (sender) and 1 (receiver) of ``group``: seconds (medians) of
    ``comm``, ``compute``, ``blocking`` and ``nonblocking``, ``ratio`` (median of nonblocking/blocking over
    the interleaved pairs) and the received payload's check (``payload_ok``)."""
    import torch
    import torch.distributed as dist

    rank = dist.get_rank()
    if rank not in (0, 1):
        raise ValueError(f"rank={rank}: overlap_timings runs on ranks 0 and 1")
    if payload_numel < 1 or repeats < 1:
        raise ValueError(f"payload_numel={payload_numel}, repeats={repeats}: both must be >= 1")
    peer = 1 - rank
    payload = torch.arange(payload_numel, dtype=torch.float32, device=device)
    inbox = torch.zeros(payload_numel, device=device)

    def transfer(block: bool):
        if rank == 0:
            return dist.send(payload, dst=peer, group=group) if block else dist.isend(payload, dst=peer, group=group)
        return dist.recv(inbox, src=peer, group=group) if block else dist.irecv(inbox, src=peer, group=group)

    def timed(fn):
        ts = []
        for _ in range(repeats):
            dist.barrier(group=group)
            t = time.perf_counter()
            fn()
            ts.append(time.perf_counter() - t)
        return statistics.median(ts)

    transfer(True)  # warm-up: opens the pair's connection
    t_comm = torch.tensor([timed(lambda: transfer(True))], dtype=torch.float64)
    dist.broadcast(t_comm, src=0, group=group)  # both ranks wait the same time
    wait_s = float(t_comm.item())

    def compute():
        time.sleep(wait_s)  # independent work that leaves the CPU free

    def blocking():
        transfer(True)
        compute()

    def overlapped():
        work = transfer(block=not nonblocking)  # blocking calls return no work handle
        compute()  # independent work while the bytes travel
        if nonblocking:
            work.wait()

    # interleave the variants so drift on a shared machine hits both alike
    blocking_t, overlapped_t = [], []
    for _ in range(repeats):
        blocking_t.append(_once(blocking, group))
        overlapped_t.append(_once(overlapped, group))
    ok = rank == 0 or bool(torch.equal(inbox.cpu(), torch.arange(payload_numel, dtype=torch.float32)))
    return dict(
        comm=wait_s,
        compute=timed(compute),
        blocking=statistics.median(blocking_t),
        nonblocking=statistics.median(overlapped_t),
        ratio=statistics.median(o / b for o, b in zip(overlapped_t, blocking_t)),
        payload_ok=ok,
    )


def _once(fn, group) -> float:
    import torch.distributed as dist

    dist.barrier(group=group)
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def check_overlap(timings: dict, limit: float = OVERLAP_LIMIT) -> float:
    """Raise ``AssertionError`` unless ``nonblocking <= limit x blocking`` (one rank's timings: the
    median over repeats of each interleaved pair's ratio, so drift between pairs cancels); return it."""
    ratio = timings["ratio"]
    assert ratio <= limit, (
        f"non-blocking took {ratio:.2f}x the blocking variant (limit {limit}): "
        "the transfer did not proceed during the independent work"
    )
    return ratio
