"""Weight synchronisation between RLHF trainer ranks and rollout ranks, on real ``torch.distributed`` ranks.

After every training step the rollout engines must generate with the new policy, so the trainer's
weights travel to them. Three ways, all run inside ranks started by ``mlsys_nb.launch``:

1. **file**: trainer rank 0 gathers the full weights, ``torch.save``s them, the rollouts ``torch.load``
   them after a barrier. Simple, works across machines with a shared file system; costs a disk
   write and read of the whole model.
2. **broadcast**: a combined group {trainer rank 0} ∪ rollout ranks; the weights go in *buckets* of
   at most ``bucket_bytes`` (flattened, one ``dist.broadcast`` each). The rollouts compute the same
   bucket plan from their own parameter shapes, so only payload travels. This is what OpenRLHF and
   verl do with NCCL between GPUs.
3. **shared memory** (co-located processes): the trainer keeps the full weights in one flat buffer in
   shared memory (``torch.multiprocessing`` with the ``file_system`` sharing strategy, whose handle
   any process on the machine can open); the rollouts open it once and their parameters become views
   into it: zero copies, and only the handle (a few hundred bytes) crosses a socket. On GPUs the same
   reduction path (``torch.multiprocessing.reductions.reduce_tensor``) produces CUDA IPC handles.

ZeRO-3 trainers hold only a shard of each parameter: ``buckets()`` gathers one unit at a time
(all-gather in the trainer group), copies its parameters into buckets and frees the unit again, so
the extra memory is one unit plus one bucket instead of the full model (``gather="full"``
materialises everything first: the memory spike of a naive full-weight gather). ``MemoryPeak`` measures
it: the high-water mark of the bytes torch's CPU allocator held on this thread during a block, from
``torch.profiler``'s allocation events (``profile_memory=True``); ``sync_broadcast(..., memory=True)``
puts it in ``SyncStats.peak_bytes``.

Every wait has a timeout: a broadcast that does not complete raises ``WeightSyncTimeout`` naming the
source rank and the rollout ranks.

One interface over every transport, ``WeightSync``: ``send(named_tensors)`` on the sender returns a handle,
``receive(handle)`` on a receiver returns ``{name: tensor}`` bit-equal to what was sent; ``name`` says
which transport, ``stats`` holds the last ``SyncStats``. ``FileSync``, ``BroadcastSync`` and
``SharedMemorySync`` are the three paths above (``sync_file``, ``sync_broadcast`` and ``SharedWeights``
move a model's weights with them), ``RayObjectStoreSync`` is Ray's object store between actors
(``mlsys_nb.rl.placement``).

Public names: ``WeightSync``, ``FileSync``, ``BroadcastSync``, ``SharedMemorySync``, ``RayObjectStoreSync``,
``tensor_layout``, ``Roles``, ``make_roles``, ``bucket_plan``, ``buckets``, ``sync_broadcast``, ``sync_file``,
``SharedWeights``, ``SyncStats``, ``MemoryPeak``, ``WeightSyncTimeout``, ``weights_equal``, ``toy_config``,
``toy_train_step``, ``broadcast_model_seconds``.
"""

from __future__ import annotations

import datetime
import os
import pickle
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..config import check_choice, check_int, check_multiple
from ..runtime.peak_memory import MemoryPeak
from ..runtime.timing import Laps

__all__ = [
    "BroadcastSync",
    "FileSync",
    "MemoryPeak",
    "RayObjectStoreSync",
    "Roles",
    "SharedMemorySync",
    "SharedWeights",
    "SyncStats",
    "WeightSyncTimeout",
    "broadcast_model_seconds",
    "bucket_plan",
    "buckets",
    "make_roles",
    "measure_weight_sync",
    "sync_broadcast",
    "sync_file",
    "toy_config",
    "toy_train_step",
    "tensor_layout",
    "WeightSync",
    "weights_equal",
]

PATHS = ("file", "broadcast", "shm")


class WeightSyncTimeout(TimeoutError):
    """A weight synchronisation did not complete in time; the message names the ranks involved."""


