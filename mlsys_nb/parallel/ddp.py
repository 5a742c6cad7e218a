"""Data parallelism from scratch: every rank holds the whole model and a shard of the batch.

Why it works: the loss of a batch split into N equal shards is the mean of the
shard losses, so its gradient is the mean of the shard gradients. Averaging gradients with
``all_reduce(SUM) / N`` before the optimizer step makes every rank take exactly the step that
single-process training on the full batch would take; the replicas stay identical.

Three versions, each a refinement of the previous one:

1. ``allreduce_gradients(model)``: after ``loss.backward()``, one blocking all-reduce per
   parameter (naive: many small messages, and the network idles while backward computes).
2. ``DataParallel(model, bucket_cap_mb=25, overlap=False)``: gradients packed into buckets of about
   ``bucket_cap_mb`` MB (fewer, larger messages), all-reduced after backward.
3. ``DataParallel(model, overlap=True)`` (the default): a bucket's all-reduce starts *during*
   backward, as soon as its last gradient is ready (hooks + async work handles), so communication
   of late layers overlaps with the backward of early layers. Like PyTorch's DDP, the end of
   ``loss.backward()`` waits for the buckets, so the grads are averaged when backward returns.

The bucket all-reduce is ``dist.all_reduce`` (asynchronous) unless ``DataParallel(..., all_reduce=...)``
names another: ``"shm"`` (``mlsys_nb.comm.shm.ShmAllReduce`` over the group: shared memory among the ranks of
one host, blocking, so a bucket's all-reduce then runs inside the hook instead of overlapping) or any
callable that sums a flat tensor over the group in place. The averaged gradients are the same.

Gradient accumulation: inside ``with ddp.no_sync():`` backward only accumulates local gradients;
the next backward outside the context all-reduces the accumulated sum (one all-reduce for k
micro-batches). Divide each micro-batch loss by k, as in single-process accumulation.

Communication per step per rank: one all-reduce of all gradients, ``2(N-1)/N · Ψ`` elements
(Li et al. 2020, arXiv:2006.15704), whatever the bucket size. ``timeline`` records, for each bucket, when its
gradients were ready, when its all-reduce was launched and when it completed (seconds,
``time.perf_counter``), which notebook 05 plots per rank.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from ..config import check_number

from torch import nn


def allreduce_gradients(model: nn.Module, group=None) -> None:
    """Naive DDP: average every parameter's gradient over the ranks, one blocking all-reduce each."""
    world = dist.get_world_size(group)
    for p in model.parameters():
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM, group=group)
            p.grad /= world  # SUM then divide: ReduceOp.AVG is not portable to old gloo


def broadcast_parameters(model: nn.Module, src: int = 0, group=None) -> None:
    """Make every replica start identical: copy rank ``src``'s parameters and buffers to all."""
    with torch.no_grad():
        for t in list(model.parameters()) + list(model.buffers()):
            dist.broadcast(t, src=src, group=group)


class Bucket:
    """A group of parameters whose gradients are all-reduced together as one flat tensor."""

    def __init__(self, index: int, params: list[nn.Parameter], all_reduce=None):
        self.index = index
        self.all_reduce = all_reduce  # None: dist.all_reduce, asynchronous; else a blocking in-place sum
        self.params = params
        self.numel = sum(p.numel() for p in params)
        self.pending = len(params)  # gradients not yet ready in this backward
        self.flat: torch.Tensor | None = None
        self.work = None  # async work handle of the in-flight all-reduce
        self.t_ready = self.t_launch = self.t_done = None

    def launch(self, group) -> None:
        """Pack the gradients into one flat tensor and start its all-reduce without waiting (with
        ``self.all_reduce``, e.g. ``comm.shm.ShmAllReduce``: blocking, done when it returns)."""
        self.t_launch = time.perf_counter()
        self.flat = torch.cat([p.grad.reshape(-1) for p in self.params])
        if self.all_reduce is not None:
            self.all_reduce(self.flat)
            self.t_done = time.perf_counter()
            self.work = torch.futures.Future()
            self.work.set_result(self.flat)  # a finished handle: finish() waits on it like on gloo's
            return
        self.work = dist.all_reduce(self.flat, op=dist.ReduceOp.SUM, group=group, async_op=True)
        self.work.get_future().then(self._mark_done)

    def _mark_done(self, fut):
        self.t_done = time.perf_counter()  # runs in the communication thread when the data arrived
        return fut.value()

    def finish(self, world: int) -> None:
        """Wait for the all-reduce, then write the averaged gradients back into ``p.grad``."""
        self.work.wait()
        self.t_done = self.t_done or time.perf_counter()
        offset = 0
        for p in self.params:
            n = p.numel()
            p.grad.copy_(self.flat[offset : offset + n].view_as(p.grad)).div_(world)
            offset += n
        self.flat = self.work = None
        self.pending = len(self.params)


