"""Communication: collectives written from point-to-point, their α-β cost, byte counting, plots.

- ``collectives``: ring / tree / recursive-doubling / pairwise collectives built from
  ``send``/``recv`` (``CountingComm`` counts what each rank sends), checked against torch's own
  (``verify_against_torch``) and against their definitions (``check_semantics``); ``ring_steps`` is the
  plain ring loop, ``pipelined_ring_steps`` the same steps cut into pieces (what the ring functions run).
- ``cost`` (its names are re-exported here, e.g. ``mlsys_nb.comm.ring_bytes_sent``): closed-form
  bytes per rank, α-β time models (``AlphaBeta``, ``collective_time``, ``cost_coefficients``),
  ``algbw``/``busbw``, ``fit_alpha_beta``, ``crossover_bytes``.
- ``measure`` (its names are re-exported here too): the measured ``sweep`` on real ranks and
  ``memcpy_bandwidth`` (``MemcpyBandwidth``).
- ``counting``: ``CommCounter`` wraps ``torch.distributed`` to count each op's payload and the
  bytes a rank sends (``bytes_sent``) under the ring algorithm, from ``cost``'s formulas.
- ``wire``: ``WireCounter`` reads what this rank's TCP sockets really sent and received (Linux
  ``TCP_INFO``), so the model bytes above can be shown beside a measurement; ``gloo_bytes_sent``
  (in ``cost``) gives what gloo's own algorithms send, which is not always the ring;
  ``framing_per_message`` measures gloo's per-message overhead and ``counting.gloo_bytes_from_ops``
  prices a ``CommCounter``'s calls the way gloo sends them.
- ``plots``: who holds what before/after each collective, ring schedule, time and busbw vs size.
- ``pingpong``: fit α, β on point-to-point exchanges (γ on a local add, δ on the all-gather's copy) at 2 ranks, predict
  collectives at larger sizes from their step counts, and notebook 04's claims (what 2 ranks can tell apart: S vs
  2S per rank; the all-gather's missing local work), re-measured up to 3 times on a shared machine.
- ``shm``: ``ShmAllReduce``, an all-reduce over POSIX shared memory among the ranks of one machine (a
  reduce-scatter then an all-gather through every rank's shared buffer, synchronised by sequence-number flags
  or, for comparison, a barrier), equal to ``dist.all_reduce``; the kit's DDP buckets
  (``DataParallel(all_reduce="shm")``) and tensor parallelism (``parallel.functional.set_all_reduce``) can use it.
- ``overlap``: blocking vs non-blocking send around a CPU-free wait (a blocking control interleaved;
  ``measure_variants``), and the check that the non-blocking one overlaps (``check_overlap``), re-measured up
  to 3 times (notebook 02).

The cost functions are light (numpy only); ``collectives``, ``counting``, ``shm`` (torch), ``measure`` (timers and
the launcher) and ``plots`` (matplotlib) load when first used.
"""

from .cost import (
    ALGORITHMS,
    OPS,
    AlphaBeta,
    AlphaBetaFit,
    algbw,
    busbw,
    busbw_factor,
    bytes_sent_per_rank,
    collective_time,
    gloo_bytes_sent,
    cost_coefficients,
    crossover_bytes,
    fit_alpha_beta,
    recursive_doubling_bytes_sent,
    ring_bytes_sent,
    tree_bytes_sent,
)

__all__ = [
    "OPS",
    "ALGORITHMS",
    "AlphaBeta",
    "AlphaBetaFit",
    "MemcpyBandwidth",
    "algbw",
    "busbw",
    "busbw_factor",
    "bytes_sent_per_rank",
    "collective_time",
    "cost_coefficients",
    "crossover_bytes",
    "fit_alpha_beta",
    "gloo_bytes_sent",
    "memcpy_bandwidth",
    "recursive_doubling_bytes_sent",
    "ring_bytes_sent",
    "sweep",
    "tree_bytes_sent",
    "CommCounter",
    "ShmAllReduce",
]


def __getattr__(name):  # torch, and the timers and launcher of the measurements, load on first use
    if name == "CommCounter":
        from .counting import CommCounter

        return CommCounter
    if name == "ShmAllReduce":
        from .shm import ShmAllReduce

        return ShmAllReduce
    if name in ("MemcpyBandwidth", "memcpy_bandwidth", "sweep"):
        from . import measure

        return getattr(measure, name)
    raise AttributeError(f"module 'mlsys_nb.comm' has no attribute {name!r}")