@dataclass
class Roles:
    """This rank's place: ``trainer_ranks``/``rollout_ranks`` (global ranks), the trainer group, the
    rollout group and the combined sync group {trainer_ranks[0]} ∪ rollout ranks."""

    rank: int
    trainer_ranks: list
    rollout_ranks: list
    train_group: object
    rollout_group: object
    sync_group: object
    timeout_s: float

    @property
    def is_trainer(self) -> bool:
        return self.rank in self.trainer_ranks

    @property
    def src(self) -> int:
        return self.trainer_ranks[0]


def make_roles(n_trainers: int, *, timeout_s: float = 30.0) -> Roles:
    """Split the running world: ranks ``0..n_trainers-1`` train, the rest roll out. Call on every rank
    (``new_group`` is collective). ``timeout_s`` bounds every wait of the groups made here."""
    world, rank = dist.get_world_size(), dist.get_rank()
    check_int(f"n_trainers (world_size={world}, at least one rollout rank)", n_trainers, 1, world - 1)
    t = datetime.timedelta(seconds=timeout_s)
    trainers, rollouts = list(range(n_trainers)), list(range(n_trainers, world))
    train_group = dist.new_group(trainers, timeout=t)
    rollout_group = dist.new_group(rollouts, timeout=t)
    sync_group = dist.new_group([trainers[0]] + rollouts, timeout=t)
    return Roles(rank, trainers, rollouts, train_group, rollout_group, sync_group, timeout_s)


@dataclass
class SyncStats:
    """One synchronisation, as seen by this rank: ``path``, payload ``nbytes`` (bytes of weights moved),
    ``seconds``, ``n_buckets``, ``peak_bytes`` (measured, ``MemoryPeak``: the most bytes torch's CPU
    allocator held for this rank's thread during the sync above the level at its start; ``None`` unless
    asked for), ``wire_sent``/``wire_received`` (bytes this rank's TCP sockets sent/received, if
    measured)."""

    path: str
    nbytes: int = 0
    seconds: float = 0.0
    n_buckets: int = 0
    peak_bytes: int | None = None
    wire_sent: int | None = None
    wire_received: int | None = None


def bucket_plan(shapes: list[tuple[str, torch.Size, torch.dtype]], bucket_bytes: int) -> list[list[int]]:
    """Indices of ``shapes`` grouped in order into buckets of at most ``bucket_bytes`` (a tensor bigger
    than a bucket travels alone). Trainer and rollouts compute the same plan from the same shapes."""
    check_int("bucket_bytes", bucket_bytes, 1)
    plan, cur, size = [], [], 0
    for i, (_, shape, dtype) in enumerate(shapes):
        n = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if cur and size + n > bucket_bytes:
            plan.append(cur)
            cur, size = [], 0
        cur.append(i)
        size += n
    if cur:
        plan.append(cur)
    return plan


def _shapes(model: nn.Module):
    return [(n, p.shape, p.dtype) for n, p in model.named_parameters()]


def _zero_units(zero):
    return {id(p): u for u in zero.units for p in u.params} if zero is not None else {}


def buckets(model: nn.Module, bucket_bytes: int, *, zero=None, gather: str = "bucketed"):
    """Yield ``(indices, flat)``: the model's parameters in ``bucket_plan`` order, each bucket flattened
    into one new tensor. Call on every trainer rank (ZeRO-3 gathers are collective in its group).

    ``zero``: a ``mlsys_nb.parallel.zero.ZeRO`` (stage 3) wrapping ``model``: a unit is gathered when
    a bucket first needs it and freed as soon as no later bucket does (``gather="bucketed"``), or every
    unit is gathered up front and the full state copied before the first bucket (``gather="full"``,
    the naive way: about twice the model's bytes at the peak; ``MemoryPeak`` measures both)."""
    check_choice("gather", gather, ("bucketed", "full"))
    params = [p for _, p in model.named_parameters()]
    plan = bucket_plan(_shapes(model), bucket_bytes)
    owner = _zero_units(zero)
    if zero is not None and zero.stage != 3:
        owner = {}  # stages 1-2 keep the full parameters on every rank
    full_copy = None
    if gather == "full":
        units = [u for u in zero.units if u in owner.values()] if owner else []  # same order on every rank
        for u in units:
            u.gather()
            u.wait()
        full_copy = [p.detach().clone() for p in params]  # the naive full state dict
        for u in units:
            u.free()
    last_use = {}
    for b, idx in enumerate(plan):
        for i in idx:
            if id(params[i]) in owner:
                last_use[id(owner[id(params[i])])] = b
    live = {}
    for b, idx in enumerate(plan):
        if full_copy is None:
            for i in idx:
                u = owner.get(id(params[i]))
                if u is not None and id(u) not in live:
                    u.gather()
                    u.wait()
                    live[id(u)] = u
        src = full_copy if full_copy is not None else params
        flat = torch.cat([src[i].detach().reshape(-1) for i in idx])
        yield idx, flat
        del flat
        for key, u in list(live.items()):
            if last_use[key] == b:
                u.free()
                del live[key]