class DataParallel(nn.Module):
    """DDP from scratch: bucketed gradient all-reduce, overlapped with backward by default.

    ``bucket_cap_mb``: bucket size in MB (1e6 bytes) of gradients; 0 puts each parameter in its own
    bucket. ``overlap``: launch each bucket's all-reduce from a gradient hook during backward
    (True) or all of them after backward (False). Parameters are assigned to buckets in reverse
    registration order, which is roughly the order backward produces their gradients. Every
    parameter must receive a gradient in every backward (no unused parameters). ``all_reduce``: ``None``
    (``dist.all_reduce``), ``"shm"`` (a ``comm.shm.ShmAllReduce`` of the group, made here: a collective call;
    ``close()`` releases it) or a callable summing a flat tensor over the group in place.
    """

    def __init__(
        self, module: nn.Module, *, bucket_cap_mb: float = 25.0, overlap: bool = True, group=None, all_reduce=None
    ):
        super().__init__()
        check_number("bucket_cap_mb", bucket_cap_mb, 0, unit="MB")
        if not (all_reduce is None or all_reduce == "shm" or callable(all_reduce)):
            raise ValueError(f"all_reduce={all_reduce!r}: None (dist.all_reduce), 'shm' or a callable")
        if all_reduce == "shm":
            from ..comm.shm import ShmAllReduce

            all_reduce = ShmAllReduce(group)
        self.all_reduce = all_reduce
        self.module, self.overlap, self.group = module, overlap, group
        self.world = dist.get_world_size(group)
        broadcast_parameters(module, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        self.require_sync = True
        self.timeline: list[dict] = []
        self._callback_queued = False
        self.buckets = self.make_buckets(bucket_cap_mb * 1e6)
        for bucket in self.buckets:
            for p in bucket.params:
                p.register_post_accumulate_grad_hook(self.make_hook(bucket))

    def make_buckets(self, cap_bytes: float) -> list[Bucket]:
        """Cut the parameters, in reverse registration order, into buckets of at most ``cap_bytes``
        bytes of gradients (a parameter bigger than the cap gets a bucket of its own)."""
        params = [p for p in self.module.parameters() if p.requires_grad][::-1]
        groups, current, size = [], [], 0
        for p in params:
            if current and size + p.numel() * p.element_size() > cap_bytes:
                groups.append(current)
                current, size = [], 0
            current.append(p)
            size += p.numel() * p.element_size()
        if current:
            groups.append(current)
        return [Bucket(i, g, self.all_reduce) for i, g in enumerate(groups)]

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextmanager
    def no_sync(self):
        """Accumulate gradients locally (no communication) for backwards run inside this block."""
        previous, self.require_sync = self.require_sync, False
        try:
            yield
        finally:
            self.require_sync = previous

    def make_hook(self, bucket: Bucket):
        """The ``post_accumulate_grad_hook`` of each parameter of ``bucket``: counts the bucket's
        gradients down and, with ``overlap``, launches its all-reduce when the last one lands."""

        def hook(param: torch.Tensor) -> None:
            if not self.require_sync:
                return
            if not self._callback_queued:  # run finish_backward once, when the whole backward is done
                torch.autograd.Variable._execution_engine.queue_callback(self.finish_backward)
                self._callback_queued = True
            bucket.pending -= 1
            if bucket.pending == 0:
                bucket.t_ready = time.perf_counter()
                if self.overlap:
                    bucket.launch(self.group)

        return hook

    def finish_backward(self) -> None:
        """Runs once when backward ends (queued on the autograd engine): launches the buckets not yet
        launched, waits for all of them, writes the averaged gradients back and records the timeline."""
        t_backward_end = time.perf_counter()
        for bucket in self.buckets:
            if bucket.pending:
                raise RuntimeError(
                    f"bucket {bucket.index}: {bucket.pending} parameter(s) got no gradient in this backward; "
                    "DataParallel requires every parameter to be used"
                )
            if bucket.work is None:  # overlap=False: communicate now, after backward
                bucket.launch(self.group)
        for bucket in self.buckets:
            bucket.finish(self.world)
        self.timeline = [
            dict(
                bucket=b.index,
                numel=b.numel,
                ready=b.t_ready,
                launch=b.t_launch,
                done=b.t_done,
                backward_end=t_backward_end,
            )
            for b in self.buckets
        ]
        self._callback_queued = False

    def close(self) -> None:
        """Release the shared-memory all-reduce made for ``all_reduce="shm"`` (nothing else to release)."""
        if hasattr(self.all_reduce, "close"):
            self.all_reduce.close()
