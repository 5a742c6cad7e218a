"""Reading a ``torch.profiler`` trace: ranges, op counts, communication overlap and memory over time.

The profiler (``torch.profiler.profile``) records every op, every ``record_function`` range and, with
``profile_memory=True``, every allocation and free; ``prof.export_chrome_trace(path)`` writes them as
Chrome-trace JSON (open it in https://ui.perfetto.dev or chrome://tracing). The helpers here read
that JSON back as plain Python (a list of event dicts) and compute from it:

- ``load_trace(path)``: the trace's events; ``spans(events, name=..., prefix=...)``: the complete
  events (``"ph": "X"``) that match, as ``(start, end)`` intervals in microseconds (the trace's unit).
- ``mm_flops(events, within)``: FLOPs of the ``aten::mm`` calls inside an interval, ``2 M K N`` each,
  from the shapes that ``record_shapes=True`` stores.
- ``union``, ``length``, ``intersection_length`` and ``overlap_fraction(comm, compute)``: the part
  of the communication time that lies inside the compute (pure functions over intervals).
- ``memory_timeline(events)``: live bytes after each allocation or free (``[memory]`` events of a
  trace, or a finished profiler read in memory), counted from the start of profiling; ``live_at`` and
  ``peak_in`` read it.
- ``in_flight(events)``: each all-reduce from its launch to its end; ``backward_extents(events)`` and
  ``backward_compute(events)``: each backward's extent and the ops it ran on its thread;
  ``overlapped_all_reduces(events)``: the share of the all-reduces during which backward computed.
- ``activities()``: CPU, plus CUDA where a GPU is present. (The rank function that traces a data-parallel
  step under these helpers is ``parallel.harness.trace_ddp_step``, notebook 05b.)
- ``trace_range(name)`` and ``ranged(name)``: a ``record_function`` range (a ``with`` block, a
  decorator) that costs a microsecond or two while no profiler records (the serving engine's
  ``engine.step`` and ``engine.model``); ``light_profile()``: a profiler whose first start does not
  import the compiler; ``inner_time(events, outer, inner)``: per ``outer`` range, the time
  covered by ``inner`` ranges inside it (a decode step's model forward, notebook 15).

Timestamps are the profiler's microseconds (its own clock, one per process); durations out of the
helpers are microseconds unless a name says otherwise. Timing is ``runtime.timing``'s job: the profiler
adds microseconds per op, so it shows where time goes, not how long a step takes unprofiled.
"""

from __future__ import annotations

import contextlib
import functools
import gzip
import json
from pathlib import Path

from ..config import check_choice, check_int, check_number

__all__ = [
    "COMM_OPS",
    "activities",
    "load_trace",
    "spans",
    "mm_flops",
    "union",
    "length",
    "intersection_length",
    "overlap_fraction",
    "memory_timeline",
    "live_at",
    "peak_in",
    "OVERLAP_BOUND",
    "backward_compute",
    "backward_extents",
    "in_flight",
    "overlapped_all_reduces",
    "trace_range",
    "ranged",
    "light_profile",
    "inner_time",
    "host_time_mismatch",
    "most_agree",
]

# names of communication events: gloo's all-reduce runs on its worker threads; NCCL's are GPU kernels
COMM_OPS = ("gloo:all_reduce", "nccl:all_reduce", "ncclDevKernel_AllReduce", "ncclKernel_AllReduce")


def activities(device: str = "auto") -> list:
    """The ``torch.profiler.ProfilerActivity`` list for ``device``: ``"cpu"`` records host ops only;
    ``"cuda"`` adds the GPU's kernels and memory copies (CUPTI); ``"auto"`` adds CUDA where a GPU is present."""
    import torch
    from torch.profiler import ProfilerActivity

    device = check_choice("device", device, ("auto", "cpu", "cuda"))
    gpu = torch.cuda.is_available() if device == "auto" else device == "cuda"
    return [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if gpu else [])