def _release(flat: torch.Tensor) -> None:
    """Free a sent or received bucket's bytes now, on this thread: gloo's finished work may still hold a
    reference, and its worker thread would otherwise free them later (unseen by ``MemoryPeak``)."""
    flat.untyped_storage().resize_(0)


def _wait(work, roles: Roles, what: str) -> None:
    try:
        work.wait(datetime.timedelta(seconds=roles.timeout_s))
    except Exception as e:  # gloo raises RuntimeError on its timeout
        raise WeightSyncTimeout(
            f"weight sync ({what}) from trainer rank {roles.src} to rollout ranks {roles.rollout_ranks} did not "
            f"complete within {roles.timeout_s} s (this is rank {roles.rank}): a peer is missing or stuck "
            f"[{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}]"
        ) from e


# ---- one interface over the transports ---------------------------------------------------------
def tensor_layout(named) -> list[tuple[str, torch.Size, torch.dtype]]:
    """``[(name, shape, dtype), ...]`` of a ``{name: tensor}`` mapping or of a module's parameters, in order:
    what a receiver must know in advance to take tensors off a broadcast or out of shared memory."""
    if isinstance(named, nn.Module):
        return _shapes(named)
    return [(k, v.shape, v.dtype) for k, v in named.items()]


def _nbytes(shape, dtype) -> int:
    return torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()


class WeightSync(ABC):
    """Moves named tensors from one sender to its receivers.

    ``send(named_tensors)`` (the sender) returns a handle: what a receiver needs besides the transport
    itself (a path, an object reference; ``None`` where the transport is a collective). ``receive(handle)``
    (each receiver) returns ``{name: tensor}``, bit-equal to what was sent. ``name``: the transport's name;
    ``stats``: the ``SyncStats`` of this side's last ``send`` or ``receive`` (``None`` before one)."""

    name: str = ""

    def __init__(self) -> None:
        self.stats: SyncStats | None = None

    @abstractmethod
    def send(self, named_tensors: Mapping[str, torch.Tensor]):
        """Send ``named_tensors``; returns the handle for ``receive``."""

    @abstractmethod
    def receive(self, handle=None) -> dict[str, torch.Tensor]:
        """The tensors of the matching ``send``."""

    def _check_layout(self, named: Mapping[str, torch.Tensor], layout) -> None:
        want = {n: (tuple(s), d) for n, s, d in layout}
        got = {n: (tuple(t.shape), t.dtype) for n, t in named.items()}
        if got != want:
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            other = sorted(n for n in set(want) & set(got) if want[n] != got[n])
            raise ValueError(
                f"named_tensors do not match this {self.name} sync's layout: missing {missing}, unexpected {extra}, "
                f"other shape or dtype {other}"
            )


class FileSync(WeightSync):
    """``torch.save`` to ``path`` (written to ``path.tmp`` and renamed, so no reader sees half a file),
    ``torch.load(mmap=True)`` on the receivers. With ``roles`` (ranks of ``make_roles``), the sender is
    ``roles.src`` and the sync group's barriers order it: the file is read only after it was written, and
    the sender returns only after every receiver read it (so the next send may replace it). The handle is
    the path; ``stats.nbytes``: the file's size."""

    name = "file"

    def __init__(self, path: str, roles: Roles | None = None):
        super().__init__()
        self.path, self.roles = str(path), roles

    def send(self, named_tensors: Mapping[str, torch.Tensor]) -> str:
        clock = Laps()
        tmp = self.path + ".tmp"
        torch.save({k: v.detach() for k, v in named_tensors.items()}, tmp)
        os.replace(tmp, self.path)  # receivers never see a half-written file
        if self.roles is not None:
            _barrier(self.roles, "file written")
            _barrier(self.roles, "file read")  # the next send may overwrite the file only after every read
        self.stats = SyncStats(self.name, os.path.getsize(self.path), clock.elapsed())
        return self.path

    def receive(self, handle=None) -> dict[str, torch.Tensor]:
        clock = Laps()
        path = self.path if handle is None else str(handle)
        if self.roles is not None:
            _barrier(self.roles, "file written")
        state = torch.load(path, mmap=True, weights_only=True)
        if self.roles is not None:
            _barrier(self.roles, "file read")  # a replaced file leaves this mmap valid (os.replace: new inode)
        self.stats = SyncStats(self.name, os.path.getsize(path), clock.elapsed())
        return state


