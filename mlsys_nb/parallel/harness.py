"""Rank functions that train the small transformer with every data-parallel implementation.

Used by the tests, notebooks 05-06 and ``benchmarks/ddp_overlap.py`` through ``mlsys_nb.launch``:

    results = mlsys_nb.launch(compare_implementations, world_size=4, kwargs=dict(steps=3))

Every implementation starts from the same seeded model, sees the same seeded global batches (each
rank takes its contiguous slice of every batch) and takes ``steps`` optimizer steps. We record the
maximum parameter difference from single-process training on the full batch (computed on every
rank, independently of any communication), the bytes communicated per step by this rank (counted
by ``CommCounter``; PyTorch's C++ DDP reducer cannot be counted this way) and the bytes of
parameters, gradients and optimizer states this rank holds after the last step.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch
import torch.distributed as dist

from ..config import ModelConfig, check_choice, check_int, check_number
from ..config import tiny_config as _tiny_config
from ..models import Transformer
from ..comm import wire
from ..comm.counting import CommCounter
from .ddp import DataParallel, allreduce_gradients
from ..models.measure import measured_state_bytes
from ..runtime.profiling import (
    COMM_OPS,
    activities,
    backward_compute,
    backward_extents,
    in_flight,
    load_trace,
    overlap_fraction,
    overlapped_all_reduces,
    spans,
)
from ..runtime.timing import Timer
from .zero import ZeRO

IMPLEMENTATIONS = (
    "naive",
    "ddp",
    "ddp_no_overlap",
    "ddp_accum",
    "torch_ddp",
    "zero1",
    "zero2",
    "zero3",
    "zero3_prefetch",
    "fsdp2",
)
# The optimizers the harness trains with, by their names in ``mlsys_nb.config.OPTIMIZERS``.
# AdamW's lr is kept small: its update g/sqrt(v) amplifies summation-order rounding of small
# gradients (differences from single-process grow ~linearly with lr: max 8e-6 at lr 1e-3, N = 3)
_OPTIMIZER_SETTINGS = {
    "adamw": (torch.optim.AdamW, dict(lr=5e-4, weight_decay=0.1)),
    "adam": (torch.optim.Adam, dict(lr=5e-4)),
    "sgd-momentum": (torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    "sgd": (torch.optim.SGD, dict(lr=0.1)),
}


def make_optimizer(name: str, params) -> torch.optim.Optimizer:
    """The optimizer ``name`` (one of ``mlsys_nb.config.OPTIMIZERS`` the harness runs: adamw,
    adam, sgd-momentum, sgd) over ``params``, with the harness's hyper-parameters."""
    check_choice("optimizer", name, tuple(_OPTIMIZER_SETTINGS))
    cls, kwargs = _OPTIMIZER_SETTINGS[name]
    return cls(params, **kwargs)


def dp_tiny_config(**overrides) -> ModelConfig:
    """``mlsys_nb.config.tiny_config`` named ``dp-tiny``: a 2-layer GQA/SwiGLU transformer of 22,688
    parameters; every unit's size divides by 8, so ZeRO's shards need no padding for N = 1, 2, 4, 8."""
    return _tiny_config(**{"name": "dp-tiny", **overrides})


def make_batches(cfg: ModelConfig, steps: int, global_batch: int, seed: int = 0):
    """``steps`` global batches of (tokens, targets), each [global_batch, seq_len], seeded."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        seq = torch.randint(0, cfg.vocab_size, (global_batch, cfg.seq_len + 1), generator=g)
        out.append((seq[:, :-1], seq[:, 1:]))
    return out


def local_slice(batch, rank: int, world: int):
    """Rank ``rank``'s contiguous share of a global batch (its size must divide by ``world``)."""
    x, y = batch
    if x.shape[0] % world:
        raise ValueError(f"global batch {x.shape[0]} is not divisible by world_size={world}")
    n = x.shape[0] // world
    return x[rank * n : (rank + 1) * n], y[rank * n : (rank + 1) * n]