_IDLE = contextlib.nullcontext()  # shared: entering a nullcontext changes nothing


def trace_range(name: str):
    """A ``torch.profiler.record_function(name)`` range while a profiler records, else a no-op context.

    ``record_function`` itself costs 20-30 us per range even with no profiler running (a dispatcher
    call to open and one to close it; measured on a busy 2-core AMD EPYC), this check about 1.4 us
    there, so a hot loop (an engine step) can keep its ranges in production code. Use as
    ``with trace_range("engine.model"): ...``."""
    import torch

    if torch.autograd._profiler_enabled():
        return torch.autograd.profiler.record_function(name)
    return _IDLE


def ranged(name: str):
    """Decorator: every call of the function runs inside ``trace_range(name)`` (a fresh range per call,
    so threads and recursion are safe, unlike decorating with one ``record_function`` instance)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name={name!r}: a range needs a non-empty name (str)")

    def wrap(fn):
        @functools.wraps(fn)
        def inner(*args, **kwargs):
            with trace_range(name):
                return fn(*args, **kwargs)

        return inner

    return wrap


def light_profile(device: str = "auto"):
    """A profiler over ``activities(device)`` with shapes, stacks and memory off (the cheapest trace):
    ``with light_profile() as prof: ...`` then ``prof.export_chrome_trace(path)``.

    It is ``torch.autograd.profiler.profile(use_kineto=True)``, the profiler that
    ``torch.profiler.profile`` wraps: the same Kineto trace, without the front end's first-start cost:
    ``torch.profiler.profile`` looks up ``torch._inductor`` to read one setting, which imports the
    compiler (``torch._inductor``, ``torch._dynamo``) in a process that has not loaded it yet."""
    import torch

    device = check_choice("device", device, ("auto", "cpu", "cuda"))
    gpu = torch.cuda.is_available() if device == "auto" else device == "cuda"
    return torch.autograd.profiler.profile(use_kineto=True, use_device="cuda" if gpu else None)


def load_trace(path) -> list[dict]:
    """The ``traceEvents`` of a Chrome-trace JSON file (``.json`` or ``.json.gz``) written by
    ``prof.export_chrome_trace(path)``: one dict per event (``name``, ``ph``, ``ts`` and ``dur`` in us, ...)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"path={str(path)!r}: no such trace file")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise ValueError(f"path={str(path)!r}: not a Chrome trace (no list of traceEvents)")
    return events


def spans(events, *, name: str | None = None, prefix: str | None = None, cat: str | None = None, tid=None):
    """Complete events (``"ph": "X"``) whose name is ``name`` (or starts with ``prefix``), optionally
    of category ``cat`` and thread ``tid``, as ``(start, end)`` in microseconds, sorted by start."""
    if (name is None) == (prefix is None):
        raise ValueError("give exactly one of name= (an exact event name) or prefix= (its beginning)")
    out = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        n = e.get("name", "")
        if (name is not None and n != name) or (prefix is not None and not n.startswith(prefix)):
            continue
        if (cat is not None and e.get("cat") != cat) or (tid is not None and e.get("tid") != tid):
            continue
        out.append((float(e["ts"]), float(e["ts"]) + float(e["dur"])))
    return sorted(out)


def inner_time(events, outer: str, inner: str) -> list[tuple[float, float]]:
    """For each range named ``outer`` (complete events, in time order): ``(its duration, the time
    covered by ranges named inner that lie inside it)``, both in microseconds. Nested or repeated
    ``inner`` ranges count each instant once; ``inner`` ranges outside every ``outer`` one are ignored.
    ``outer`` minus ``inner`` is the rest of each step (a decode step's host work: schedule, prepare,
    sample, update, around the model's forward)."""
    outers = spans(events, name=outer)
    if not outers:
        raise ValueError(f"outer={outer!r}: no complete event of that name in the trace")
    ins = spans(events, name=inner)
    return [(b - a, intersection_length([(a, b)], [iv for iv in ins if a <= iv[0] and iv[1] <= b])) for a, b in outers]


