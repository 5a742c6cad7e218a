"""Count the bytes each rank communicates, by wrapping ``torch.distributed``'s functions.

Generic: any code that calls the collectives as ``dist.all_reduce(...)`` (attribute lookup on the
``torch.distributed`` module at call time) is counted: our DDP and ZeRO, tensor parallelism,
PyTorch's FSDP2 (its Python code calls ``dist.all_gather_single`` / ``dist.reduce_scatter_single``; the
older names ``all_gather_into_tensor`` / ``reduce_scatter_tensor``, deprecated in torch 2.13, count too).
Not counted: code that imported a function by name before the counter was entered, and C++
internals such as ``torch.nn.parallel.DistributedDataParallel``'s reducer.

    from mlsys_nb.comm.counting import CommCounter
    with CommCounter() as cc:
        dist.all_reduce(x)
    cc.bytes_sent          # bytes this rank sends under the ring algorithms (Patarasuk & Yuan 2009)
    cc.to_frame()          # one row per op: calls, payload bytes, sent bytes

For every call we record the op, the payload ``S`` (the size nccl-tests' ``doc/PERFORMANCE.md``
calls S: the tensor for all_reduce, the full input for reduce_scatter, the full output for
all_gather, the send buffer for all_to_all) and the bytes this rank sends (= receives) under the
bandwidth-optimal ring algorithm: all_reduce ``2(n-1)/n·S``, reduce_scatter / all_gather /
all_to_all ``(n-1)/n·S``, broadcast / reduce ``S`` (the root; a pipelined chain), send ``S``.
These are *model* bytes: what an optimal algorithm moves, independent of what gloo really does.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from dataclasses import dataclass

import torch
import torch.distributed as dist

from .cost import bytes_sent_per_rank

# wrapped torch.distributed function -> (collective in mlsys_nb.comm.cost, algorithm whose bytes we count)
_COLLECTIVES = {
    "all_reduce": ("all_reduce", "ring"),
    "reduce_scatter_single": ("reduce_scatter", "ring"),
    "reduce_scatter_tensor": ("reduce_scatter", "ring"),
    "reduce_scatter": ("reduce_scatter", "ring"),
    "all_gather_single": ("all_gather", "ring"),
    "all_gather_into_tensor": ("all_gather", "ring"),
    "all_gather": ("all_gather", "ring"),
    "all_to_all_single": ("all_to_all", "pairwise"),
    "all_to_all": ("all_to_all", "pairwise"),
    "broadcast": ("broadcast", "pipelined_chain"),
    "reduce": ("reduce", "pipelined_chain"),
}
_POINT_TO_POINT = {"send": 1.0, "isend": 1.0, "recv": 0.0, "irecv": 0.0}  # share of S this rank sends
# *_single names are new in torch 2.13
WRAPPED_OPS = tuple(op for op in (*_COLLECTIVES, *_POINT_TO_POINT) if hasattr(dist, op))


def bytes_sent(op: str, payload_bytes: float, n: int) -> float:
    """Bytes one rank sends for one call of ``torch.distributed.<op>`` with payload ``S`` in a
    group of ``n`` ranks: ``mlsys_nb.comm.cost.bytes_sent_per_rank`` of the matching collective
    (ring, pairwise all_to_all, pipelined-chain broadcast/reduce); ``S`` for send, 0 for recv."""
    if op in _POINT_TO_POINT:
        return payload_bytes * _POINT_TO_POINT[op]
    collective, algorithm = _COLLECTIVES[op]
    return bytes_sent_per_rank(collective, payload_bytes, n, algorithm)


# messages one rank sends per call in gloo's algorithms: rings of n-1 steps (all_reduce and its
# reduce_scatter: two passes), pairwise all_to_all, one message per send
_GLOO_MESSAGES = {
    "all_reduce": lambda n: 2 * (n - 1),
    "reduce_scatter": lambda n: 2 * (n - 1),
    "all_gather": lambda n: n - 1,
    "all_to_all": lambda n: n - 1,
}


def gloo_bytes_from_ops(by_op: dict, n: int, rank: int = 0, framing_bytes: float = 0.0) -> float:
    """Bytes this rank sends on the wire under *gloo's* algorithms (``mlsys_nb.comm.cost.gloo_bytes_sent``)
    for the calls in ``by_op`` (a ``CommCounter.by_op()``): the ring model's payloads priced the way
    gloo really moves them (its reduce_scatter is an all_reduce plus a slice: twice the ring's bytes),
    plus ``framing_bytes`` per message sent (``mlsys_nb.comm.wire.framing_per_message`` measures it).
    Broadcast and reduce depend on the root, which ``by_op`` does not keep: they raise."""
    from .cost import gloo_bytes_sent

    total = 0.0
    for op, row in by_op.items():
        if op in _POINT_TO_POINT:
            total += (row["payload_bytes"] + framing_bytes * row["calls"]) * _POINT_TO_POINT[op]
            continue
        collective = _COLLECTIVES[op][0]
        if collective in ("broadcast", "reduce"):
            raise ValueError(f"op={op!r}: gloo's bytes depend on the root, which by_op does not record")
        total += gloo_bytes_sent(collective, row["payload_bytes"], n, rank)
        if n > 1:
            total += framing_bytes * row["calls"] * _GLOO_MESSAGES[collective](n)
    return total


def _nbytes(t) -> int:
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def _payload(op: str, args, kwargs) -> int:
    """S (as nccl-tests defines it) for one call, in bytes."""
    a = list(args) + [None] * 3

    def arg(i, name):
        return kwargs.get(name, a[i])

    if op.startswith("reduce_scatter"):  # (output, input): S = full input
        return _nbytes(arg(1, "input_list" if op == "reduce_scatter" else "input"))
    if op.startswith("all_gather"):  # (output, input): S = full output
        return _nbytes(arg(0, "tensor_list" if op == "all_gather" else "output_tensor"))
    if op in ("all_to_all_single", "all_to_all"):  # (output, input): S = this rank's send buffer
        return _nbytes(arg(1, "input" if op == "all_to_all_single" else "input_tensor_list"))
    return _nbytes(arg(0, "tensor"))  # all_reduce, broadcast, reduce, send, recv


@dataclass
class CommRecord:
    op: str
    payload_bytes: int  # S (as nccl-tests defines it)
    bytes_sent: float  # ring-model bytes this rank sends
    group_size: int


# position of the ``group`` argument when passed positionally
_GROUP_POS = {
    "all_reduce": 2,
    "broadcast": 2,
    "reduce": 3,
    "reduce_scatter_single": 3,
    "reduce_scatter_tensor": 3,
    "reduce_scatter": 3,
    "all_gather_single": 2,
    "all_gather_into_tensor": 2,
    "all_gather": 2,
    "all_to_all_single": 4,
    "all_to_all": 2,
    "send": 2,
    "isend": 2,
    "recv": 2,
    "irecv": 2,
}

_active: list[CommCounter] = []
_originals: dict[str, object] = {}
_lock = threading.Lock()
_depth = threading.local()  # a wrapped function calling another wrapped one is counted once


def _make_wrapper(op: str, original):
    def wrapper(*args, **kwargs):
        if _active and not getattr(_depth, "n", 0):
            pos = _GROUP_POS[op]
            group = kwargs.get("group", args[pos] if len(args) > pos else None)
            n = dist.get_world_size(group)
            s = _payload(op, args, kwargs)
            rec = CommRecord(op, s, bytes_sent(op, s, n), n)
            with _lock:
                for counter in _active:
                    counter.records.append(rec)
        _depth.n = getattr(_depth, "n", 0) + 1
        try:
            return original(*args, **kwargs)
        finally:
            _depth.n -= 1

    wrapper.__wrapped__ = original
    wrapper.__name__ = op
    return wrapper


class CommCounter:
    """Context manager recording every wrapped ``torch.distributed`` call made on this rank.

    Counters nest: the functions are patched while at least one counter is active, and every active
    counter sees every call. Use one counter per rank (each rank is its own process)."""

    def __init__(self):
        self.records: list[CommRecord] = []

    def __enter__(self):
        with _lock:
            if not _active:
                for op in WRAPPED_OPS:
                    original = getattr(dist, op)
                    _originals[op] = original
                    setattr(dist, op, _make_wrapper(op, original))
            _active.append(self)
        return self

    def __exit__(self, *exc):
        with _lock:
            _active.remove(self)
            if not _active:
                for op, original in _originals.items():
                    setattr(dist, op, original)
                _originals.clear()
        return False

    def reset(self) -> None:
        self.records.clear()

    @property
    def bytes_sent(self) -> float:
        """Bytes this rank sends in total (ring model, Patarasuk & Yuan 2009)."""
        return sum(r.bytes_sent for r in self.records)

    @property
    def payload_bytes(self) -> int:
        return sum(r.payload_bytes for r in self.records)

    @property
    def calls(self) -> int:
        return len(self.records)

    def by_op(self) -> dict[str, dict[str, float]]:
        """{op: {"calls", "payload_bytes", "bytes_sent"}} (plain dict, picklable)."""
        out: dict[str, dict[str, float]] = defaultdict(lambda: {"calls": 0, "payload_bytes": 0, "bytes_sent": 0.0})
        for r in self.records:
            row = out[r.op]
            row["calls"] += 1
            row["payload_bytes"] += r.payload_bytes
            row["bytes_sent"] += r.bytes_sent
        return dict(out)

    def to_frame(self):
        import pandas as pd

        df = pd.DataFrame.from_dict(self.by_op(), orient="index")
        df.index.name = "op"
        return df
