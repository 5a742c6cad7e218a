"""Run pipeline schedules on real ranks: real stages, real send/recv, a measured timeline per rank.

The model is a stack of ``n_layers`` residual MLP blocks (``x + W2·gelu(W1·LayerNorm(x))``) or of
the package's Llama-style transformer blocks (``block="transformer"``), cut into the schedule's
``n_stages`` consecutive stages. Every rank builds the same seeded model and
keeps the stages it holds (DualPipe: two copies, stage r and stage p−1−r). The last stage's loss is
the mean-squared error of its micro-batch divided by m, so the summed gradients equal those of the
unpipelined model under the mean loss over micro-batches.

Each rank walks ``schedule.actions[rank]`` in order:

- ``RECV_F`` / ``RECV_B``: blocking ``dist.recv`` of an activation / a gradient (tag = op id);
- ``F``: forward of one stage on one micro-batch, keeping (input, output) for the backward;
- ``B`` full: ``torch.autograd.backward(out, grad)``, parameters' ``.grad`` accumulate;
- ``B`` input-only (zero-bubble split): ``torch.autograd.grad(out, input, grad, retain_graph=True)``;
- ``W``: ``torch.autograd.grad(out, params, grad)`` added into ``.grad`` (the weight-gradient half);
- ``FB``: the forward, then the backward (no real overlap on CPU);
- ``SEND_F`` / ``SEND_B``: ``dist.isend`` (asynchronous), all waited for at the end of the step.

It runs on CPU over gloo, whose point-to-point messages are matched by tag (under an NCCL default
group a gloo subgroup is created: NCCL matches messages in order, and the V-shaped and DualPipe
schedules send a pair's messages in a different order than the peer receives them).

Note: the W op re-traverses the stage's graph to reach the weights, so on these small CPU models the
split costs more compute than a fused backward; the order and the gradients are what is checked.

``run_schedules(...)`` launches the ranks once and runs several schedules in sequence; it returns,
per schedule, the largest absolute gradient difference from the unpipelined model and the measured
timeline (seconds from the first op of the step).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field

from .schedules import SCHEDULES, Schedule, dependency, schedule, validate


@dataclass(frozen=True)
class ModelSpec:
    """The toy model and batch. ``block="mlp"``: residual MLP blocks on [microbatch_size, hidden];
    ``block="transformer"``: the package's Llama-style ``Block`` (RMSNorm, RoPE, GQA attention,
    SwiGLU) on [microbatch_size, seq_len, hidden]."""

    hidden: int = 32
    n_layers: int = 8
    microbatch_size: int = 4
    seed: int = 0
    block: str = "mlp"
    seq_len: int = 8
    n_heads: int = 4

    def __post_init__(self):
        if self.block not in ("mlp", "transformer"):
            raise ValueError(f"block must be 'mlp' or 'transformer', got {self.block!r}")

    @property
    def shape(self) -> tuple:
        """Shape of one micro-batch's activations (what crosses a stage boundary)."""
        if self.block == "mlp":
            return (self.microbatch_size, self.hidden)
        return (self.microbatch_size, self.seq_len, self.hidden)

    def transformer_config(self):
        """The ``ModelConfig`` of the transformer blocks (``block="transformer"``)."""
        from ..config import ModelConfig

        return ModelConfig(
            n_layers=self.n_layers,
            hidden=self.hidden,
            n_heads=self.n_heads,
            n_kv_heads=max(1, self.n_heads // 2),
            vocab_size=8,
            seq_len=self.seq_len,
        )


def build_blocks(spec: ModelSpec):
    """The full, unpipelined model as a ``torch.nn.ModuleList`` of blocks (seeded)."""
    import torch
    from torch import nn

    class MLPBlock(nn.Module):
        def __init__(self, h):
            super().__init__()
            self.norm = nn.LayerNorm(h)
            self.up = nn.Linear(h, 2 * h)
            self.down = nn.Linear(2 * h, h)

        def forward(self, x):
            return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

    class TransformerBlock(nn.Module):
        """``models.transformer.Block`` with its RoPE tables, so it maps x -> x like an MLP block."""

        def __init__(self, cfg, i):
            super().__init__()
            from ..models.transformer import Block, rope_tables

            self.block = Block(cfg, i, attn_impl="matmul")
            cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
            self.register_buffer("cos", cos, persistent=False)
            self.register_buffer("sin", sin, persistent=False)

        def forward(self, x):
            return self.block(x, self.cos, self.sin)

    torch.manual_seed(spec.seed)
    if spec.block == "mlp":
        return nn.ModuleList(MLPBlock(spec.hidden) for _ in range(spec.n_layers))
    cfg = spec.transformer_config()
    return nn.ModuleList(TransformerBlock(cfg, i) for i in range(spec.n_layers))


def make_batch(spec: ModelSpec, m: int):
    """Seeded inputs and targets, each of shape [m, *spec.shape]."""
    import torch

    g = torch.Generator().manual_seed(spec.seed + 1)
    shape = (m, *spec.shape)
    return torch.randn(shape, generator=g), torch.randn(shape, generator=g)


def reference_grads(spec: ModelSpec, m: int) -> tuple[dict, float]:
    """Gradients of the unpipelined model for loss = mean over micro-batches of each one's MSE,
    and that loss."""
    import torch

    blocks = build_blocks(spec)
    x, y = make_batch(spec, m)
    loss = 0.0
    for j in range(m):
        h = x[j]
        for blk in blocks:
            h = blk(h)
        loss = loss + torch.nn.functional.mse_loss(h, y[j]) / m
    loss.backward()
    return {n: p.grad.clone() for n, p in blocks.named_parameters()}, loss.item()


def layers_of(sched: Schedule, spec: ModelSpec, stage: int) -> range:
    """The indices of the model's layers that stage ``stage`` of ``sched`` holds (an equal,
    contiguous share: ``n_layers`` must be a multiple of the number of stages)."""
    if spec.n_layers % sched.n_stages:
        raise ValueError(f"n_layers={spec.n_layers} must be a multiple of the {sched.n_stages} stages of {sched.name}")
    k = spec.n_layers // sched.n_stages
    return range(stage * k, (stage + 1) * k)


def stage_modules(sched: Schedule, spec: ModelSpec, rank: int, blocks=None) -> dict:
    """``{(path, stage): nn.Sequential}`` of the stages pipeline rank ``rank`` holds, cut from
    ``blocks`` (default ``build_blocks(spec)``; DualPipe's second path gets a fresh copy)."""
    from torch import nn

    full_model = build_blocks(spec) if blocks is None else blocks
    mods = {}
    for path, pl in enumerate(sched.placement):
        for s, (r, _chunk) in enumerate(pl):
            if r == rank:
                mods[(path, s)] = nn.Sequential(*[full_model[i] for i in layers_of(sched, spec, s)])
        full_model = build_blocks(spec) if path + 1 < len(sched.placement) else full_model
    return mods


@dataclass
class StepState:
    """What one rank holds while it walks its actions through one step. Keys are ``(microbatch, stage)``."""

    sched: Schedule
    rank: int  # this rank's index in the pipeline group
    mods: dict  # (path, stage) -> this rank's module of that stage (DualPipe: two paths, two copies)
    x: object  # inputs [m, *shape]
    y: object  # targets [m, *shape]
    shape: tuple  # one micro-batch's activations (what crosses a stage boundary)
    group: object = None  # the pipeline's process group (None: the world)
    acts: dict = field(default_factory=dict)  # a stage's input, received or made here, awaiting its F
    grads: dict = field(default_factory=dict)  # the gradient of a stage's output, awaiting its B (or SEND_B)
    saved: dict = field(default_factory=dict)  # (input, output) kept for B; (input, output, grad) for W
    sends: list = field(default_factory=list)  # isend handles, waited for at the end of the step
    rows: list = field(default_factory=list)  # timeline: (kind, microbatch, chunk, stage, full, start_s, end_s)
    loss: float = 0.0  # the sum of the last stage's losses

    def tag(self, kind: str, mb: int, stage: int) -> int:
        """The tag of the activation (``"F"``) entering ``stage`` or the gradient (``"B"``) of its output."""
        return ({"F": 0, "B": 1}[kind] * self.sched.n_stages + stage) * self.sched.m + mb

    def module(self, mb: int, stage: int):
        return self.mods[(self.sched.mb_path[mb], stage)]

    def recv(self, peer: int, tag: int):
        """A blocking receive of one micro-batch's activations (or their gradient) from ``peer``."""
        import torch
        import torch.distributed as dist

        buf = torch.empty(self.shape)
        dist.recv(buf, group_src=peer, tag=tag, group=self.group)
        return buf

    def isend(self, t, peer: int, tag: int) -> None:
        import torch.distributed as dist

        self.sends.append(dist.isend(t, group_dst=peer, tag=tag, group=self.group))


def forward(st: StepState, a) -> None:
    """F: stage ``a.stage`` on micro-batch ``a.microbatch``; the last stage turns its output into the loss."""
    import torch

    j, s = a.microbatch, a.stage
    x = st.x[j] if s == 0 else st.acts.pop((j, s))
    x = x.detach().requires_grad_(s > 0)
    out = st.module(j, s)(x)
    if s == st.sched.n_stages - 1:
        out = torch.nn.functional.mse_loss(out, st.y[j]) / st.sched.m
        st.loss += out.item()
    elif st.sched.rank_of(j, s + 1) == st.rank:  # the next stage is on this rank: no message
        st.acts[(j, s + 1)] = out.detach()
    st.saved[(j, s)] = (x, out)


def backward(st: StepState, a) -> None:
    """B: full (``a.full``): ``autograd.backward``, the weights' ``.grad`` accumulate too. Input-only
    (zero bubble): ``autograd.grad`` of the stage's input alone, the graph kept for the W that follows."""
    import torch

    j, s = a.microbatch, a.stage
    x, out = st.saved[(j, s)]
    g = None if s == st.sched.n_stages - 1 else st.grads.pop((j, s))
    if a.full:
        torch.autograd.backward(out, g)
        st.saved.pop((j, s))
        gx = x.grad if s > 0 else None
    else:
        gx = torch.autograd.grad(out, x, g, retain_graph=True)[0] if s > 0 else None
        st.saved[(j, s)] = (x, out, g)
    if s > 0:
        st.grads[(j, s - 1)] = gx  # sent by SEND_B, or used here if stage s−1 is on this rank


def weight(st: StepState, a) -> None:
    """W: the weight-gradient half of a split backward, added into the parameters' ``.grad``."""
    import torch

    j, s = a.microbatch, a.stage
    x, out, g = st.saved.pop((j, s))
    params = list(st.module(j, s).parameters())
    for p, gp in zip(params, torch.autograd.grad(out, params, g)):
        p.grad = gp if p.grad is None else p.grad + gp


COMPUTE = {"F": forward, "B": backward, "W": weight}


def compute(st: StepState, a) -> None:
    """F, B, W, or FB (the forward, then the backward), each op timed into ``st.rows``."""
    for op in a.sub if a.kind == "FB" else (a,):
        t0 = time.perf_counter()
        COMPUTE[op.kind](st, op)
        st.rows.append((op.kind, op.microbatch, op.chunk, op.stage, op.full, t0, time.perf_counter()))


def recv_activation(st: StepState, a) -> None:
    """RECV_F: stage ``a.stage``'s input, from the rank of the stage before."""
    st.acts[(a.microbatch, a.stage)] = st.recv(a.peer, st.tag("F", a.microbatch, a.stage))


def recv_gradient(st: StepState, a) -> None:
    """RECV_B: the gradient of stage ``a.stage``'s output, from the rank of the stage after."""
    st.grads[(a.microbatch, a.stage)] = st.recv(a.peer, st.tag("B", a.microbatch, a.stage))


def send_activation(st: StepState, a) -> None:
    """SEND_F: stage ``a.stage``'s output, to the rank of the next stage (asynchronous)."""
    out = st.saved[(a.microbatch, a.stage)][1].detach()
    st.isend(out, a.peer, st.tag("F", a.microbatch, a.stage + 1))


def send_gradient(st: StepState, a) -> None:
    """SEND_B: the gradient of stage ``a.stage``'s input, to the rank of the stage before (asynchronous)."""
    g = st.grads.pop((a.microbatch, a.stage - 1))
    st.isend(g.contiguous(), a.peer, st.tag("B", a.microbatch, a.stage - 1))


ACTIONS = {
    "F": compute,
    "B": compute,
    "W": compute,
    "FB": compute,
    "RECV_F": recv_activation,
    "RECV_B": recv_gradient,
    "SEND_F": send_activation,
    "SEND_B": send_gradient,
}


def run_step(sched: Schedule, spec: ModelSpec, group=None, *, mods=None, batch=None) -> dict:
    """Inside a rank: one training step of ``sched`` (no optimizer). Returns this rank's gradients
    keyed by the unpipelined model's parameter names, its loss sum and its timeline rows
    (kind, microbatch, chunk, stage, full, start_s, end_s) in ``time.perf_counter`` seconds.

    ``group``: the pipeline's process group (peers are ranks *in this group*; default the world).
    ``mods``: this rank's stage modules from ``stage_modules`` (kept across steps for training;
    default: built fresh from ``spec``). ``batch``: ``(x, y)`` of shape [m, *spec.shape] (default
    ``make_batch(spec, m)``)."""
    import torch.distributed as dist

    r = dist.get_rank(group)
    x, y = (t.to("cpu") for t in (make_batch(spec, sched.m) if batch is None else batch))
    mods = stage_modules(sched, spec, r) if mods is None else mods
    for mod in mods.values():
        mod.zero_grad(set_to_none=True)
    st = StepState(sched, r, mods, x, y, spec.shape, group)
    dist.barrier(group=group)
    for a in sched.actions[r]:
        ACTIONS[a.kind](st, a)
    for w in st.sends:
        w.wait()
    dist.barrier(group=group)
    return {"rank": r, "grads": stage_grads(sched, spec, mods), "loss": st.loss, "rows": st.rows}


def stage_grads(sched: Schedule, spec: ModelSpec, mods: dict) -> dict:
    """The gradients of this rank's stage modules, keyed by the unpipelined model's parameter names
    (``"{layer}.{name}"``; DualPipe's two copies of a layer on one rank are summed)."""
    out = {}
    for (_path, s), mod in mods.items():
        for i, blk in zip(layers_of(sched, spec, s), mod):
            for n, p in blk.named_parameters():
                key = f"{i}.{n}"
                g = p.grad.detach().cpu()
                out[key] = out[key] + g if key in out else g.clone()
    return out


def pipeline_worker(schedules: list[Schedule], spec: ModelSpec, repeats: int = 1) -> list[dict]:
    """The function each rank runs under ``mlsys_nb.launch``: every schedule in turn (the last of
    ``repeats`` steps is returned, earlier ones warm up)."""
    import torch.distributed as dist

    # Messages are matched by tag, which gloo honours. NCCL matches a pair's messages in issue order,
    # and the V-shaped and DualPipe orders interleave F and B messages differently on the two
    # ends of a pair, so under an NCCL default group the step runs on CPU over a gloo subgroup.
    group = None if dist.get_backend() == "gloo" else dist.new_group(backend="gloo")
    results = []
    for sched in schedules:
        for _ in range(repeats):
            res = run_step(sched, spec, group)
        results.append(res)
    return results


def rank_sequences(timeline) -> dict[int, list[tuple]]:
    """Per rank, the ``(kind, microbatch, stage)`` of its compute ops in start-time order, from a
    timeline frame (measured ``RealRun.timeline`` or simulated ``SimResult.timeline``)."""
    out = {}
    for r, g in timeline.sort_values(["rank", "start"], kind="stable").groupby("rank"):
        out[int(r)] = [(k, int(j), int(st)) for k, j, st in zip(g.kind, g.microbatch, g.stage)]
    return out


@dataclass
class RealRun:
    """One schedule executed on real ranks."""

    schedule: Schedule
    grad_error: float  # max |pipelined − unpipelined| over all parameters
    loss: float
    reference_loss: float
    timeline: object  # pandas DataFrame: rank, kind, microbatch, chunk, stage, full, start, end (s)

    @property
    def makespan(self) -> float:
        return float(self.timeline.end.max())

    def order_matches(self) -> bool:
        """Did every rank run exactly its schedule's compute order (FB pairs as F then B)?"""
        got = rank_sequences(self.timeline)
        for r in range(self.schedule.p):
            want = [
                (x.kind, x.microbatch, x.stage)
                for a in self.schedule.compute[r]
                for x in (a.sub if a.kind == "FB" else (a,))
            ]
            if got.get(r, []) != want:
                return False
        return True

    def same_order_as(self, sim) -> bool:
        """Does a simulation (``SimResult``) put every rank's ops in the order this run measured them?
        Compares, rank by rank, the (kind, micro-batch, stage) sequences sorted by start time
        (an overlapped FB pair counts as F then B on both sides)."""
        return rank_sequences(sim.timeline) == rank_sequences(self.timeline)

    def causal(self) -> bool:
        """Did every op that needs another rank's data start after that data was produced?"""
        tl = self.timeline
        ends = {(k, j, st): e for k, j, st, e in zip(tl.kind, tl.microbatch, tl.stage, tl.end)}
        for k, j, st, start in zip(tl.kind, tl.microbatch, tl.stage, tl.start):
            dep = dependency(self.schedule, k, j, st)
            if dep is not None and start < ends[dep]:
                return False
        return True

    def comm_latency(self) -> float:
        """Median measured delay (s) between an op finishing on one rank and the op that needs its
        output starting on another, over the cases where the receiving rank was idle waiting."""
        tl = self.timeline
        ends = {(k, j, st): e for k, j, st, e in zip(tl.kind, tl.microbatch, tl.stage, tl.end)}
        delays = []
        for _, g in tl.sort_values("start").groupby("rank"):
            prev_end = 0.0
            for k, j, st, start, end in zip(g.kind, g.microbatch, g.stage, g.start, g.end):
                dep = dependency(self.schedule, k, j, st)
                if (
                    dep is not None
                    and self.schedule.rank_of(j, dep[2]) != self.schedule.rank_of(j, st)
                    and ends[dep] >= prev_end
                ):
                    delays.append(start - ends[dep])
                prev_end = end
        return float(sorted(delays)[len(delays) // 2]) if delays else 0.0

    def op_costs(self) -> dict:
        """Median measured op durations (s) per kind, normalised to one micro-batch over L/p layers."""
        tl = self.timeline
        w = self.schedule.chunk_weight
        return {
            k: float((tl[tl.kind == k].end - tl[tl.kind == k].start).median() / w)
            for k in ("F", "B", "W")
            if (tl.kind == k).any()
        }


def run_schedules(
    names=SCHEDULES,
    world_size: int = 4,
    m: int | None = None,
    *,
    v: int | None = None,
    hidden: int = 32,
    microbatch_size: int = 4,
    n_layers: int | None = None,
    seed: int = 0,
    block: str = "mlp",
    seq_len: int = 8,
    repeats: int = 1,
    backend: str = "auto",
    timeout: float = 120.0,
) -> dict[str, RealRun]:
    """Run each schedule (names or ``Schedule`` objects) for ``world_size`` ranks on real ranks, in
    one launch. ``m`` defaults to 2·world_size, valid for every schedule. Returns name -> RealRun."""
    import pandas as pd

    import mlsys_nb

    m = 2 * world_size if m is None else m
    scheds = [
        s if isinstance(s, Schedule) else schedule(s, world_size, m, v if s == "interleaved-1f1b" else None)
        for s in names
    ]
    for s in scheds:
        validate(s)
        if s.p != world_size or s.m != scheds[0].m:
            raise ValueError(f"schedule {s.name} is for p={s.p}, m={s.m}; expected p={world_size}, m={scheds[0].m}")
    m = scheds[0].m
    if n_layers is None:
        n_layers = math.lcm(*(s.n_stages for s in scheds))
    spec = ModelSpec(
        hidden=hidden, n_layers=n_layers, microbatch_size=microbatch_size, seed=seed, block=block, seq_len=seq_len
    )
    per_rank = mlsys_nb.launch(
        pipeline_worker, world_size, args=(scheds, spec, repeats), backend=backend, timeout=timeout
    )
    ref, ref_loss = reference_grads(spec, m)
    out = {}
    for i, s in enumerate(scheds):
        total = {}
        for rank_res in per_rank:
            for k, g in rank_res[i]["grads"].items():
                total[k] = total[k] + g if k in total else g
        if set(total) != set(ref):
            raise RuntimeError(f"{s.name}: gradients missing for {sorted(set(ref) - set(total))}")
        err = max(float((total[k] - ref[k]).abs().max()) for k in ref)
        rows = [(res[i]["rank"], *row) for res in per_rank for row in res[i]["rows"]]
        tl = pd.DataFrame(rows, columns=["rank", "kind", "microbatch", "chunk", "stage", "full", "start", "end"])
        t0 = tl.start.min()
        tl["start"] -= t0
        tl["end"] -= t0
        loss = sum(res[i]["loss"] for res in per_rank)
        out[s.name] = RealRun(s, err, loss, ref_loss, tl)
    return out
