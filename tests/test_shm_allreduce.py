"""The shared-memory all-reduce (``mlsys_nb.comm.shm``) on real gloo ranks.

Equal to ``dist.all_reduce`` (exact on integer-valued inputs; bit for bit the stated order, ranks 0..n-1 summed
in float32, on random ones), odd sizes, sizes larger than the buffer, three dtypes, both synchronisations; no
segment name left once set up, nor after a rank is killed mid-call (its peers get ``ShmTimeoutError`` naming
it); refused across hosts; and the mutation: with the flag stored before the (delayed) data, sums are wrong.
"""

import json
import os
import signal
from multiprocessing import shared_memory

import pytest

import mlsys_nb
from mlsys_nb.comm.shm import ShmAllReduce
from mlsys_nb.runtime import RankError

BUFFER = 4096  # bytes: small, so the larger sizes below go through in several chunks
NUMELS = (1, 3, 1001, 3 * 1024 + 5)  # odd sizes; the last is 12 KiB of float32 (3+ chunks), 6 KiB of bf16
DTYPES = ("float32", "bfloat16", "float16")
VARIANTS = (("flags", 0), ("barrier", 0), ("flags", 1024))  # (sync, one_shot_bytes): two-shot, and one-shot
# for chunks up to 1 KiB (the 1-, 3- and 1001-element bf16/fp16 ones; odd-sized two-shot slices otherwise)


def _gone(name: str) -> bool:
    """True when no segment of that name exists (the shared_memory API: macOS has no /dev/shm to list)."""
    try:
        shm = shared_memory.SharedMemory(name=name)
    except FileNotFoundError:
        return True
    shm.close()
    return False


