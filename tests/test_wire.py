"""Bytes on the wire (``mlsys_nb.comm.wire``) against known transfers and gloo's algorithm formulas.

One launch per world size measures every op; the tests then compare. The counter is first checked on
a point-to-point send of S bytes (what the sender's sockets report must be S, after the calibrated
empty-region baseline); then each collective's measured bytes per rank must equal
``gloo_bytes_sent`` within 3 %, and a formula with a ring factor off by one must miss by more than 10 %.
"""

import sys

import pytest

from mlsys_nb.comm import cost, wire

pytestmark = pytest.mark.skipif(not wire.available(), reason="TCP_INFO byte counters are Linux-only")

SIZE = 4 * 3 * (1 << 18)  # bytes per collective payload S: 3 MiB, divisible by 4 bytes x 2, 3, 4 ranks


def _measure_all(nbytes):
    import torch
    import torch.distributed as dist

    from mlsys_nb.comm.wire import WireCounter, calibrate_baseline

    n, r = dist.get_world_size(), dist.get_rank()
    numel = nbytes // 4
    full, chunk, out = torch.ones(numel), torch.ones(numel // n), torch.empty(numel)
    ops = {
        "send": lambda: dist.send(full, 1) if r == 0 else (dist.recv(full, 0) if r == 1 else None),
        "all_reduce": lambda: dist.all_reduce(full),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(chunk, full),
        "all_gather": lambda: dist.all_gather_into_tensor(out, chunk),
        "all_to_all": lambda: dist.all_to_all_single(out, full),
        "broadcast": lambda: dist.broadcast(full, 0),
        "reduce": lambda: dist.reduce(full, 0),
    }
    for op in ops.values():  # gloo opens its pair connections lazily: warm every path first
        op()
        dist.barrier()
    base = calibrate_baseline(dist.barrier)
    measured = {}
    for name, op in ops.items():
        with WireCounter(baseline=base) as w:
            op()
            dist.barrier()
        measured[name] = (w.bytes_sent, w.bytes_received)
    return measured


@pytest.fixture(scope="module", params=[2, 3, 4])
def measured(request):
    import mlsys_nb

    n = request.param
    return n, mlsys_nb.launch(_measure_all, world_size=n, args=(SIZE,), timeout=120)


@pytest.mark.slow
def test_counter_sees_a_known_point_to_point_transfer(measured):
    n, per_rank = measured
    sent0, _ = per_rank[0]["send"]
    _, recv1 = per_rank[1]["send"]
    assert abs(sent0 - SIZE) / SIZE < 0.01, f"rank 0 sent {sent0} B for a {SIZE} B send"
    assert abs(recv1 - SIZE) / SIZE < 0.01, f"rank 1 received {recv1} B for a {SIZE} B send"
    for r in range(2, n):
        assert abs(per_rank[r]["send"][0]) < 0.01 * SIZE, "a rank outside the transfer sent bytes"


@pytest.mark.slow
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce"])
def test_every_collective_sends_what_gloos_algorithm_says(measured, op):
    n, per_rank = measured
    for r in range(n):
        expected = cost.gloo_bytes_sent(op, SIZE, n, r)
        got = per_rank[r][op][0]
        assert abs(got - expected) <= 0.03 * SIZE, (
            f"{op} n={n} rank {r}: measured {got:.0f} B, gloo's formula {expected:.0f} B"
        )


@pytest.mark.slow
def test_a_ring_factor_off_by_one_is_caught(measured):
    """The check above fails when the idea is broken: (n)/n instead of 2(n-1)/n misses by > 10 %."""
    n, per_rank = measured
    wrong = 2 * n / n * SIZE if n > 2 else 3 / 2 * SIZE  # off-by-one ring factor 2n/n (n = 2: 2(n)/(n+1))
    got = per_rank[0]["all_reduce"][0]
    assert abs(got - wrong) / got > 0.10
    ring_model_rs = cost.bytes_sent_per_rank("reduce_scatter", SIZE, n)
    assert abs(per_rank[0]["reduce_scatter"][0] - ring_model_rs) / ring_model_rs > 0.5, (
        "gloo's reduce_scatter should send twice the ring model (it is an all_reduce + slice)"
    )


def test_gloo_formulas_by_hand():
    S = 1000.0
    assert cost.gloo_bytes_sent("all_reduce", S, 4, 0) == 1500
    assert cost.gloo_bytes_sent("reduce_scatter", S, 4, 2) == 1500
    assert cost.gloo_bytes_sent("all_gather", S, 4, 1) == 750
    assert [cost.gloo_bytes_sent("broadcast", S, 8, r) for r in range(8)] == [3000, 2000, 1000, 1000, 0, 0, 0, 0]
    assert [cost.gloo_bytes_sent("broadcast", S, 5, r) for r in range(5)] == [3000, 1000, 0, 0, 0]
    assert [cost.gloo_bytes_sent("reduce", S, 4, r) for r in range(4)] == [750, 1000, 1000, 1000]
    assert sum(cost.gloo_bytes_sent("broadcast", S, 6, r, root=3) for r in range(6)) == 5 * S
    with pytest.raises(ValueError, match="rank"):
        cost.gloo_bytes_sent("all_reduce", S, 4, 4)


def test_unavailable_counter_says_so(monkeypatch):
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not wire.available()
    with pytest.raises(wire.WireCounterUnavailable, match="darwin"):
        wire.socket_bytes()


def test_counter_waits_for_bytes_still_in_the_send_queue():
    """A send returns once the kernel holds the bytes; the peer acknowledges them later. With a
    receiver that is not reading yet, part of what was written sits in the send queue: a counter
    read at once (``settle_timeout=0``, the flake notebook 19 once showed on a busy machine) misses
    it, the settling counter waits for the receiver and counts every byte."""
    import socket
    import threading
    import time

    def written_while_receiver_sleeps(settle_timeout):
        srv = socket.create_server(("127.0.0.1", 0))
        tx = socket.create_connection(srv.getsockname())
        rx, _ = srv.accept()
        tx.setblocking(False)
        drained = threading.Event()

        def drain():
            time.sleep(0.2)
            rx.settimeout(5)
            while not drained.is_set():
                try:
                    if not rx.recv(1 << 20):
                        break
                except TimeoutError:
                    break

        t = threading.Thread(target=drain, daemon=True)
        t.start()
        sent = 0
        with wire.WireCounter(exclude_port=None, settle_timeout=settle_timeout) as w:
            try:
                while sent < 64 << 20:
                    sent += tx.send(b"x" * (1 << 16))
            except BlockingIOError:
                pass  # both kernel buffers are full
        drained.set()
        tx.close()  # the receiver reads what is left, then the end of the stream, and stops
        t.join(10)
        for s in (rx, srv):  # closed only once the receiver is done with them (else it reads a closed socket)
            s.close()
        return sent, w.raw_bytes_sent

    sent, counted = written_while_receiver_sleeps(5.0)
    assert counted == sent
    sent, counted = written_while_receiver_sleeps(0)
    assert counted < sent


def test_counter_leaves_out_bytes_written_before_it(monkeypatch):
    """Bytes written before the block, still unacknowledged when it starts (a receiver that is not reading yet),
    are acknowledged inside it. The counter settles on entry, so it counts none of them; one that does not
    (``settle_timeout=0``, as before) counts them as the block's: how a weight sync's root once counted 33 KB of
    the preceding ZeRO step's messages (still in its send queue on a busy machine) as broadcast traffic."""
    import socket
    import threading

    read = threading.Event()  # the receiver starts reading when the counter settles, or inside the block
    real_settle = wire.settle

    def settle_and_read(*args, **kwargs):
        read.set()
        return real_settle(*args, **kwargs)

    monkeypatch.setattr(wire, "settle", settle_and_read)

    def counted_in_an_empty_block(settle_timeout):
        read.clear()
        srv = socket.create_server(("127.0.0.1", 0))
        tx = socket.create_connection(srv.getsockname())
        rx, _ = srv.accept()
        tx.setblocking(False)
        sent = 0
        try:
            while sent < 64 << 20:
                sent += tx.send(b"x" * (1 << 16))
        except BlockingIOError:
            pass  # both kernel buffers are full: part of it waits, unacknowledged, in tx's send queue
        queued = wire.send_queue_bytes()
        received = threading.Event()

        def drain():
            read.wait(10)
            got = 0
            rx.settimeout(5)
            while got < sent and (chunk := rx.recv(1 << 20)):
                got += len(chunk)
            received.set()

        t = threading.Thread(target=drain, daemon=True)
        t.start()
        with wire.WireCounter(exclude_port=None, settle_timeout=settle_timeout) as w:
            read.set()
            assert received.wait(10), "the receiver did not get the bytes"
            real_settle(None, 5)  # every acknowledgement has arrived inside the block
        for s in (tx, rx, srv):
            s.close()
        t.join(5)
        return queued, w.raw_bytes_sent

    queued, counted = counted_in_an_empty_block(5.0)
    assert queued > 0 and counted == 0, (queued, counted)
    queued, counted = counted_in_an_empty_block(0)
    assert counted >= queued > 0, (queued, counted)  # the old counter: the earlier bytes counted as the block's
