"""Bytes on the wire: what this rank's TCP sockets really sent and received (Linux ``TCP_INFO``).

The byte counter (``CommCounter``) records what the *code asked for* and prices it with an algorithm's
formula. This module reads what the operating system says went over the sockets, so a notebook can
show a measurement beside the model:

    with WireCounter() as w:          # inside a rank, around any communication
        dist.all_reduce(x)
    w.bytes_sent, w.bytes_received    # payload bytes the kernel acknowledged / received, all sockets

How: every TCP socket this process holds (gloo's pairs; the rendezvous store's connection is left
out by its port) is opened through ``/proc/self/fd`` and asked for ``TCP_INFO``; ``tcpi_bytes_acked``
and ``tcpi_bytes_received`` (Linux >= 4.1/4.2) count TCP payload, without headers. The difference
between two snapshots is what this rank sent and received in between (each snapshot taken once the
send queues are empty: an acknowledgement counts the bytes it acknowledges when it arrives), plus a
small overhead (gloo's own framing, a barrier used to fence the region). ``calibrate_baseline()`` measures that
overhead on an empty region so it can be subtracted.

What gloo sends is not always the ring: its reduce_scatter is an all_reduce followed by a local slice
(``2(n-1)/n·S`` per rank instead of ``(n-1)/n·S``), its broadcast is a binomial tree, its reduce a
ring reduce-scatter then a gather to the root. ``gloo_bytes_sent`` in ``mlsys_nb.comm.cost`` gives
those formulas; tests pin each against this counter.

Where the OS has no such counter (macOS, Windows) ``available()`` is False and ``WireCounter`` raises
``WireCounterUnavailable``; notebooks then show the model only and say so.
"""

from __future__ import annotations

import os
import socket
import struct
import sys
import time
from dataclasses import dataclass

# struct tcp_info (include/uapi/linux/tcp.h): tcpi_bytes_acked at byte 120, tcpi_bytes_received at 128
_TCP_INFO_LEN = 232
_BYTES_ACKED_OFFSET = 120


class WireCounterUnavailable(RuntimeError):
    """This operating system offers no per-socket byte counters (only Linux's TCP_INFO is read)."""


def available() -> bool:
    """True where per-socket counters can be read (Linux with ``TCP_INFO`` byte counters)."""
    return sys.platform.startswith("linux") and hasattr(socket, "TCP_INFO") and os.path.isdir("/proc/self/fd")


@dataclass(frozen=True)
class SocketBytes:
    local_port: int | None
    peer_port: int | None
    acked: int  # bytes this socket sent that the peer acknowledged
    received: int  # bytes this socket received


def _tcp_sockets(what: str):
    """(inode link, socket) for every TCP socket this process holds, each a duplicate of its fd that the
    caller's iteration closes once it moves on (the program's own socket stays open)."""
    if not available():
        raise WireCounterUnavailable(f"no {what} on {sys.platform}")
    seen = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            link = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (e.g. the listdir's own fd)
        if not link.startswith("socket:[") or link in seen:
            continue
        try:
            s = socket.socket(fileno=os.dup(int(fd)))
        except OSError:
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                seen.add(link)
                yield link, s
        finally:
            s.close()  # closes our duplicate only


def _ports(s) -> tuple[int, int] | None:
    try:
        return s.getsockname()[1], s.getpeername()[1]
    except OSError:
        return None  # a listening socket


def socket_bytes() -> dict[str, SocketBytes]:
    """Counters of every TCP socket of this process, keyed by the socket's inode (``socket:[N]``)."""
    out: dict[str, SocketBytes] = {}
    for link, s in _tcp_sockets("TCP_INFO byte counters"):
        info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, _TCP_INFO_LEN)
        if len(info) < _BYTES_ACKED_OFFSET + 16:
            continue  # kernel older than 4.2
        acked, received = struct.unpack_from("QQ", info, _BYTES_ACKED_OFFSET)
        local, peer = _ports(s) or (None, None)
        out[link] = SocketBytes(local, peer, acked, received)
    return out


