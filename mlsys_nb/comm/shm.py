"""An all-reduce over shared memory among the ranks of one machine, written from scratch.

gloo moves every byte through a loopback TCP socket: the sender's CPU copies it into the kernel, the receiver's
copies it out, and each step waits for a wake-up. Ranks on one machine share its memory, so they can read each
other's buffers directly: this is what NCCL does inside a node (over NVLink / PCIe), what vLLM's and SGLang's
custom all-reduce do for tensor-parallel decode, and what DeepSpeed's shared-memory all-reduce does on CPUs.

Setup, once per process group (``ShmAllReduce(group)``, a collective call):

1. every rank creates one POSIX shared-memory segment (``multiprocessing.shared_memory``): a 4 KiB header
   (its flag, a nonce, its pid, the length of the chunk in each buffer) and two data buffers of ``buffer_bytes``;
2. the ranks exchange (host, segment name, nonce, free ``/dev/shm``) with one ``all_gather_object`` over the
   group; ranks on two hosts, a segment that cannot be opened or holds another nonce, or too little room are
   refused with an error on every rank (shared memory only exists within one machine);
3. each rank maps every peer's segment and makes torch views onto them (no copy: ``torch.frombuffer``);
4. after a barrier (everyone has mapped everyone), each rank **unlinks its segment name at once**. The
   mappings stay valid, like an open file whose name was deleted, and the memory is freed when the last
   process unmaps it or dies. So no name is ever left in ``/dev/shm``, whichever rank is killed and when.

One call, ``all_reduce(x)`` (in place, like ``dist.all_reduce``), for each chunk of ``x`` that fits a buffer
(chunk ``k`` uses buffer ``k % 2``), with ``n`` ranks and the chunk cut into ``n`` slices (two-shot):

1. **stage**: copy my chunk into my buffer, then raise my flag (``seq + 1``); wait until every peer's flag
   reads ``>= seq + 1``;
2. **reduce-scatter**: slice ``me`` = the sum over ranks ``r = 0, 1, ..., n-1`` *in that order* of slice
   ``me`` of rank ``r``'s buffer, accumulated in float32 for bfloat16/float16 (``((x0 + x1) + x2) + x3``,
   rounded once to the dtype at the end); I write it over slice ``me`` of my own buffer (no one else reads it
   as input), then raise my flag to ``seq + 2``; wait until every peer's flag reads ``>= seq + 2``;
3. **all-gather**: copy slice ``r`` of rank ``r``'s buffer into my chunk, for every ``r``.

Small chunks (``one_shot_bytes``, 256 KiB by default) go **one-shot**: after the stage wait every rank sums the
whole chunk from every buffer itself, in the same order (one wait instead of two, ``n`` times the reads): the
choice vLLM's custom all-reduce and DeepSpeed's CPU one make by size, since for small messages the waits
cost more than the bytes.

Two-shot, every rank reads ``(n-1)/n`` of the chunk from its peers twice and copies its chunk in and the
result out: about ``2 + 2(n-1)/n`` memory copies of ``S`` bytes per rank, against nccl-tests' bus bytes
``2(n-1)/n . S``. Either way, results equal ``dist.all_reduce``'s exactly for integer-valued inputs and
differ only by rounding otherwise (gloo sums in another order); the order above is the same on every rank, so
all ranks get bit-identical results.

Two buffers instead of a third wait: chunk ``k+2`` overwrites the buffer of chunk ``k`` only after this rank
saw every peer's stage flag of chunk ``k+1``, which each peer raised after it finished reading chunk ``k``.

**Why the flag works** (``sync="flags"``, the default on x86-64). A rank writes its data, *then* the flag; a
peer reads the flag, *then* the data. On x86-64 (total store order) every core sees another core's stores
in the order they were made and never reorders a load before an earlier load, so a peer that sees the new
flag also sees the data written before it. The two stores are separate calls into C (a ``copy_`` then a
numpy store), which no compiler reorders. On ARM (Apple silicon, Graviton) stores and loads may become
visible out of order: the writer needs a release fence (``dmb ish`` / ``stlr``) between the data and the
flag and the reader an acquire (``ldar`` / ``dmb ishld``) between the flag and the data. Python has no fence,
so off x86-64 ``sync="auto"`` picks ``"barrier"``, and ``"flags"`` is refused. ``sync="barrier"`` replaces each
wait by a ``dist.barrier`` of the group (a gloo round trip through the kernel, which orders memory too): the
same algorithm, for comparison. A wait spins on the peers' flags for ``SPIN_S`` (50 µs, yielding the core
between reads), then polls them every ``POLL_S`` (20 µs) asleep: when ranks outnumber free cores, a spinning
rank takes the core from the very peer it waits for (measured with 4 ranks on 2 busy cores, 16 MiB: pure spin
173 ms, yield-spin 30-43 ms, sleep-poll 11 ms, gloo 50-160 ms).

Space: the segments live in the tmpfs behind ``/dev/shm`` (Linux), whose pages are allocated when first touched;
setup refuses, on every rank, a group whose segments would not fit (``dev_shm_free_bytes``; Docker's default is
64 MiB: ``--shm-size``) instead of letting a rank die of SIGBUS mid-call.

Every wait has a timeout (``timeout`` seconds; ``ShmTimeoutError`` names the rank that did not arrive, in
which phase and call). A rank that dies mid-call leaves its peers waiting: they raise within their timeout
and nothing is left in ``/dev/shm`` (step 4 above). Sizes: bytes; times: seconds. Binds nothing to the network.
"""