def _equality_checks(numels, dtypes, buffer_bytes):
    """On every rank: for each (sync, dtype, numel, inputs) the checks that must hold (True)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    out, names = {}, []
    for sync, one_shot in VARIANTS:
        shm = ShmAllReduce(sync=sync, buffer_bytes=buffer_bytes, one_shot_bytes=one_shot, timeout=30)
        names += shm.names
        for dtype in (getattr(torch, d) for d in dtypes):
            for numel in numels:
                g = torch.Generator().manual_seed(1000 * rank + numel)
                ints = torch.randint(-50, 50, (numel,), generator=g).to(dtype)
                rand = torch.randn(numel, generator=g).to(dtype)
                for kind, x in (("integers", ints), ("random", rand)):
                    ref = x.clone()
                    dist.all_reduce(ref)
                    peers = [torch.empty(numel) for _ in range(n)]
                    dist.all_gather(peers, x.float())  # every rank's input (exact in float32)
                    stated = sum(peers[1:], peers[0]).to(dtype)  # ((x0 + x1) + x2) + x3 in float32, rounded once
                    y = x.clone()
                    assert shm(y) is y  # in place
                    key = (sync, one_shot, str(dtype), numel, kind)
                    out[key + ("stated order, bit for bit",)] = bool(torch.equal(y, stated))
                    if kind == "integers":
                        out[key + ("equal to dist.all_reduce",)] = bool(torch.equal(y, ref))
                    else:  # gloo sums in another order: within a few roundings of the dtype
                        tol = 1e-5 if dtype == torch.float32 else 4e-2
                        out[key + ("close to dist.all_reduce",)] = bool(torch.allclose(y, ref, rtol=tol, atol=tol * n))
        x = torch.arange(12.0).reshape(3, 4).t() + rank  # not contiguous, averaged
        shm(x, "avg")
        out[(sync, one_shot, "avg, non-contiguous")] = bool(
            torch.equal(x, torch.arange(12.0).reshape(3, 4).t() + (n - 1) / 2)
        )
        shm.close()
    if n == 4:  # two groups of two ranks, each with its own segments
        pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
        with ShmAllReduce(pairs[rank // 2]) as shm:
            names += shm.names
            x = torch.full((5,), rank + 1.0)
            pair = rank // 2 * 2
            out[("sub-group", rank // 2)] = bool(torch.equal(shm(x), torch.full((5,), pair + 1.0 + pair + 2.0)))
    return out, names


@pytest.fixture(scope="module", params=[2, 4])
def equality(request):
    return request.param, mlsys_nb.launch(
        _equality_checks, request.param, args=(NUMELS, DTYPES, BUFFER), backend="gloo", timeout=120
    )


def test_equal_to_dist_all_reduce_and_to_the_stated_order(equality):
    n, per_rank = equality
    for rank, (checks, _) in enumerate(per_rank):
        failed = [k for k, ok in checks.items() if not ok]
        assert not failed, f"{n} ranks, rank {rank}: {failed}"
        assert len(checks) == len(VARIANTS) * (len(DTYPES) * len(NUMELS) * 4 + 1) + (n == 4)


def test_no_segment_name_is_left(equality):
    _, per_rank = equality
    names = per_rank[0][1]
    pairs = 2 if len(per_rank) == 4 else 0  # the 4-rank run adds two groups of two
    assert len(set(names)) == len(names) == len(VARIANTS) * len(per_rank) + pairs  # one segment per rank, per group
    assert all(_gone(name) for name in names), "a shared-memory segment outlived its setup"


def test_a_rank_killed_mid_call_leaves_no_segment_and_its_peers_time_out(tmp_path):
    record = tmp_path / "names.json"

    def body():
        import torch
        import torch.distributed as dist

        class DiesWhileStaging(ShmAllReduce):
            def publish(self, dst, src, flag):
                if dist.get_rank() == 2 and self.calls == 2:
                    os.kill(os.getpid(), signal.SIGKILL)  # data half written, flag never raised
                super().publish(dst, src, flag)

        shm = DiesWhileStaging(timeout=1.0)
        if dist.get_rank() == 0:
            record.write_text(json.dumps(shm.names))
        shm(torch.ones(100))
        shm(torch.ones(100))

    with pytest.raises(RankError) as err:
        mlsys_nb.launch(body, 3, backend="gloo", timeout=60, output="quiet")
    text = str(err.value)
    assert "ShmTimeoutError" in text and "rank 2 of 3" in text and "has not staged its input within 1 s" in text
    names = json.loads(record.read_text())
    assert len(names) == 3 and all(_gone(name) for name in names)


def test_ranks_on_two_hosts_and_a_full_dev_shm_are_refused_on_every_rank():
    def body():
        import socket

        import torch.distributed as dist

        from mlsys_nb.comm import shm

        errors = []
        free = shm.dev_shm_free_bytes
        shm.dev_shm_free_bytes = lambda: 10 << 20  # 10 MiB free: less than two segments of 8 MiB
        try:
            shm.ShmAllReduce()
        except RuntimeError as e:
            errors.append(str(e))
        shm.dev_shm_free_bytes = free
        if dist.get_rank() == 1:
            socket.gethostname = lambda: "elsewhere"  # what another host would report
        try:
            shm.ShmAllReduce()
        except RuntimeError as e:
            errors.append(str(e))
        return errors

    for space, hosts in mlsys_nb.launch(body, 2, backend="gloo", timeout=60):
        assert "needs 16 MiB of /dev/shm (2 segments of 8.0 MiB), 10 MiB free" in space and "--shm-size" in space
        assert (
            "needs every rank on one host: the ranks run on 2 hosts (rank 0: " in hosts and "rank 1: elsewhere" in hosts
        )


def test_the_flag_before_the_data_gives_wrong_sums():
    """The mutation: rank 0 raises its flag first and writes its data late. Rank 1 reads what rank 0's buffer
    held before (zeros, or rank 0's input where the sum belongs), so both ranks get wrong sums (rank 0 gathers
    rank 1's wrong slice); the correct order, same inputs, is right."""

    def body():
        import time

        import torch
        import torch.distributed as dist

        class FlagFirst(ShmAllReduce):
            def publish(self, dst, src, flag):
                if self.rank != 0:
                    return super().publish(dst, src, flag)
                self.post_flag(flag)  # rank 0 stores its flag first ...
                time.sleep(0.5)
                dst.copy_(src)  # ... and its data late

        rank, n = dist.get_rank(), dist.get_world_size()
        want = torch.full((64,), float(sum(range(1, n + 1))))
        sums = {}
        for cls in (ShmAllReduce, FlagFirst):
            with cls(sync="flags", one_shot_bytes=0) as shm:  # two-shot: rank 0 reads rank 1's wrong slice
                sums[cls.__name__] = [bool(torch.equal(shm(torch.full((64,), rank + 1.0)), want)) for _ in range(2)]
        return sums

    per_rank = mlsys_nb.launch(body, 2, backend="gloo", timeout=60)
    assert all(s["ShmAllReduce"] == [True, True] for s in per_rank)
    assert all(not all(s["FlagFirst"]) for s in per_rank), per_rank  # every rank got a wrong sum


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="sync='fast' is not allowed"):
        ShmAllReduce(sync="fast")
    with pytest.raises(ValueError, match="buffer_bytes"):
        ShmAllReduce(buffer_bytes=8)