def send_queue_bytes(exclude_port: int | None = None) -> int:
    """Bytes still in this process's TCP send queues: written by the program, not yet acknowledged
    by the peer (Linux ``SIOCOUTQ``, which equals ``TIOCOUTQ``). A send returns once the kernel has
    the bytes, so right after a collective some may still be in flight: ``tcpi_bytes_acked`` has
    not counted them yet."""
    import fcntl  # POSIX only: imported here so that the module imports everywhere
    import termios

    total = 0
    for _, s in _tcp_sockets("TCP send-queue counters"):
        ports = _ports(s)
        if ports is None or (exclude_port is not None and exclude_port in ports):
            continue  # a listening socket has no send queue
        total += struct.unpack("i", fcntl.ioctl(s.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
    return total


def settle(exclude_port: int | None = None, timeout: float = 5.0, poll: float = 0.002) -> int:
    """Wait (at most ``timeout`` seconds) until every byte this process wrote to its TCP sockets has
    been acknowledged; returns the bytes still unacknowledged (0 when settled)."""
    deadline = time.monotonic() + timeout
    while (left := send_queue_bytes(exclude_port)) and time.monotonic() < deadline:
        time.sleep(poll)
    return left


def _store_port() -> int | None:
    port = os.environ.get("MASTER_PORT")
    return int(port) if port else None


def _totals(snapshot: dict[str, SocketBytes], exclude_port: int | None) -> tuple[int, int]:
    rows = [b for b in snapshot.values() if exclude_port is None or exclude_port not in (b.local_port, b.peer_port)]
    return sum(b.acked for b in rows), sum(b.received for b in rows)


class WireCounter:
    """Context manager: bytes this process's TCP sockets sent and received inside the block.

    ``exclude_port`` (default: ``$MASTER_PORT``, the rendezvous store) leaves that connection out.
    ``baseline`` (bytes, e.g. from ``calibrate_baseline()``) is subtracted from ``bytes_sent``/``bytes_received``;
    ``raw_bytes_sent`` keeps the unsubtracted count. Sockets opened inside the block count from zero.
    The counter counts *acknowledged* bytes, so it settles at both ends (``settle_timeout`` seconds at
    most, typically a delayed ACK's 40 ms): on entry it waits until the bytes written *before* the block
    are acknowledged, else they would be counted inside it (a weight sync's root counted 33 KB of the
    preceding ZeRO step's messages to the other trainer, still in its send queue on a busy machine, as
    broadcast traffic); on exit it waits until the bytes the block wrote are acknowledged (a broadcast's
    root leaves the block with part of its last bucket still in the send queue). Received bytes cannot be
    settled from this side: a peer's bytes sent before the block may still arrive inside it (tens of
    bytes of a barrier here), which a fence before the block (``dist.barrier``) bounds.
    """

    def __init__(
        self,
        exclude_port: int | None = -1,
        baseline: tuple[float, float] = (0.0, 0.0),
        settle_timeout: float = 5.0,
    ):
        self.exclude_port = _store_port() if exclude_port == -1 else exclude_port
        self.baseline = baseline
        self.settle_timeout = settle_timeout
        self.raw_bytes_sent = 0
        self.raw_bytes_received = 0

    def __enter__(self):
        if self.settle_timeout > 0:
            settle(self.exclude_port, self.settle_timeout)
        self._before = socket_bytes()
        return self

    def __exit__(self, *exc):
        after = socket_bytes()
        if self.settle_timeout > 0:
            settle(self.exclude_port, self.settle_timeout)
            # a socket closed during the wait (its peer finished first) keeps its reading from before it
            after |= socket_bytes()
        before = {k: v for k, v in self._before.items() if k in after}
        s0, r0 = _totals(before, self.exclude_port)
        s1, r1 = _totals(after, self.exclude_port)
        self.raw_bytes_sent, self.raw_bytes_received = s1 - s0, r1 - r0
        return False

    @property
    def bytes_sent(self) -> float:
        return self.raw_bytes_sent - self.baseline[0]

    @property
    def bytes_received(self) -> float:
        return self.raw_bytes_received - self.baseline[1]


def calibrate_baseline(fence, repeats: int = 5) -> tuple[float, float]:
    """Median (sent, received) bytes of an empty region closed by ``fence()`` (e.g. ``dist.barrier``).

    Call it inside a rank with the same fence the measured regions use; pass the result as
    ``WireCounter(baseline=...)``."""
    import statistics

    sent, recv = [], []
    for _ in range(repeats):
        with WireCounter() as w:
            fence()
        sent.append(w.raw_bytes_sent)
        recv.append(w.raw_bytes_received)
    return float(statistics.median(sent)), float(statistics.median(recv))


def framing_per_message(baseline: tuple[float, float], repeats: int = 5) -> float:
    """Bytes gloo adds to every message it sends (its framing), measured inside a rank: an all_gather
    of one fp32 element per rank sends ``n - 1`` messages of 4 payload bytes each; what the sockets
    send beyond ``baseline`` (from ``calibrate_baseline(dist.barrier)``) and the payload, per message. Median
    of ``repeats``. About 290 B on Linux with torch 2.13's gloo: negligible for megabyte buckets,
    several % of a tiny model's traffic."""
    import statistics

    import torch
    import torch.distributed as dist

    n = dist.get_world_size()
    if n == 1:
        return 0.0
    one, out = torch.zeros(1), torch.empty(n)
    dist.all_gather_into_tensor(out, one)  # opens any pair connection the ring needs
    dist.barrier()
    per_message = []
    for _ in range(repeats):
        with WireCounter(baseline=baseline) as w:
            dist.all_gather_into_tensor(out, one)
            dist.barrier()
        per_message.append((w.bytes_sent - 4 * (n - 1)) / (n - 1))
    return float(statistics.median(per_message))