def build_model(cfg: ModelConfig, seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(cfg)


def train_single(cfg: ModelConfig, batches, optimizer: str = "adamw", seed: int = 0) -> dict[str, torch.Tensor]:
    """The reference: one process, full batches. Returns {name: parameter}."""
    model = build_model(cfg, seed)
    opt = make_optimizer(optimizer, model.parameters())
    for x, y in batches:
        model(x, y).backward()
        opt.step()
        opt.zero_grad()
    return {n: p.detach().clone() for n, p in model.named_parameters()}


def train_parallel(
    impl: str, cfg: ModelConfig, batches, optimizer: str = "adamw", seed: int = 0, bucket_cap_mb: float = 0.02
) -> dict:
    """Train with ``impl`` on this rank's slices; return full parameters, bytes sent per step
    (counted), per-op counts and model-state bytes after the last step."""
    check_choice("impl", impl, IMPLEMENTATIONS)
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(cfg, seed)
    check_choice("optimizer", optimizer, tuple(_OPTIMIZER_SETTINGS))
    make_opt = functools.partial(make_optimizer, optimizer)
    zero = ddp = None
    if impl.startswith("zero"):
        stage = int(impl[4])
        zero = ZeRO(model, make_opt, stage=stage, prefetch=impl.endswith("prefetch"))
        opt, net = zero, model
    elif impl == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (world,))
        for blk in model.blocks:
            fully_shard(blk, mesh=mesh)
        fully_shard(model, mesh=mesh)
        net, opt = model, make_opt(model.parameters())
    elif impl == "torch_ddp":
        net = torch.nn.parallel.DistributedDataParallel(model)
        opt = make_opt(model.parameters())
    elif impl == "naive":
        net, opt = model, make_opt(model.parameters())
    else:
        ddp = DataParallel(model, bucket_cap_mb=bucket_cap_mb, overlap=impl != "ddp_no_overlap")
        net, opt = ddp, make_opt(model.parameters())
    memory = None
    measure_wire = wire.available()
    if measure_wire:  # bytes the kernel saw leave this rank's sockets, minus an empty barrier's
        dist.barrier()
        base = wire.calibrate_baseline(dist.barrier)
        framing = wire.framing_per_message(base)
        counter = wire.WireCounter(baseline=base)
    else:
        counter = contextlib.nullcontext()
    with counter, CommCounter() as cc:
        for batch in batches:
            x, y = local_slice(batch, rank, world)
            if impl == "ddp_accum":  # two micro-batches: the first without communication
                half = x.shape[0] // 2
                with ddp.no_sync():
                    (net(x[:half], y[:half]) / 2).backward()
                (net(x[half:], y[half:]) / 2).backward()
            else:
                net(x, y).backward()
            if impl == "naive":
                allreduce_gradients(model)
            opt.step()
            if batch is batches[-1]:
                extra = [u.shard for u in zero.units] if zero else ()
                memory = measured_state_bytes(model, zero.optimizer if zero else opt, extra)
            opt.zero_grad()
        if measure_wire:
            dist.barrier()  # the fence calibrate_baseline() measured: every byte sent is acknowledged by now
    wire_sent = counter.bytes_sent / len(batches) if measure_wire else None
    if zero is not None:
        params = zero.full_parameters()
    elif impl == "fsdp2":
        params = {n: p.full_tensor().detach().clone() for n, p in model.named_parameters()}
    else:
        params = {n: p.detach().clone() for n, p in model.named_parameters()}
    by_op = {op: {k: v / len(batches) for k, v in row.items()} for op, row in cc.by_op().items()}
    return dict(
        params=params,
        bytes_sent_per_step=cc.bytes_sent / len(batches),
        calls_per_step=cc.calls / len(batches),
        by_op=cc.by_op(),
        by_op_per_step=by_op,
        wire_sent_per_step=wire_sent,
        wire_framing_per_message=framing if measure_wire else None,
        memory=memory,
        peak_gathered_bytes=zero.peak_gathered_bytes if zero else None,
    )


def max_diff(a: dict, b: dict) -> float:
    if a.keys() != b.keys():
        raise ValueError(f"parameter names differ: {sorted(a.keys() ^ b.keys())}")
    return max((a[k] - b[k]).abs().max().item() for k in a)


def compare_implementations(
    impls=IMPLEMENTATIONS,
    optimizers=("adamw", "sgd-momentum"),
    steps: int = 3,
    per_rank_batch: int = 2,
    cfg_overrides: dict | None = None,
    seed: int = 0,
) -> dict:
    """Rank function: train with each implementation and optimizer; compare with the single-process
    reference (full batch) and with PyTorch DDP. Returns plain numbers (no tensors):
    ``{"n_params", "world_size", "moved": {optimizer: max |reference - initial|},
    "results": {optimizer: {impl: {max_diff_single, max_diff_torch_ddp, bytes_sent_per_step,
    calls_per_step, by_op, memory, seconds}}}}``."""
    world = dist.get_world_size()
    cfg = dp_tiny_config(**(cfg_overrides or {}))
    batches = make_batches(cfg, steps, per_rank_batch * world, seed=seed + 1)
    initial = {n: p.detach().clone() for n, p in build_model(cfg, seed).named_parameters()}
    out = {"n_params": sum(p.numel() for p in initial.values()), "world_size": world, "results": {}, "moved": {}}
    for optimizer in optimizers:
        reference = train_single(cfg, batches, optimizer, seed)
        out["moved"][optimizer] = max_diff(reference, initial)  # training changed the weights this much
        runs = {}
        for impl in impls:
            with Timer() as timer:
                runs[impl] = train_parallel(impl, cfg, batches, optimizer, seed)
            runs[impl]["seconds"] = timer.seconds
        torch_ref = runs.get("torch_ddp")
        out["results"][optimizer] = {
            impl: dict(
                max_diff_single=max_diff(r["params"], reference),
                max_diff_torch_ddp=max_diff(r["params"], torch_ref["params"]) if torch_ref else None,
                **{k: v for k, v in r.items() if k != "params"},
            )
            for impl, r in runs.items()
        }
    return out