def host_time_mismatch(trace, timers, *, rel: float = 0.05, abs_us: float = 500.0) -> list[float]:
    """Per step, how far two readings of its host time (the step minus its model forward) disagree, in
    units of the tolerance ``rel * host + abs_us``: <= 1 means they agree.

    ``trace`` and ``timers``: one ``(step_us, model_us)`` per step, in the same order, from the
    profiler's ranges (``inner_time``) and from the code's own clock (the engine's phase timers). The
    absolute part covers what differs by construction: a range opens before the phase clock starts and
    closes after it stops, and the profiler's first range in a thread costs it a little set-up."""
    check_number("rel", rel, 0)
    check_number("abs_us", abs_us, 0, lo_open=True, unit="us")
    trace, timers = list(trace), list(timers)
    if len(trace) != len(timers) or not trace:
        raise ValueError(f"trace and timers: one (step_us, model_us) per step each, got {len(trace)} and {len(timers)}")
    out = []
    for (st, mt), (s, m) in zip(trace, timers):
        host = s - m
        out.append(abs((st - mt) - host) / (rel * host + abs_us))
    return out


def most_agree(mismatch) -> bool:
    """True when more than half of the steps agree (``mismatch <= 1``, see ``host_time_mismatch``). One
    step may disagree: on a busy machine the process can be descheduled right at a range's edge (between
    the range opening and the phase clock starting, say), a pause that only one of the two clocks sees;
    every wrong reading (another step's ranges, the whole step taken as model time) fails on most steps."""
    mismatch = list(mismatch)
    if not mismatch:
        raise ValueError("mismatch: no steps to compare")
    return sum(m <= 1 for m in mismatch) > len(mismatch) / 2


def _inside(e: dict, within) -> bool:
    t0, t1 = within
    return e.get("ph") == "X" and t0 <= float(e["ts"]) and float(e["ts"]) + float(e.get("dur", 0.0)) <= t1


def mm_flops(events, within) -> tuple[int, float]:
    """Number of ``aten::mm`` calls inside the interval ``within`` = ``(start, end)`` (us) and their
    FLOPs, ``2 M K N`` per call for inputs of shapes ``[M, K]`` and ``[K, N]`` (the ``Input Dims``
    that ``record_shapes=True`` stores; without them a ``ValueError`` says so)."""
    calls, flops = 0, 0.0
    for e in events:
        if e.get("name") != "aten::mm" or not _inside(e, within):
            continue
        dims = e.get("args", {}).get("Input Dims")
        if not dims or len(dims) < 2 or len(dims[0]) != 2 or len(dims[1]) != 2:
            raise ValueError("aten::mm without two 2-d input shapes: profile with record_shapes=True")
        (m, k), (k2, n) = dims[0], dims[1]
        if k != k2:
            raise ValueError(f"aten::mm shapes {dims[0]} x {dims[1]} do not chain")
        calls += 1
        flops += 2.0 * m * k * n
    return calls, flops


def _checked(intervals, what: str) -> list[tuple[float, float]]:
    out = []
    for iv in intervals:
        a, b = (float(x) for x in iv)
        if b < a:
            raise ValueError(f"{what}: interval {iv} ends before it starts (need start <= end)")
        out.append((a, b))
    return out