from __future__ import annotations

import os
import platform
import secrets
import socket
import sys
import time
from multiprocessing import shared_memory

import numpy as np
import torch
import torch.distributed as dist

from ..config import check_choice, check_int, check_seconds

__all__ = ["ShmAllReduce", "ShmTimeoutError", "SYNCS", "DTYPES", "dev_shm_free_bytes", "shm_all_reduce"]

SYNCS = ("auto", "flags", "barrier")
DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int32, torch.int64)
HEADER = 4096  # bytes before the data buffers: int64 slots FLAG, NONCE, PID, NUMEL (+0, +1: one per buffer)
FLAG, NONCE, PID, NUMEL = 0, 1, 2, 3
SPIN_S, POLL_S = 50e-6, 20e-6  # a wait spins this long, then polls at this period (seconds)
PHASES = ("stage", "wait staged", "reduce", "wait reduced", "gather")
TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")  # x86: stores seen in program order


class ShmTimeoutError(TimeoutError):
    """A peer did not raise its flag within the timeout: it died, hangs, or skipped this all-reduce."""


def _attach(name: str) -> shared_memory.SharedMemory:
    """Map a peer's segment without registering it with this process's resource tracker (only its creator
    owns it; Python < 3.13 registers on attach too, and a tracker would then unlink or warn about it)."""
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, track=False)
    from multiprocessing import resource_tracker

    register, resource_tracker.register = resource_tracker.register, lambda name, rtype: None
    try:
        return shared_memory.SharedMemory(name=name)
    finally:
        resource_tracker.register = register