def max_differences(impls=("ddp", "zero1", "zero2", "zero3"), optimizer: str = "adamw", steps: int = 2) -> dict:
    """Rank function for ``torchrun -m mlsys_nb.run mlsys_nb.parallel.harness:max_differences``:
    {impl: max |parameter - single-process parameter|} after ``steps`` steps."""
    out = compare_implementations(impls=impls, optimizers=(optimizer,), steps=steps)
    return {impl: r["max_diff_single"] for impl, r in out["results"][optimizer].items()}


# ---- timing: overlap of communication with backward ----------------------------------------------
TIMING_VARIANTS = ("compute_only", "no_overlap", "overlap", "torch_ddp")


def mlp_stack(hidden: int, layers: int, seed: int = 0) -> torch.nn.Sequential:
    """``layers`` x (Linear(hidden, hidden) + ReLU): compute-heavy layers with big gradients."""
    torch.manual_seed(seed)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(hidden, hidden), torch.nn.ReLU()]
    return torch.nn.Sequential(*mods)


def time_ddp_steps(
    variants=TIMING_VARIANTS,
    hidden: int = 1024,
    layers: int = 8,
    rows: int = 64,
    bucket_cap_mb: float = 4.0,
    repeats: int = 10,
    warmup: int = 2,
) -> dict:
    """Rank function: seconds per training step (forward + backward + gradient sync, no optimizer)
    of an MLP stack for each variant, interleaved round-robin so drift hits all variants alike.

    ``compute_only``: no communication at all (the lower bound); ``no_overlap``: our DDP, all
    buckets after backward; ``overlap``: our DDP, buckets launched during backward; ``torch_ddp``:
    PyTorch's DDP (same bucket size). Returns ``{"times": {variant: [s, ...]}, "timeline":
    {variant: [bucket dicts, seconds relative to the step start]}, "bytes_sent_per_step": {variant:
    bytes counted by CommCounter (0 for torch_ddp: its C++ reducer is not visible)}, "grad_bytes",
    "flops_per_step"}``.
    """
    for variant in variants:
        check_choice("each of variants", variant, TIMING_VARIANTS)
    rank = dist.get_rank()
    g = torch.Generator().manual_seed(100 + rank)
    x, target = torch.randn(rows, hidden, generator=g), torch.randn(rows, hidden, generator=g)
    nets = {}
    for v in variants:
        model = mlp_stack(hidden, layers)
        if v in ("overlap", "no_overlap"):
            nets[v] = DataParallel(model, bucket_cap_mb=bucket_cap_mb, overlap=v == "overlap")
        elif v == "torch_ddp":
            nets[v] = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)
        else:
            nets[v] = model
    times = {v: [] for v in variants}
    timeline, sent = {}, {}
    for i in range(warmup + repeats):
        for v in variants:
            net = nets[v]
            dist.barrier()
            with CommCounter() as cc:
                t0 = time.perf_counter()  # also the origin of the bucket timeline's timestamps
                loss = torch.nn.functional.mse_loss(net(x), target)
                loss.backward()
                t1 = time.perf_counter()
            sent[v] = cc.bytes_sent
            for p in net.parameters():
                p.grad = None
            if i >= warmup:
                times[v].append(t1 - t0)
            if isinstance(net, DataParallel):
                timeline[v] = [
                    {k: (val - t0 if k not in ("bucket", "numel") else val) for k, val in b.items()}
                    for b in net.timeline
                ]
    n_params = sum(p.numel() for p in mlp_stack(hidden, 1).parameters()) * layers
    return dict(
        times=times,
        timeline=timeline,
        bytes_sent_per_step=sent,
        grad_bytes=4 * n_params,
        flops_per_step=6 * rows * n_params,
    )