class BroadcastSync(WeightSync):
    """Bucketed ``dist.broadcast`` from ``roles.src`` to the rollout ranks in the sync group. Sender and
    receivers share ``layout`` (``tensor_layout``: names, shapes, dtypes in order) and so the same
    ``bucket_plan``: only payload travels. ``send``/``receive`` move each bucket as raw bytes (any mix of
    dtypes, bit-exact); ``send_bucket``/``receive_bucket`` move one flat tensor (``sync_broadcast``'s
    path for a model's weights). Every wait is bounded by ``roles.timeout_s`` (``WeightSyncTimeout``).
    The handle is ``None``: a broadcast is a collective."""

    name = "broadcast"

    def __init__(self, roles: Roles, layout=None, *, bucket_bytes: int = 1 << 20):
        super().__init__()
        check_int("bucket_bytes", bucket_bytes, 1)
        self.roles, self.layout, self.bucket_bytes = roles, list(layout or []), bucket_bytes

    def send_bucket(self, flat: torch.Tensor) -> int:
        """Broadcast one flat tensor from ``roles.src``; returns its bytes."""
        _wait(
            dist.broadcast(flat, src=self.roles.src, group=self.roles.sync_group, async_op=True),
            self.roles,
            "broadcast",
        )
        return flat.numel() * flat.element_size()

    def receive_bucket(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        """A new flat tensor of ``numel`` elements of ``dtype``, filled by the matching ``send_bucket``."""
        flat = torch.empty(numel, dtype=dtype)
        self.send_bucket(flat)  # the same collective on a receiving rank
        return flat

    def _plan(self):
        return bucket_plan([(n, s, torch.uint8) for n, s, _ in self._byte_layout()], self.bucket_bytes)

    def _byte_layout(self):
        return [(n, (_nbytes(s, d),), d) for n, s, d in self.layout]

    def send(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        clock = Laps()
        self._check_layout(named_tensors, self.layout)
        stats = SyncStats(self.name)
        for idx in self._plan():
            parts = [named_tensors[self.layout[i][0]].detach().contiguous().reshape(-1).view(torch.uint8) for i in idx]
            stats.nbytes += self.send_bucket(torch.cat(parts))
            stats.n_buckets += 1
        stats.seconds = clock.elapsed()
        self.stats = stats

    def receive(self, handle=None) -> dict[str, torch.Tensor]:
        clock = Laps()
        stats, out, sizes = SyncStats(self.name), {}, self._byte_layout()
        for idx in self._plan():
            flat = self.receive_bucket(sum(sizes[i][1][0] for i in idx), torch.uint8)
            off = 0
            for i in idx:
                name, shape, dtype = self.layout[i]
                k = sizes[i][1][0]
                chunk = flat[off : off + k]
                if off % torch.empty((), dtype=dtype).element_size():
                    chunk = chunk.clone()  # a typed view needs an aligned offset
                out[name] = chunk.view(dtype).view(shape)
                off += k
            stats.nbytes += flat.numel()
            stats.n_buckets += 1
        stats.seconds = clock.elapsed()
        self.stats = stats
        return out


class SharedMemorySync(WeightSync):
    """Co-located processes share one buffer: ``roles.src`` allocates ``layout``'s bytes (each tensor at an
    offset aligned to its element size) in shared memory (``torch.multiprocessing``, ``file_system``
    strategy; a CUDA buffer would give a CUDA IPC handle through the same path), and the receivers open it
    from its pickled handle (``handle_bytes`` crossed a socket, once, when every participant built this
    object: a collective over ``roles.src`` and the rollouts). ``send`` waits until every receiver called
    ``receive`` (done with the last views), copies the tensors in and waits at a second barrier;
    ``receive`` passes both and returns views into the shared pages: zero copies, valid until this
    receiver's next ``receive``. The handle of ``send`` is ``None``. (``SharedWeights``, whose rollout
    parameters are the views, publishes with the second barrier only: its rollouts read between syncs.)"""

    name = "shm"

    def __init__(self, roles: Roles, layout, *, device="cpu"):
        import torch.multiprocessing as mp
        from multiprocessing.reduction import ForkingPickler  # torch.multiprocessing registers tensors here

        super().__init__()
        mp.set_sharing_strategy("file_system")
        self.roles, self.layout, self.offsets = roles, list(layout), []
        end = 0
        for _, shape, dtype in self.layout:
            size = torch.empty((), dtype=dtype).element_size()
            start = -(-end // size) * size  # aligned, so a typed view of the bytes is allowed
            self.offsets.append(start)
            end = start + _nbytes(shape, dtype)
        self.nbytes, self.buffer, self.handle_bytes = end, None, None
        self.participant = roles.rank == roles.src or not roles.is_trainer
        payload = [None]
        if roles.rank == roles.src:
            self.buffer = torch.zeros(max(end, 1), dtype=torch.uint8, device=device)
            if self.buffer.device.type == "cpu":
                self.buffer.share_memory_()
            payload = [bytes(ForkingPickler.dumps(self.buffer))]  # CPU: file_system handle; CUDA: IPC handle
        if self.participant:
            dist.broadcast_object_list(payload, src=roles.src, group=roles.sync_group)
            self.handle_bytes = len(payload[0])
        if not roles.is_trainer:
            self.buffer = pickle.loads(payload[0])
        if self.participant:
            _barrier(roles, "shared memory opened")

    def view(self, i: int) -> torch.Tensor:
        """Tensor ``i`` of the layout as a view of the shared bytes."""
        _, shape, dtype = self.layout[i]
        start = self.offsets[i]
        return self.buffer[start : start + _nbytes(shape, dtype)].view(dtype).view(shape)

    def published(self) -> None:
        """The barrier after a write: the sender passes it once the new weights are in, receivers once
        they may read them. Participants only."""
        _barrier(self.roles, "shared weights published")

    def send(self, named_tensors: Mapping[str, torch.Tensor]) -> None:
        clock = Laps()
        self._check_layout(named_tensors, self.layout)
        _barrier(self.roles, "receivers ready for new shared weights")  # nobody reads the old ones any more
        with torch.no_grad():
            for i, (name, _, _) in enumerate(self.layout):
                self.view(i).copy_(named_tensors[name])
        self.published()
        self.stats = SyncStats(self.name, self.nbytes, clock.elapsed())

    def receive(self, handle=None) -> dict[str, torch.Tensor]:
        clock = Laps()
        _barrier(self.roles, "receivers ready for new shared weights")  # this side is done with the last views
        self.published()
        out = {name: self.view(i) for i, (name, _, _) in enumerate(self.layout)}
        self.stats = SyncStats(self.name, 0, clock.elapsed())  # nothing was copied on this side
        return out


class RayObjectStoreSync(WeightSync):
    """Ray's object store between actors (``mlsys_nb.rl.placement``): ``send`` puts the tensors in the
    store (``ray.put``: one serialised copy, shared by every reader on the node) and returns the
    ``ObjectRef``; ``receive(ref)`` gets them (``ray.get``, at most ``timeout_s``). A handle Ray already
    resolved (an ``ObjectRef`` passed as a task's top-level argument arrives as its value) is taken as
    it is."""

    name = "ray"

    def __init__(self, timeout_s: float = 60.0):
        super().__init__()
        self.timeout_s = timeout_s

    def send(self, named_tensors: Mapping[str, torch.Tensor]):
        import ray

        clock = Laps()
        state = {k: v.detach() for k, v in named_tensors.items()}
        ref = ray.put(state)
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        self.stats = SyncStats(self.name, nbytes, clock.elapsed())
        return ref

    def receive(self, handle=None) -> dict[str, torch.Tensor]:
        clock = Laps()
        if isinstance(handle, Mapping):
            state = dict(handle)
        else:
            import ray

            if handle is None:
                raise ValueError("handle: RayObjectStoreSync.receive needs the ObjectRef that send returned")
            state = dict(ray.get(handle, timeout=self.timeout_s))
        nbytes = sum(v.numel() * v.element_size() for v in state.values())
        self.stats = SyncStats(self.name, nbytes, clock.elapsed())
        return state


@torch.no_grad()
def sync_broadcast(
    model: nn.Module,
    roles: Roles,
    *,
    bucket_bytes: int = 1 << 20,
    zero=None,
    gather: str = "bucketed",
    wire: bool = False,
    memory: bool = False,
) -> SyncStats:
    """Send the trainer's weights to every rollout rank by bucketed broadcast in the sync group.

    Call on every rank: trainers (all of them, ZeRO-3 gathers are collective) pass their (wrapped)
    model, rollouts their engine's model of the same architecture. ``wire=True`` measures this rank's
    TCP bytes with ``mlsys_nb.comm.wire.WireCounter``; ``memory=True`` measures the peak bytes the sync
    allocated on this rank (``MemoryPeak``) into ``peak_bytes``. Returns this rank's ``SyncStats``."""
    stats = SyncStats("broadcast")
    in_sync = roles.rank == roles.src or not roles.is_trainer
    counter = None
    if wire:
        from ..comm.wire import WireCounter

        counter = WireCounter()
        counter.__enter__()
    peak = MemoryPeak().__enter__() if memory else None
    clock = Laps()
    channel = BroadcastSync(roles, bucket_bytes=bucket_bytes)
    if roles.is_trainer:
        for _, flat in buckets(model, bucket_bytes, zero=zero, gather=gather):
            if in_sync:
                stats.nbytes += channel.send_bucket(flat)
                stats.n_buckets += 1
                _release(flat)
            del flat
    else:
        params = [p for _, p in model.named_parameters()]
        for idx in bucket_plan(_shapes(model), bucket_bytes):
            flat = channel.receive_bucket(sum(params[i].numel() for i in idx), params[idx[0]].dtype)
            off = 0
            for i in idx:
                k = params[i].numel()
                params[i].copy_(flat[off : off + k].view_as(params[i]))
                off += k
            stats.nbytes += flat.numel() * flat.element_size()
            stats.n_buckets += 1
            _release(flat)
    stats.seconds = clock.elapsed()
    if peak is not None:
        peak.__exit__(None, None, None)
        stats.peak_bytes = peak.peak_bytes
    if counter is not None:
        counter.__exit__(None, None, None)
        stats.wire_sent, stats.wire_received = counter.raw_bytes_sent, counter.raw_bytes_received
    return stats


def _barrier(roles: Roles, what: str) -> None:
    _wait(dist.barrier(group=roles.sync_group, async_op=True), roles, what)


@torch.no_grad()
def sync_file(model: nn.Module, roles: Roles, path: str, *, zero=None, bucket_bytes: int = 1 << 20) -> SyncStats:
    """Trainer rank 0 writes the full weights to ``path`` (``torch.save``); after a barrier in the sync
    group every rollout loads them (``torch.load(mmap=True)``) into its model. ``nbytes`` = file size."""
    stats = SyncStats("file")
    clock = Laps()
    names = [n for n, _ in model.named_parameters()]
    if roles.is_trainer:
        state = {}
        for idx, flat in buckets(model, bucket_bytes, zero=zero):
            off = 0
            params = dict(model.named_parameters())
            for i in idx:
                p = params[names[i]]
                state[names[i]] = flat[off : off + p.numel()].view(p.shape).clone()
                off += p.numel()
        if roles.rank == roles.src:
            channel = FileSync(path, roles)
            channel.send(state)  # returns after every rollout read the file
            stats.nbytes = channel.stats.nbytes
    else:
        channel = FileSync(path, roles)
        model.load_state_dict(channel.receive(), strict=False)
        stats.nbytes = channel.stats.nbytes
    stats.seconds = clock.elapsed()
    return stats


class SharedWeights:
    """Zero-copy weights for co-located trainer and rollout processes (a model over ``SharedMemorySync``).

    The trainer (``roles.src``) builds ``SharedWeights(model, roles)``: one flat buffer in shared memory
    (``file_system`` strategy) that its own copy of the weights is written into by ``publish()``; the
    rollouts build ``SharedWeights(model, roles)`` too and, once, turn their parameters into views of
    the same pages. After that a sync is ``publish()`` (one memcpy on the trainer) plus a barrier:
    the rollouts read the new weights without copying. ``handle_bytes`` is what crossed a socket.
    On GPUs, ``reduce_tensor`` of a CUDA tensor produces a CUDA IPC handle through the same path
    (the flat buffer would then be allocated on the trainer's device; not run on this CPU machine).
    """

    def __init__(self, model: nn.Module, roles: Roles, *, zero=None):
        self.model, self.roles, self.zero = model, roles, zero
        params = [p for _, p in model.named_parameters()]
        if len({p.dtype for p in params}) != 1:
            raise ValueError(
                f"model: SharedWeights needs one parameter dtype, got {sorted({str(p.dtype) for p in params})}"
            )
        # the buffer, its handle and the barriers: SharedMemorySync (a collective over src and the rollouts)
        self.channel = SharedMemorySync(roles, _shapes(model), device=params[0].device)
        self.nbytes = self.channel.nbytes
        if self.channel.participant:
            self.handle_bytes = self.channel.handle_bytes
            self.flat = self.channel.buffer[: self.nbytes].view(params[0].dtype)  # one dtype: no alignment gaps
        if not roles.is_trainer:
            for i, p in enumerate(params):  # parameters become views into the shared pages: zero copies from now on
                p.data = self.channel.view(i)

    @torch.no_grad()
    def publish(self) -> SyncStats:
        """Trainers: gather (ZeRO-3) and write the weights into the shared buffer; rollouts: wait for it.
        Call on every rank after each training step."""
        stats = SyncStats("shm")
        clock = Laps()
        roles = self.roles
        if roles.is_trainer:
            off = 0
            for _, flat in buckets(self.model, 1 << 20, zero=self.zero):
                if roles.rank == roles.src:
                    self.flat[off : off + flat.numel()].copy_(flat)
                off += flat.numel()
                stats.n_buckets += 1
            stats.nbytes = off * self.flat.element_size() if roles.rank == roles.src else 0
        if self.channel.participant:
            self.channel.published()
        stats.seconds = clock.elapsed()
        return stats


def weights_equal(model: nn.Module, roles: Roles, *, zero=None) -> bool:
    """True on every rank iff each rollout's parameters equal trainer rank 0's bit for bit (the
    independent reference: a plain ``dist.broadcast`` of each full parameter, compared with
    ``torch.equal``). Collective over the world."""
    ok = torch.ones(1)
    params = [p for _, p in model.named_parameters()]
    owner = _zero_units(zero) if zero is not None and zero.stage == 3 else {}
    for p in params:
        u = owner.get(id(p))
        if u is not None:
            u.gather()
            u.wait()
        ref = p.detach().clone()
        if u is not None:
            u.free()
        dist.broadcast(ref, src=roles.src)
        if not roles.is_trainer and not torch.equal(ref, p.detach()):
            ok.zero_()
    dist.all_reduce(ok, op=dist.ReduceOp.MIN)
    return bool(ok.item())


def toy_config(hidden: int = 32, n_layers: int = 2, *, vocab: int = 257, seq_len: int = 64):
    """``config.tiny_config`` for the trainer and rollouts: byte vocabulary, Llama style, one head per 16
    channels (MHA), the default SwiGLU width."""
    from ..config import tiny_config

    return tiny_config(
        n_layers=n_layers,
        hidden=hidden,
        n_heads=max(1, hidden // 16),
        n_kv_heads=None,
        ffn_hidden=None,
        vocab_size=vocab,
        seq_len=seq_len,
    )


def toy_train_step(
    model: nn.Module, optimizer, *, step: int, zero=None, group=None, batch: int = 2, seq: int = 16
) -> float:
    """One gradient step on a toy objective (next-token loss on random bytes, seeded by ``step`` and
    the rank): stands in for the RLHF loss. Returns the loss."""
    g = torch.Generator().manual_seed(1000 * step + dist.get_rank())
    vocab = model.cfg.vocab_size
    x = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    loss = model(x[:, :-1], x[:, 1:])
    if isinstance(loss, tuple):
        loss = loss[0]
    loss.backward()
    if zero is not None:
        zero.step()
        zero.zero_grad()
    else:
        n = dist.get_world_size(group)
        for p in model.parameters():  # plain DDP-style average over the trainer group
            if p.grad is not None:
                dist.all_reduce(p.grad, group=group)
                p.grad.div_(n)
        optimizer.step()
        optimizer.zero_grad()
    return float(loss)


def broadcast_model_seconds(
    nbytes: float, n: int, alpha_s: float, beta_bytes_per_s: float, bucket_bytes: float | None = None
) -> float:
    """α-β model of the bucketed broadcast: ``k`` buckets of ``nbytes/k`` each over gloo's binomial
    tree (``mlsys_nb.comm.cost.collective_time("broadcast", ..., algorithm="binomial_tree")``), so
    ``T = k·⌈log2 n⌉·α + ⌈log2 n⌉·nbytes/β``. Seconds."""
    from ..comm.cost import collective_time

    k = 1 if not bucket_bytes else max(1, -(-int(nbytes) // int(bucket_bytes)))
    return k * collective_time("broadcast", nbytes / k, n, alpha_s, beta_bytes_per_s, algorithm="binomial_tree")


def _measure_rank(hiddens, n_layers, bucket_bytes, tmpdir, repeats):
    from ..models import Transformer
    from ..runtime.timing import median

    roles = make_roles(1, timeout_s=60)
    rows = []
    for h in hiddens:
        torch.manual_seed(0 if roles.is_trainer else 1)  # rollouts start from other weights
        model = Transformer(toy_config(h, n_layers))
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        shared = None
        for path in PATHS:
            if path == "shm":
                shared = SharedWeights(model, roles)
            stats = []
            for _ in range(repeats):
                dist.barrier()
                if path == "broadcast":
                    stats.append(sync_broadcast(model, roles, bucket_bytes=bucket_bytes, wire=True))
                elif path == "file":
                    stats.append(sync_file(model, roles, os.path.join(tmpdir, "weights.pt")))
                else:
                    stats.append(shared.publish())
            rows.append(
                {
                    "hidden": h,
                    "path": path,
                    "model_bytes": nbytes,
                    "seconds": median(s.seconds for s in stats),
                    "wire_sent": stats[-1].wire_sent,
                    "wire_received": stats[-1].wire_received,
                    "moved_bytes": stats[-1].nbytes,
                    "equal": weights_equal(model, roles),
                }
            )
            with torch.no_grad():  # perturb the trainer so the next path has something to move
                if roles.is_trainer:
                    for p in model.parameters():
                        p.add_(1e-3)
        if roles.is_trainer:
            rows[-1]["handle_bytes"] = shared.handle_bytes
    return rows


def measure_weight_sync(
    hiddens=(64, 128, 256),
    *,
    n_rollouts: int = 1,
    n_layers: int = 2,
    bucket_bytes: int = 1 << 20,
    repeats: int = 3,
    timeout: float = 120.0,
    workdir: str | None = None,
) -> list[dict]:
    """Measure the three paths on real ranks (1 trainer + ``n_rollouts``) for toy models of widths ``hiddens``.

    Returns one row per (hidden, path) as seen by the trainer: ``model_bytes``, median ``seconds``, the
    bytes it moved and its wire bytes (broadcast only), ``equal`` (every rollout bit-equal after the
    sync), plus ``rollout_wire_received`` from rollout 1. Validates arguments before any rank starts."""
    import tempfile

    from .. import launch

    check_int("n_rollouts (on this kit's local ranks)", n_rollouts, 1, 3)
    check_int("len(hiddens)", len(hiddens), 1)
    for h in hiddens:
        check_multiple("each of hiddens", h, 16, "the head width")  # toy_config: one head per 16 channels
    with tempfile.TemporaryDirectory(dir=workdir) as d:
        out = launch(
            _measure_rank,
            world_size=1 + n_rollouts,
            args=(tuple(hiddens), n_layers, bucket_bytes, d, repeats),
            timeout=timeout,
            output="quiet",
        )
    rows = out[0]
    for r, rr in zip(rows, out[1]):
        r["rollout_wire_received"] = rr["wire_received"]
        r["rollout_seconds"] = rr["seconds"]
    return rows