class ShmAllReduce:
    """All-reduce over shared memory for the ranks of ``group`` (all on one host). See the module docstring.

    ``sync``: ``"flags"`` (sequence numbers in shared memory, x86-64 only), ``"barrier"`` (a ``dist.barrier``
    per wait) or ``"auto"`` (flags on x86-64). ``buffer_bytes``: size of each of the two buffers per rank
    (larger tensors go through in chunks; 4 MiB: 7 ranks' segments fit Docker's default 64 MiB ``/dev/shm``).
    ``one_shot_bytes``: chunks up to this size are summed whole by every rank after one wait (one-shot) instead
    of reduce-scatter + all-gather with two waits (two-shot).
    ``timeout``: seconds a wait may take before ``ShmTimeoutError``.
    Creating it is a collective call of the group; so is every call. ``close()`` (or ``with``) unmaps.
    """

    def __init__(
        self,
        group=None,
        *,
        sync: str = "auto",
        buffer_bytes: int = 4 << 20,
        one_shot_bytes: int = 256 << 10,
        timeout: float = 30.0,
    ):
        check_choice("sync", sync, SYNCS)
        check_int("buffer_bytes", buffer_bytes, 64)
        check_int("one_shot_bytes", one_shot_bytes, 0)
        check_seconds("timeout", timeout)
        if sync == "flags" and not TSO:
            raise ValueError(
                f"sync='flags' relies on x86-64's store order; this is {platform.machine()}: use 'barrier' or 'auto'"
            )
        self.sync = ("flags" if TSO else "barrier") if sync == "auto" else sync
        self.group, self.timeout, self.one_shot_bytes = group, float(timeout), one_shot_bytes
        self.buffer_bytes = buffer_bytes // 64 * 64  # every dtype's view starts aligned
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        self.seq = 0  # the flag value of the last phase this rank completed
        self.calls = self.chunks = 0
        self.phase_s = dict.fromkeys(PHASES, 0.0)  # seconds spent in each phase, summed over calls
        self.broken = None  # the error that left the peers out of step, if any
        self._segments, self._views, self._acc = [], {}, {}
        self._setup()

    # ---- setup and cleanup -----------------------------------------------------------------------------
    def _setup(self) -> None:
        mine = shared_memory.SharedMemory(create=True, size=HEADER + 2 * self.buffer_bytes)
        try:
            nonce = secrets.randbits(62)
            header = np.ndarray((5,), np.int64, buffer=mine.buf)
            header[:] = (0, nonce, os.getpid(), 0, 0)
            del header
            me = (socket.gethostname(), _boot_id(), mine.name, nonce, dev_shm_free_bytes())
            peers = [None] * self.world
            dist.all_gather_object(peers, me, group=self.group)
            self.names = [p[2] for p in peers]
            error = _host_error(peers) or _space_error(peers, mine.size)
            segments = [mine if r == self.rank else None for r in range(self.world)]
            if error is None:
                error = self._map_peers(peers, segments)
            errors = [None] * self.world
            dist.all_gather_object(errors, error, group=self.group)  # also the barrier: everyone has mapped
            failed = [(r, e) for r, e in enumerate(errors) if e]
            if failed:
                for s in segments:
                    if s is not None and s is not mine:
                        s.close()
                raise RuntimeError("ShmAllReduce " + "; ".join(dict.fromkeys(e for _, e in failed)))
        finally:
            mine.unlink()  # the name goes now; the mappings live on until the last process unmaps or dies
        self._segments = segments
        self._flags = [np.ndarray((5,), np.int64, buffer=s.buf) for s in segments]
        self._raw = [
            torch.frombuffer(s.buf, dtype=torch.uint8, count=2 * self.buffer_bytes, offset=HEADER) for s in segments
        ]

    def _map_peers(self, peers, segments) -> str | None:
        """Map every peer's segment into ``segments``; an error string if one is missing or not the peer's."""
        for r, (_, _, name, nonce, _) in enumerate(peers):
            if r == self.rank:
                continue
            try:
                segments[r] = _attach(name)
            except FileNotFoundError:
                return f"needs every rank on one host: rank {self.rank} cannot open rank {r}'s segment {name!r}"
            if int(np.ndarray((2,), np.int64, buffer=segments[r].buf)[NONCE]) != nonce:
                return (
                    f"needs every rank on one host: rank {self.rank} opened a segment {name!r} that is not rank {r}'s"
                )
        return None

    def close(self) -> None:
        """Unmap every segment (names were unlinked at setup). Not collective; idempotent."""
        self._flags, self._raw, self._views = [], [], {}
        for s in self._segments:
            try:
                s.close()
            except BufferError:  # a view of it is still alive somewhere: the mapping goes at exit
                pass
        self._segments = []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- one all-reduce --------------------------------------------------------------------------------
    def __call__(self, x: torch.Tensor, op="sum") -> torch.Tensor:
        """Reduce ``x`` over the group in place (``op``: ``"sum"`` or ``"avg"``, or ``dist.ReduceOp.SUM/AVG``);
        returns ``x``. Every rank must call with the same numel and dtype."""
        op = {dist.ReduceOp.SUM: "sum", dist.ReduceOp.AVG: "avg"}.get(op, op)
        check_choice("op", op, ("sum", "avg"))
        if not isinstance(x, torch.Tensor) or x.device.type != "cpu" or x.dtype not in DTYPES:
            raise TypeError(f"x: a CPU tensor of dtype {[str(d) for d in DTYPES]}, got {getattr(x, 'dtype', type(x))}")
        if op == "avg" and not x.is_floating_point():
            raise ValueError(f"op='avg' needs a floating-point tensor, got {x.dtype}")
        if self.broken is not None:
            raise RuntimeError(f"ShmAllReduce is out of step after an earlier error ({self.broken}); make a new one")
        if not self._segments:
            raise RuntimeError("ShmAllReduce is closed")
        self.calls += 1
        flat = x.view(-1) if x.is_contiguous() else x.contiguous().view(-1)
        cap = self.buffer_bytes // x.element_size()
        try:
            for start in range(0, flat.numel(), cap):
                self._chunk(flat[start : start + cap])
        except BaseException as e:
            self.broken = f"{type(e).__name__}: {e}"
            raise
        if op == "avg":
            flat.div_(self.world)
        if flat.data_ptr() != x.data_ptr():
            x.copy_(flat.view_as(x))
        return x

    all_reduce = __call__

    def _chunk(self, chunk: torch.Tensor) -> None:
        n, me, m = self.world, self.rank, chunk.numel()
        if n == 1:
            return
        which = self.chunks % 2
        bufs = [v[:m] for v in self._buffers(chunk.dtype, which)]
        self.chunks += 1
        clock = _Clock(self.phase_s)
        self._flags[me][NUMEL + which] = m  # one slot per buffer: a peer may be one chunk ahead
        self.publish(bufs[me], chunk, self.seq + 1)  # 1. stage: my data, then my flag
        clock("stage")
        self.wait(self.seq + 1, "staged its input")
        self._check_numel(NUMEL + which, m)
        clock("wait staged")
        if m * chunk.element_size() <= self.one_shot_bytes:  # one-shot: I sum the whole chunk myself
            chunk.copy_(self._sum(bufs, 0, m))
            clock("reduce")
            self.seq += 1
            return
        bounds = [(r * m // n, (r + 1) * m // n) for r in range(n)]
        lo, hi = bounds[me]  # 2. reduce-scatter: my slice summed over ranks 0..n-1 in this order
        self.publish(bufs[me][lo:hi], self._sum(bufs, lo, hi), self.seq + 2)
        clock("reduce")
        self.wait(self.seq + 2, "reduced its slice")
        clock("wait reduced")
        for r, (a, b) in enumerate(bounds):  # 3. all-gather: every rank's reduced slice into my chunk
            chunk[a:b].copy_(bufs[r][a:b])
        clock("gather")
        self.seq += 2

    def _sum(self, bufs: list[torch.Tensor], lo: int, hi: int) -> torch.Tensor:
        """``((b0 + b1) + b2) + ...`` over ``[lo, hi)`` of every rank's buffer, in float32 for 16-bit floats."""
        acc_dtype = torch.float32 if bufs[0].dtype in (torch.bfloat16, torch.float16) else bufs[0].dtype
        acc = self._scratch(acc_dtype, hi - lo)
        if acc_dtype == bufs[0].dtype:
            torch.add(bufs[0][lo:hi], bufs[1][lo:hi], out=acc)
        else:
            acc.copy_(bufs[0][lo:hi]).add_(bufs[1][lo:hi])
        for r in range(2, len(bufs)):
            acc += bufs[r][lo:hi]
        return acc

    def _buffers(self, dtype, which: int) -> list[torch.Tensor]:
        """Each rank's buffer ``which`` (0 or 1) as a flat tensor of ``dtype`` (views, cached)."""
        key = (dtype, which)
        if key not in self._views:
            half = self.buffer_bytes
            self._views[key] = [raw[which * half : (which + 1) * half].view(dtype) for raw in self._raw]
        return self._views[key]

    def _scratch(self, dtype, numel: int) -> torch.Tensor:
        """This rank's private accumulator (reused: a fresh tensor per chunk would page-fault)."""
        acc = self._acc.get(dtype)
        if acc is None or acc.numel() < numel:
            acc = self._acc[dtype] = torch.empty(numel, dtype=dtype)
        return acc[:numel]

    # ---- the protocol: publish (data, then flag) and wait ------------------------------------------------
    def publish(self, dst: torch.Tensor, src: torch.Tensor, flag: int) -> None:
        """Write ``src`` into my shared ``dst``, *then* raise my flag to ``flag``: the order peers rely on."""
        dst.copy_(src)
        self.post_flag(flag)

    def post_flag(self, flag: int) -> None:
        """Store ``flag`` in my header (one aligned 8-byte store, seen whole by the peers)."""
        self._flags[self.rank][FLAG] = flag

    def wait(self, flag: int, what: str) -> None:
        """Until every peer's flag reads ``>= flag`` (or a barrier, with ``sync="barrier"``); else a timeout."""
        if self.sync == "barrier":
            dist.barrier(group=self.group)
        else:
            start = time.monotonic()
            for r in range(self.world):
                header = self._flags[r]
                while header[FLAG] < flag:
                    waited = time.monotonic() - start
                    if waited > self.timeout:
                        raise ShmTimeoutError(
                            f"ShmAllReduce: rank {r} of {self.world} (pid {int(header[PID])}) has not {what} within "
                            f"{self.timeout:g} s (call {self.calls}; its flag reads {int(header[FLAG])}, rank "
                            f"{self.rank} waits for {flag}): it died, hangs, or skipped this all-reduce"
                        )
                    _pause(waited)

    def _check_numel(self, slot: int, numel: int) -> None:
        """Every peer staged a chunk of ``numel`` elements too (else the ranks called with different tensors)."""
        for r in range(self.world):
            if int(self._flags[r][slot]) != numel:
                raise ValueError(
                    f"ShmAllReduce: rank {r} all-reduces a chunk of {int(self._flags[r][slot])} elements, rank "
                    f"{self.rank} one of {numel}: every rank must pass the same numel and dtype"
                )


class _Clock:
    """``clock(phase)`` adds the seconds since the previous mark to ``totals[phase]``."""

    def __init__(self, totals: dict):
        self.totals, self.t = totals, time.perf_counter()

    def __call__(self, phase: str) -> None:
        now = time.perf_counter()
        self.totals[phase] += now - self.t
        self.t = now


def _pause(waited: float) -> None:
    """Between two reads of a peer's flag: spin (yielding the core) for the first ``SPIN_S``, then sleep
    ``POLL_S``: with more ranks than free cores a spinning rank takes the core from the peer it waits for."""
    if waited < SPIN_S and hasattr(os, "sched_yield"):
        os.sched_yield()
    else:
        time.sleep(POLL_S)


def _boot_id() -> str:
    """This boot of this machine (Linux); '' elsewhere (the hostname and the segment nonces decide)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return ""


def _host_error(peers) -> str | None:
    """An error string if the ranks do not all report the same (hostname, boot id)."""
    hosts = {(h, b) for h, b, _, _, _ in peers}
    if len(hosts) == 1:
        return None
    where = ", ".join(f"rank {r}: {h}" for r, (h, _, _, _, _) in enumerate(peers))
    return f"needs every rank on one host: the ranks run on {len(hosts)} hosts ({where})"


def dev_shm_free_bytes() -> int | None:
    """Free bytes of the tmpfs behind POSIX shared memory (Linux ``/dev/shm``); None where there is none."""
    try:
        st = os.statvfs("/dev/shm")
    except (OSError, AttributeError):
        return None
    return st.f_bavail * st.f_frsize


def _space_error(peers, segment_bytes: int) -> str | None:
    """An error string if ``/dev/shm`` cannot hold every rank's segment: the pages are allocated when first
    touched, so a full tmpfs would kill a rank with SIGBUS in the middle of a call instead."""
    free = [p[4] for p in peers if p[4] is not None]
    need = len(peers) * segment_bytes
    if not free or min(free) >= need:
        return None
    return (
        f"needs {need / 2**20:.0f} MiB of /dev/shm ({len(peers)} segments of {segment_bytes / 2**20:.1f} MiB), "
        f"{min(free) / 2**20:.0f} MiB free: pass a smaller buffer_bytes or enlarge /dev/shm "
        "(docker run --shm-size=1g)"
    )


def shm_all_reduce(x: torch.Tensor, op="sum", group=None, **kwargs) -> torch.Tensor:
    """One-off all-reduce through a fresh ``ShmAllReduce`` (setup and close included: for tests and demos;
    keep one ``ShmAllReduce`` per group for repeated calls)."""
    with ShmAllReduce(group, **kwargs) as shm:
        return shm(x, op)