def union(intervals) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as disjoint, sorted intervals (touching ones merge)."""
    merged: list[list[float]] = []
    for a, b in sorted(_checked(intervals, "union")):
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], b)
        else:
            merged.append([a, b])
    return [(a, b) for a, b in merged]


def length(intervals) -> float:
    """Total time covered by ``intervals`` (same unit as theirs), each instant counted once."""
    return sum(b - a for a, b in union(intervals))


def intersection_length(a, b) -> float:
    """Time covered by both the intervals ``a`` and the intervals ``b`` (same unit as theirs)."""
    ua, ub = union(a), union(b)
    total, i, j = 0.0, 0, 0
    while i < len(ua) and j < len(ub):  # two sorted disjoint lists: one sweep
        lo, hi = max(ua[i][0], ub[j][0]), min(ua[i][1], ub[j][1])
        total += max(0.0, hi - lo)
        if ua[i][1] < ub[j][1]:
            i += 1
        else:
            j += 1
    return total


def overlap_fraction(comm, compute) -> float:
    """Fraction (0..1) of the communication time that lies inside the compute:
    ``|union(comm) ∩ union(compute)| / |union(comm)|``. 1: all communication hidden behind compute;
    0: none (it ran after, as in a DDP without overlap). ``comm`` must cover some time."""
    total = length(comm)
    if total <= 0:
        raise ValueError("comm: the communication intervals cover no time; nothing to overlap")
    return intersection_length(comm, compute) / total


def memory_timeline(events, *, device_type: int = 0) -> list[tuple[float, int]]:
    """Live bytes over time from the allocation events of a run profiled with ``profile_memory=True``:
    ``[(ts_us, live_bytes), ...]`` sorted by time, where live bytes are the allocations minus the frees
    (each event's size, negative for a free) since profiling started: memory allocated before the
    profiler started (the parameters, say) is not in it. ``device_type``: 0 for CPU, 1 for CUDA.

    ``events``: the ``[memory]`` events of an exported trace (``load_trace``), or the finished profiler
    itself (``torch.profiler.profile`` / ``torch.autograd.profiler.profile``), read in memory without
    exporting (the same events: its allocation nodes; timestamps then on the profiler's own clock, in
    us, not the exported trace's offset). This is the kit's one reader of the profiler's memory events
    (``runtime.peak_memory.MemoryPeak`` calls it, and ``peak_forward_bytes`` through it)."""
    device_type = check_int("device_type", device_type, 0)
    if isinstance(events, (list, tuple)):
        rows = sorted(
            (float(e["ts"]), int(e["args"]["Bytes"]))
            for e in events
            if e.get("name") == "[memory]" and int(e.get("args", {}).get("Device Type", 0)) == device_type
        )
    else:  # exact nanoseconds first (ties broken by size, as the trace's rows), then microseconds
        rows = [(ns / 1e3, n) for ns, n in sorted(_allocations(events, device_type))]
    out, live = [], 0
    for ts, nbytes in rows:
        live += nbytes
        out.append((ts, live))
    return out


def _allocations(prof, device_type: int):
    """(ts_ns, bytes) of the allocation events of a finished profiler (a free is a negative size)."""
    from torch._C._profiler import _EventType

    inner = getattr(prof, "profiler", None) or prof  # torch.profiler.profile wraps the autograd profiler
    results = getattr(inner, "kineto_results", None)
    if results is None:
        raise TypeError(
            "events must be a list of trace events (load_trace) or a finished torch profiler, "
            f"got {type(prof).__name__}"
        )
    kind = {0: "cpu", 1: "cuda"}.get(device_type)
    stack = list(results.experimental_event_tree())
    while stack:
        node = stack.pop()
        stack.extend(node.children)
        if node.typed[0] == _EventType.Allocation and node.typed[1].device.type == kind:
            yield node.start_time_ns, int(node.typed[1].alloc_size)


def live_at(timeline, t: float) -> int:
    """Live bytes at time ``t`` (us): the value after the last event at or before ``t`` (0 before any)."""
    t = check_number("t", t, unit="us")
    live = 0
    for ts, b in timeline:
        if ts > t:
            break
        live = b
    return live


def peak_in(timeline, start: float, end: float) -> int:
    """Largest live bytes in ``[start, end]`` (us), counting the value already live at ``start``."""
    if end < start:
        raise ValueError(f"end={end} < start={start}: the window must not end before it starts")
    return max([live_at(timeline, start)] + [b for ts, b in timeline if start <= ts <= end])


# Notebook 05b's bound on ``overlapped_all_reduces`` pooled over a DDP step's ranks. A blocking all-reduce (awaited
# in its hook) and one launched after backward score 0 by construction: no op runs in a thread that waits, and no
# backward runs after backward. The overlapped schedule scored 0.36-0.81 pooled over the ranks with 3 traced steps
# (world sizes 2 and 3, seeds 0-3, ATEN_CPU_CAPABILITY default/avx2/avx512, loaded 2 cores) and 0.29-0.81 with 4
# in notebook 05b at load average 13 (data/measured/portability.md).
OVERLAP_BOUND = 0.2


def in_flight(events) -> list[tuple[float, float]]:
    """Per gloo all-reduce of a trace, ``(launch, done)`` (us): from the ``c10d::allreduce_`` call that started it
    on the calling thread to the end of its ``gloo:all_reduce`` span on gloo's worker thread (paired in order:
    gloo runs a process group's collectives one after another). Between the two the all-reduce is in flight:
    compute that runs meanwhile overlaps it."""
    launches = sorted(s for s in spans(events, name="c10d::allreduce_"))
    done = sorted(s for s in spans(events, name="gloo:all_reduce"))
    if len(launches) != len(done):
        raise ValueError(f"{len(launches)} c10d::allreduce_ calls but {len(done)} gloo:all_reduce spans in the trace")
    return [(a, max(a, e)) for (a, _), (_, e) in zip(launches, done)]


def backward_extents(events) -> list[tuple[float, float]]:
    """Per backward pass of a trace, the extent of the autograd engine's ``evaluate_function`` events (us): inside
    each ``record_function("backward")`` range where there are such ranges, else one extent for the whole trace.
    It ends before DDP's end-of-backward callback waits for the buckets (which the range itself includes)."""
    engine = spans(events, prefix="autograd::engine::evaluate_function")
    if not engine:
        raise ValueError("no autograd::engine::evaluate_function events: the trace holds no backward")
    out = []
    for a, b in spans(events, name="backward") or [(engine[0][0], max(e for _, e in engine))]:
        inside = [(s, e) for s, e in engine if a <= s <= b]
        if inside:
            out.append((inside[0][0], max(e for _, e in inside)))
    return out


def backward_compute(events) -> list[tuple[float, float]]:
    """The backward's compute on the thread that ran it: the ``aten::`` op spans on the autograd engine's thread
    (the thread of the ``evaluate_function`` events) within the ``backward_extents``. A thread waiting for an
    all-reduce runs no op, so this leaves out the waits that the extents hold."""
    tids = [e.get("tid") for e in events if e.get("ph") == "X" and e["name"].startswith("autograd::engine::")]
    extents = backward_extents(events)
    tid = max(set(tids), key=tids.count)
    return [
        (float(e["ts"]), float(e["ts"]) + float(e["dur"]))
        for e in events
        if e.get("ph") == "X"
        and e.get("tid") == tid
        and e["name"].startswith("aten::")
        and any(a <= float(e["ts"]) <= b for a, b in extents)
    ]


def overlapped_all_reduces(events) -> float:
    """Share (0..1) of the trace's all-reduces during whose flight (``in_flight``) the backward computed
    (``backward_compute``): what overlap means, read per all-reduce. Launched from a gradient hook and not waited
    for, every bucket but perhaps the last has backward ops running beside it: near 1. Awaited inside the hook
    (blocking: the thread waits, no op runs) or launched after backward: 0, though the blocking all-reduces lie
    inside backward's extent. Unlike a share of time, it does not depend on how long an all-reduce takes
    against the ops beside it (which varies with the peers' lag and the machine's load)."""
    compute = backward_compute(events)
    flights = in_flight(events)
    if not flights:
        raise ValueError("no all-reduce in the trace")
    return sum(intersection_length([f], compute) > 0 for f in flights) / len(flights)
