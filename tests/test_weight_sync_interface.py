"""``weight_sync.WeightSync``: every transport round-trips random named tensors bit-exactly (the reference:
the test's own tensors, compared with ``torch.equal``), and a transport that drops or corrupts one fails
the same check. Ray's object store is exercised by tests/test_placement.py (its runs sync through
``RayObjectStoreSync`` and compare the rollout's weights with the trainer's bit for bit)."""

import pytest
import torch

from mlsys_nb import launch
from mlsys_nb.rl import weight_sync as ws


def _named(seed: int) -> dict[str, torch.Tensor]:
    """Random tensors of mixed dtypes and shapes, including a scalar and an empty one."""
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(5, 7, generator=g),
        "half": torch.randn(3, 3, generator=g).to(torch.bfloat16),
        "fp16": torch.randn(11, generator=g).half(),  # 22 bytes: the next tensor needs an aligned offset
        "ids": torch.randint(-(2**40), 2**40, (4,), generator=g),
        "scale": torch.randn((), generator=g),
        "empty": torch.zeros(0, 4),
        "mask": torch.rand(6, generator=g) > 0.5,
        "big": torch.randn(3000, generator=g),  # more than one bucket at bucket_bytes=4096
    }


def round_trip_equal(sent: dict, got: dict) -> bool:
    """Same names, and each tensor bit-equal (shape, dtype and values)."""
    return sent.keys() == got.keys() and all(
        got[k].dtype == v.dtype and got[k].shape == v.shape and torch.equal(got[k], v) for k, v in sent.items()
    )


def _ranks(tmpdir: str, seed: int):
    import torch.distributed as dist

    roles = ws.make_roles(1, timeout_s=30)
    named = _named(seed) if roles.is_trainer else None
    layout = ws.tensor_layout(_named(seed))  # shapes and dtypes, known to receivers in advance
    out = {}
    channels = [
        ws.FileSync(f"{tmpdir}/w.pt", roles),
        ws.BroadcastSync(roles, layout, bucket_bytes=4096),
        ws.SharedMemorySync(roles, layout),
    ]
    for ch in channels:
        for step in range(2):  # twice: the second send replaces the first (new values, same layout)
            if roles.is_trainer:
                named = {k: v + step if v.dtype.is_floating_point else v for k, v in _named(seed).items()}
                ch.send(named)
            else:
                got = ch.receive()
                out[f"{ch.name}:{step}"] = {k: v.clone() for k, v in got.items()}
                out[f"{ch.name}:stats"] = (ch.stats.nbytes, ch.stats.n_buckets)
    dist.barrier()
    return out


@pytest.fixture(scope="module")
def received(tmp_path_factory):
    d = tmp_path_factory.mktemp("wsi")
    return launch(_ranks, world_size=3, args=(str(d), 7), timeout=120, output="quiet")


@pytest.mark.parametrize("transport", ["file", "broadcast", "shm"])
def test_every_transport_round_trips_named_tensors_bit_exactly(received, transport):
    for rank in (1, 2):  # both rollouts
        for step in range(2):
            sent = {k: v + step if v.dtype.is_floating_point else v for k, v in _named(7).items()}
            assert round_trip_equal(sent, received[rank][f"{transport}:{step}"]), (rank, transport, step)
    if transport == "broadcast":
        nbytes, n_buckets = received[1]["broadcast:stats"]
        assert nbytes == sum(v.numel() * v.element_size() for v in _named(7).values()) and n_buckets > 1


class _Dropping(ws.FileSync):
    """Broken on purpose: loses one tensor."""

    def receive(self, handle=None):
        out = super().receive(handle)
        out.pop("ids")
        return out


class _Corrupting(ws.FileSync):
    """Broken on purpose: flips one bit of one tensor."""

    def receive(self, handle=None):
        out = {k: v.clone() for k, v in super().receive(handle).items()}
        out["half"].view(torch.int16)[0, 0] ^= 1
        return out


def test_the_check_fails_for_a_transport_that_drops_or_corrupts_a_tensor(tmp_path):
    sent = _named(3)
    good, drop, flip = (cls(str(tmp_path / f"{cls.__name__}.pt")) for cls in (ws.FileSync, _Dropping, _Corrupting))
    for ch in (good, drop, flip):
        assert ch.send(sent) == ch.path and ch.name == "file"
    assert round_trip_equal(sent, good.receive())  # single process (no roles): the plain file transport
    assert not round_trip_equal(sent, drop.receive())
    assert not round_trip_equal(sent, flip.receive())


def test_ray_receive_takes_a_resolved_handle_and_refuses_none():
    state = _named(5)
    assert round_trip_equal(state, ws.RayObjectStoreSync().receive(state))  # what Ray hands an actor argument
    with pytest.raises(ValueError, match="handle"):
        ws.RayObjectStoreSync().receive(None)


def test_layout_mismatch_names_the_tensors():
    class _Roles:  # BroadcastSync checks the layout before any collective
        rank, src, is_trainer, timeout_s = 0, 0, True, 1.0

    layout = ws.tensor_layout(_named(1))
    bad = dict(_named(1))
    bad.pop("w")
    bad["scale"] = torch.zeros(2)
    with pytest.raises(ValueError, match=r"missing \['w'\].*other shape or dtype \['scale'\]"):
        ws.BroadcastSync(_Roles(), layout).send(bad)