# ---- a DDP step traced by torch.profiler (notebook 05b) --------------------------------------------------------
DDP_VARIANTS = ("overlap", "blocking", "no_overlap")


def trace_ddp_step(
    variants=DDP_VARIANTS,
    *,
    steps: int = 4,
    bucket_cap_mb: float = 0.02,
    batch: int = 4,
    seed: int = 0,
    trace_dir=None,
) -> dict:
    """Rank function (run it with ``mlsys_nb.launch(..., backend="gloo")``): one step (forward + backward,
    gradient sync) of ``parallel.ddp.DataParallel`` over the kit's tiny transformer (``config.tiny_config``)
    on the CPU, ``steps`` steps traced with ``torch.profiler`` for each of ``variants``, after one untraced
    warm-up step each:
    ``"overlap"`` launches each bucket's all-reduce from its gradient hook and waits at the end of backward (as
    PyTorch's DDP); ``"blocking"`` launches it there too but waits for it inside the hook (a broken schedule:
    communication during backward, none hidden); ``"no_overlap"`` launches every bucket after backward.

    Returns, per variant: ``comm`` (the spans of the all-reduce events of all steps, us), ``backwards`` (per
    step, ``backward_extents``) and ``backward`` (the first step's), ``backward_range`` and ``forward_range``
    (the first step's ``record_function`` ranges; the backward range includes DDP's wait for the buckets),
    ``fraction`` (``overlap_fraction(comm, backwards)``: the communication inside backward's extents),
    ``in_flight`` and ``compute`` (``in_flight``, ``backward_compute``), ``overlapped``
    (``overlapped_all_reduces``: the share of the all-reduces during which backward computed), ``buckets``,
    ``steps`` and, with ``trace_dir``, the path of the exported trace (``ddp_<variant>_rank<r>.json``).

    Several steps, because on a loaded machine one step can serialise by chance: when the cores are busy, the
    call that hands an all-reduce to gloo's thread can return only once it is done."""
    from torch.profiler import profile, record_function

    check_number("bucket_cap_mb", bucket_cap_mb, 0, unit="MB")
    batch = check_int("batch", batch, 1)
    steps = check_int("steps", steps, 1)
    rank = dist.get_rank()
    cfg = _tiny_config()
    g = torch.Generator().manual_seed(seed + 1 + rank)  # each rank its own shard
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.seq_len), generator=g)
    nets = {}
    for variant in variants:
        check_choice("variant", variant, DDP_VARIANTS)
        torch.manual_seed(seed)
        net = DataParallel(Transformer(cfg), bucket_cap_mb=bucket_cap_mb, overlap=variant != "no_overlap")
        if variant == "blocking":  # the broken schedule: each bucket's all-reduce awaited in its hook
            for bucket in net.buckets:
                bucket.launch = functools.partial(_launch_and_wait, bucket, bucket.launch)
        nets[variant] = net

    def step(net):
        with record_function("forward"):
            loss = net(x, y)
        with record_function("backward"):
            loss.backward()
        net.zero_grad(set_to_none=True)

    for net in nets.values():  # warm-up: first-call costs stay out of the trace
        step(net)
    out = {}
    for variant, net in nets.items():
        dist.barrier()
        with profile(activities=activities("cpu")) as prof:  # the model and gloo's all-reduce live on the CPU
            dist.barrier()  # both ranks start the steps together, inside the trace
            for _ in range(steps):
                step(net)
        if trace_dir is not None:
            path = Path(trace_dir) / f"ddp_{variant}_rank{rank}.json"
            prof.export_chrome_trace(str(path))
            events = load_trace(path)
        else:
            path = None
            import tempfile

            with tempfile.TemporaryDirectory() as tmp:
                prof.export_chrome_trace(f"{tmp}/trace.json")
                events = load_trace(f"{tmp}/trace.json")
        comm = sorted(s for op in COMM_OPS for s in spans(events, prefix=op))
        backwards = backward_extents(events)
        out[variant] = dict(
            comm=comm,
            backwards=backwards,
            backward=backwards[0],
            backward_range=spans(events, name="backward")[0],
            forward_range=spans(events, name="forward")[0],
            fraction=overlap_fraction(comm, backwards),
            in_flight=in_flight(events),
            compute=backward_compute(events),
            overlapped=overlapped_all_reduces(events),
            buckets=len(net.buckets),
            steps=steps,
            trace=str(path) if path else None,
        )
    return out


def _launch_and_wait(bucket, launch, group) -> None:
    """The broken schedule's bucket launch: the all-reduce awaited inside the gradient hook."""
    launch(group)
    bucket.work.wait()