def _kit_checks():
    """DDP buckets and a TP MLP, each run with dist.all_reduce then with the shared-memory one (2 ranks: a
    sum of two is the same in any order, so the results must be equal bit for bit)."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from mlsys_nb.config import tiny_config
    from mlsys_nb.parallel import functional as pf
    from mlsys_nb.parallel import tensor as tp
    from mlsys_nb.parallel.ddp import DataParallel

    rank, out = dist.get_rank(), {}
    x = torch.randn(6, 8, generator=torch.Generator().manual_seed(rank))  # each rank's shard of the batch
    grads = {}
    for impl in (None, "shm"):
        torch.manual_seed(0)  # the same replicas; buckets of 300 bytes: several all-reduces per backward
        net = DataParallel(
            nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)), bucket_cap_mb=3e-4, all_reduce=impl
        )
        net(x).square().sum().backward()
        grads[impl] = [p.grad.clone() for p in net.parameters()]
    out["ddp: buckets"], out["ddp: shm calls"] = len(net.buckets), net.all_reduce.calls
    net.close()
    out["ddp: grads equal"] = all(torch.equal(a, b) for a, b in zip(grads[None], grads["shm"]))

    cfg = tiny_config()
    torch.manual_seed(0)
    mlp = tp.TPMLP(cfg)
    h = torch.randn(2, 16, cfg.hidden, generator=torch.Generator().manual_seed(7), requires_grad=True)
    runs = []
    for impl in (None, ShmAllReduce()):
        previous = pf.set_all_reduce(impl)
        h.grad = None
        mlp.zero_grad()
        y = mlp(h)
        y.square().sum().backward()
        runs.append([y.detach().clone(), h.grad.clone()] + [p.grad.clone() for p in mlp.parameters()])
        pf.set_all_reduce(previous)
        if impl is not None:
            out["tp: shm calls"] = impl.calls
            impl.close()
    out["tp: equal"] = all(torch.equal(a, b) for a, b in zip(*runs))
    return out


def test_the_kit_all_reduces_through_shared_memory_with_the_same_results():
    for rank, out in enumerate(mlsys_nb.launch(_kit_checks, 2, backend="gloo", timeout=120)):
        assert out["ddp: buckets"] >= 2 and out["ddp: shm calls"] == out["ddp: buckets"], (rank, out)
        assert out["ddp: grads equal"], (rank, out)
        assert out["tp: shm calls"] == 2 and out["tp: equal"], (rank, out)  # g forward, f backward


def test_a_peer_one_chunk_ahead_is_fine_and_different_sizes_are_refused():
    """One-shot chunks have one wait, so a fast peer may stage the next chunk (other buffer, other size) while
    this rank still checks the sizes of the current one: that is no mismatch. Ranks passing different sizes
    are refused with a ValueError naming both sizes."""

    def body():
        import time

        import torch
        import torch.distributed as dist

        class SlowAfterWaits(ShmAllReduce):
            def wait(self, flag, what):
                super().wait(flag, what)
                if self.rank == 0:
                    time.sleep(0.2)  # rank 1 runs ahead into the next call meanwhile

        rank, out = dist.get_rank(), {}
        with SlowAfterWaits(sync="flags") as shm:
            sums = [shm(torch.ones(numel)) for numel in (10, 20, 30, 40)]
            out["ahead"] = [bool(torch.equal(s, torch.full_like(s, 2.0))) for s in sums]
        with ShmAllReduce(sync="flags") as shm:
            try:
                shm(torch.ones(10 + 10 * rank))
            except ValueError as e:
                out["mismatch"] = str(e)
        return out

    for out in mlsys_nb.launch(body, 2, backend="gloo", timeout=60):
        assert out["ahead"] == [True] * 4
        assert "all-reduces a chunk of" in out["mismatch"] and "every rank must pass the same numel" in out["mismatch"]
