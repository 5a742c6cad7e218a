"""Runtime: real ``torch.distributed`` ranks from a notebook, and everything around them.

- ``launch(fn, world_size=4, ...)`` (``launcher``): run ``fn`` on fresh ranks, results by rank;
  ``prestart()`` starts the rank factory early. Also ``mlsys_nb.launch``.
- ``Cluster(world_size, ...)`` (``cluster``): live ranks kept across cells, ``%%ranks`` cell
  magic (``%load_ext mlsys_nb``), ``current()``.
- ``ranks``: the rank runtime both share: ``run_on_rank``, ``device()``, ``resolve_backend``,
  the forkserver ``context()``, the 127.0.0.1 rendezvous store, and the one error family
  ``RankError`` / ``RankTimeoutError`` (a ``RankError`` and a ``TimeoutError``).
- ``torchrun``: the entry point of ``python -m mlsys_nb.run`` / ``mlsys-nb-run``.
- ``machine``: a one-line description of this machine for benchmark records.
- ``timing``: the one way to time things: ``Timer`` (wall seconds, ``time.perf_counter``; a context
  manager or decorator), ``Laps`` (seconds of consecutive phases), ``repeat(fn, n, warmup)`` (list of
  seconds), ``median`` / ``lower_quartile`` / ``quantile`` of repeats, and ``profile_ops(fn)`` (self CPU seconds per
  op from ``torch.profiler``); ``ATTEMPTS``: how many times a timed check measures again on a busy machine.
- ``profiling``: a ``torch.profiler`` trace read back (``load_trace``, ``spans``, ``mm_flops``), the
  overlap fraction of communication with compute (pure interval arithmetic: ``overlap_fraction``,
  ``overlapped_all_reduces``, the bound ``OVERLAP_BOUND``; ``activities`` for a device) and the memory timeline
  of a step (``memory_timeline``, ``live_at``, ``peak_in``);
  ``light_profile`` (a CPU profiler whose first start skips the compiler's imports), ``trace_range`` /
  ``ranged`` (a ``record_function`` range only while a profiler records: the engine's ``engine.step`` and
  ``engine.model``), and ``inner_time`` / ``host_time_mismatch`` / ``most_agree`` (a step's host time
  from its trace against the engine's timers, notebook 15).
- ``peak_memory``: the kit's three peak-memory meters: ``LiveBytes`` (tensor storages alive, through the
  dispatcher), ``MemoryPeak`` (the allocator's events, via ``profiling.memory_timeline``) and
  ``peak_forward_bytes(fn, *args)`` (``MemoryPeak`` around one call); re-exported where notebooks read them
  (``parallel.context``, ``rl.weight_sync``, ``kernels``).
- ``ports``: ``free_port(host)`` (a free loopback TCP port) and ``wait_http_ok(url, timeout_s, proc)`` (the
  wait for a started server's 200, with a clear error when it times out or the process dies first).
- ``margins``: ``check_margin(label, value, op, bound)`` asserts a measured value against its bound and prints
  the room between them (``margin: ...``), ``parse_margins(text)`` reads those lines back
  (``benchmarks/portability.py``: the notebooks' checks over seeds and CPU capabilities).
- ``notebook``: ``check_parameters(globals(), world_size=range(2, 9), ...)``, the one parameter check of a notebook's
  first cell (it starts the rank factory when ``world_size`` is among them), and ``passed(label)``, which prints
  ``check passed: ...`` and records it (with ``check_margin``'s margins) for the notebook tests
  (``MLSYS_NB_CHECK_LOG``).
- ``gpu_record``: the GPU pack's record (``GpuRecord`` writes ``data/measured/gpu-<device>.json``
  figure by figure; ``lookup`` / ``gpu_cell`` read it back in the notebooks' GPU cells).

Thread count: every entry point takes ``threads=`` (intra-op threads per rank, default 1).
"""

from .ranks import BACKENDS, RankError, RankFailure, RankTimeoutError, device, prestart, resolve_backend
from .margins import check_margin, parse_margins
from .notebook import check_parameters, passed
from .timing import Laps, Timer, lower_quartile, median, profile_ops, quantile, repeat

__all__ = [
    "launch",
    "Cluster",
    "current",
    "prestart",
    "device",
    "resolve_backend",
    "BACKENDS",
    "RankError",
    "RankTimeoutError",
    "RankFailure",
    "register_ranks_magic",
    "Timer",
    "Laps",
    "repeat",
    "median",
    "lower_quartile",
    "quantile",
    "profile_ops",
    "check_margin",
    "parse_margins",
    "check_parameters",
    "passed",
]


def __getattr__(name):  # the launcher and the cluster load on first use
    if name == "launch":
        from .launcher import launch

        return launch
    if name in ("Cluster", "current", "register_ranks_magic"):
        from . import cluster

        return getattr(cluster, name)
    raise AttributeError(f"module 'mlsys_nb.runtime' has no attribute {name!r}")
