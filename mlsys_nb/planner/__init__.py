"""A 5D-parallelism planner: search dp x tp x pp x cp x ep (+ ZeRO stage, recomputation,
micro-batch, pipeline schedule) for a model on a cluster, rank the layouts by a *modelled* step time.

``search(model, gpus=, gpu=, global_batch_tokens=, seq_len=)`` returns a pandas DataFrame of the
configurations that fit in memory, best (shortest modelled step) first; ``evaluate(model, layout,
...)`` returns one ``Plan`` with its memory ``Breakdown`` and its time breakdown (``Plan.to_frame()``).

Everything here is a model (no GPU is touched), built only from the package's calculators:

- **memory**: ``mlsys_nb.memory.estimate`` on the heaviest pipeline stage (stages get ⌊L/pp⌋ or
  ⌈L/pp⌉ layers, ``memory.stage_layers``), plus ``overhead_bytes`` per GPU (CUDA context, NCCL
  buffers, allocator fragmentation; an assumption, default 4 GB). Two closed-form lower bounds prune
  layouts before the full estimate is called: model states or last-stage activations for every
  candidate, then, in step-time order, model states + block activations x in-flight micro-batches of
  every pipeline rank (``_stage_bound``; tests check both stay below the estimate and that the pruned
  search returns the unpruned rows).
- **compute**: matmul FLOPs of the heaviest stage from ``mlsys_nb.flops`` (causal attention; full
  recomputation re-runs the stage's forward, selective the attention scores), divided by
  ``peak(dtype) x compute_efficiency x`` the fitted matmul efficiency of the GPU's generation
  (``Calibration``), plus the non-matmul kernels as bytes at HBM bandwidth (fitted), plus a fixed time
  per layer and micro-batch that does not scale with its tokens (``layer_s``, fitted: kernel launches and
  tails, synchronisation, narrow per-rank GEMMs; it makes many small micro-batches cost more than few large ones).
- **calibration** (``calibration=``, default ``"fitted"``: the values stored in
  ``data/published_runs.yaml``, ``fitted_calibration()``): efficiencies fitted by ``calibrate()`` on
  15 published runs (leave-one-out: all 15 within 20 % of the reported MFU; 14 without ``layer_s``).
  ``calibration=None`` is the uncalibrated model (datasheet peaks, no non-matmul or fixed term, no overlap):
  an upper bound.
- **communication**: α-β costs (``mlsys_nb.comm.collective_time``) on the link each group uses.
  Ranks are ordered tp (fastest), cp, ep, rest of dp, pp (Megatron-LM's order): a group whose span
  fits in ``gpus_per_node`` uses the GPU's NVLink, otherwise the network (``network``, one NIC per
  GPU). TP with sequence parallelism: 4 all-gathers + 4 reduce-scatters of the activations per
  layer per micro-batch (forward + backward; + 4 with full recomputation), a fitted fraction
  hidden (it fits at 0). CP: all-gather of K and V per layer (reduce-scatter of their gradients in
  backward), as Llama 3 does, same fraction hidden. EP: dispatch + combine all-to-all per MoE
  layer, forward and backward, of
  ``ep_copies`` token copies (default top_k) at ``ep_bytes`` bytes per element (default 2); the
  ``dualpipe`` schedule hides it behind the other micro-batch's compute (DeepSeek-AI 2024,
  arXiv:2412.19437, §3.2.1), other schedules expose it. PP: one activation send per stage boundary
  per micro-batch and direction. DP: gradient all-reduce (ZeRO-1/2: reduce-scatter + all-gather, the
  same bytes) over dp x cp (experts over dp x cp / ep) once per step, a fraction ``dp_overlap``
  (default 0.8) hidden behind backward compute; ZeRO-3 also all-gathers parameters in forward and
  backward of every micro-batch (same overlap).
- **pipeline bubble**: ``mlsys_nb.pipeline.closed_form`` (1F1B ``(p-1)/m``, interleaved
  ``(p-1)/(v m)``, ZB-H1, DualPipe) with backward = 2 x forward (+ recompute). Interleaved chunks per rank
  ``v`` up to one layer per chunk, the first stage's first chunk holding only the embedding and the last
  stage's last only the head (Llama 3's split, ``memory.max_chunks``: v = 8 for 126 layers on 16 stages);
  each chunk boundary is a p2p send (``PP comm`` is v x that of 1F1B).

- **partial recomputation**: with ``recompute="full"`` a layout may recompute only ``recompute_layers``
  layers of each stage (Megatron-LM's ``--recompute-method block --recompute-num-layers``); the search
  gives each such layout the fewest layers that fit (``_fewest_recomputed``, ``_layers_short``), its
  recomputation, TP traffic and non-matmul time scaled by the recomputed share of the stage, and
  lists it only where the same layout without recomputation does not fit.

Not modelled: network congestion and stragglers, optimizer step time, load imbalance between
experts, attention efficiency at short per-rank chunks (``attn_eff`` is held at 1). Checked in
``tests/test_planner.py``: held-out MFU of the published runs; Llama 3 405B's long-context layout and
Korthikanti et al.'s 175B layout among the 10 best distinct layouts of an unconstrained search; not
Llama 3's 8K layouts: on 16,384 GPUs (TP8 PP16 DP128, v 8) 16th distinct, 0.10 s per step (1.5 %) behind the
10th (TP8 CP2 PP16 DP64), which wins by the bubble of twice the micro-batches per pipeline (0.33 s) for 0.03 s
of CP all-gather; on 8,192 GPUs 34th, because the kit's memory model needs one recomputed layer per stage
(0.40 s) where Meta recomputed none, and TP 8's exposed traffic (1.2 s) weighs more at 32 micro-batches.
CP at 8K is not an artefact of the model: NVIDIA's tuned recipe for the same model and sequence length on H100 runs
TP8 PP8 CP2 VP8 (Megatron-Bridge performance summary, FP8, 1,024 GPUs; docs/references.md#megatron-bridge-perf).
``compare(a, b)`` says which term decides between two plans and where that term's formula comes from
(``TERM_SOURCES``); ``sensitivity(fit)`` ranks the published layouts with each fitted parameter at the
ends of its bootstrap interval; ``goodput_mfu`` scales an MFU by the fraction of time spent training
(``effective_training_time``). The step times and MFUs are a model; DeepSeek-V3's MFU to compare with is
``flops.implied_mfu`` (the kit's FLOPs over the reported GPU-hours), also a model.
"""

from __future__ import annotations

import dataclasses
import heapq
import inspect
import itertools
from dataclasses import dataclass, field
from functools import lru_cache

from .. import flops as _flops
from .. import hardware, memory
from ..comm import collective_time
from ..config import ModelConfig, TrainConfig, check_choice, check_int, check_multiple, check_number, check_probability


__all__ = [
    "bubble_ratio",
    "Layout",
    "Plan",
    "search",
    "evaluate",
    "rank_of",
    "clear_caches",
    "compare",
    "sensitivity",
    "goodput_mfu",
    "effective_training_time",
    "TERM_SOURCES",
    "calibrate",
    "Calibration",
    "fitted_calibration",
    "published_runs",
    "COLUMNS",
    "SCHEDULES",
    "DEFAULTS",
]

COLUMNS = [
    "dp",
    "tp",
    "pp",
    "cp",
    "ep",
    "zero",
    "recompute",
    "recompute_layers",
    "micro_batch",
    "schedule",
    "v",
    "memory_bytes",
    "step_s",
    "mfu",
    "bottleneck",
]
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "dualpipe")
_ACT_BYTES = 2  # bf16 activations on the wire
_MEM_SCHEDULE = {"none": "1f1b"}  # planner name -> mlsys_nb.memory name (pp = 1: no schedule)


def _degrees(name, value, default):
    """None -> the default candidates; an int -> just it; an iterable -> those values."""
    if value is None:
        return list(default)
    vals = [value] if isinstance(value, int) and not isinstance(value, bool) else list(value)
    for v in vals:
        check_int(name, v)
    return sorted(set(vals))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


_PLAIN = frozenset((int, str))


@dataclass(frozen=True)
class Layout:
    """One parallel configuration: degrees (``dp`` counts data-parallel replicas; ``ep`` is carved out
    of dp x cp), ZeRO stage, recomputation, sequences per micro-batch, pipeline schedule and chunks
    per rank ``v`` (``schedule="none"`` when pp = 1). ``recompute_layers`` (with ``recompute="full"``):
    layers of each pipeline stage that are recomputed, the others keep every activation (Megatron-LM's
    ``--recompute-method block``); 0: all of them."""

    dp: int
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    zero: int = 1
    recompute: str = "none"
    micro_batch: int = 1
    schedule: str = "1f1b"
    v: int = 1
    recompute_layers: int = 0

    def __post_init__(self):  # accept numpy scalars (a DataFrame row) as plain Python values
        if _PLAIN.issuperset(map(type, self.__dict__.values())):  # the common case (search builds ~10^5): C loop
            return
        for name in self.__dataclass_fields__:
            v = getattr(self, name)
            if hasattr(v, "item") and not isinstance(v, (int, str)):
                object.__setattr__(self, name, v.item())

    @property
    def gpus(self) -> int:
        return self.dp * self.tp * self.pp * self.cp


@dataclass
class Plan:
    """A layout's modelled cost: ``memory`` (``mlsys_nb.memory.Breakdown`` of the heaviest stage,
    ``memory_bytes`` incl. overhead), ``time`` (seconds per step by component, summing to
    ``step_s``), ``mfu`` (model FLOPs / (GPUs x peak x step)), ``hfu`` (hardware FLOPs, i.e. with
    the recomputed forward, / (GPUs x peak x step), from the heaviest stage's FLOP ratio),
    ``bottleneck`` (a sentence)."""

    layout: Layout
    microbatches: int
    memory_bytes: float
    gpu_memory_bytes: float
    step_s: float
    mfu: float
    bottleneck: str
    time: dict = field(default_factory=dict)
    links: dict = field(default_factory=dict)
    memory: object = None
    hfu: float = float("nan")

    @property
    def fits(self) -> bool:
        return self.memory_bytes <= self.gpu_memory_bytes

    def to_frame(self):
        """Time components (seconds and share of the step) of this plan."""
        import pandas as pd

        df = pd.DataFrame({"seconds": self.time}).rename_axis("component")
        df["share"] = df["seconds"] / self.step_s
        return df


# ---- the cluster and the model as the cost model sees them -----------------------------------
@dataclass(frozen=True)
class _Ctx:
    model: ModelConfig
    gpus: int
    gpu: str
    global_batch_tokens: int
    seq_len: int
    gpus_per_node: int
    network: str
    nvlink: str
    precision: str
    dtype: str
    compute_efficiency: float
    dp_overlap: float
    overhead_bytes: float
    ep_copies: float | None = None
    ep_bytes: float = 2.0
    nv_ab: tuple = ()  # (alpha s, beta B/s) of the NVLink and of the network, resolved once
    net_ab: tuple = ()
    peak: float = 0.0  # FLOP/s per GPU at dtype
    cap: float = 0.0  # GPU memory, bytes
    hbm: float = 0.0  # HBM bandwidth, bytes/s
    calibration: object = None  # a Calibration, or None: the uncalibrated upper bound
    memo: dict = field(default_factory=dict, compare=False, repr=False)  # _memo's results for this context

    @property
    def sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len


def _context(
    model,
    *,
    gpus,
    gpu,
    global_batch_tokens,
    seq_len,
    gpus_per_node=8,
    network="infiniband-ndr",
    nvlink=None,
    precision="bf16-mixed",
    dtype="bf16",
    compute_efficiency=1.0,
    dp_overlap=0.8,
    overhead_bytes=4e9,
    ep_copies=None,
    ep_bytes=2.0,
    calibration="fitted",
) -> _Ctx:
    if isinstance(model, str):
        model = memory.preset(model)
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig or a preset name, got {type(model).__name__}")
    check_int("gpus", gpus)
    check_int("gpus_per_node", gpus_per_node)
    check_int("seq_len", seq_len)
    check_int("global_batch_tokens", global_batch_tokens)
    g = hardware.gpu(gpu)  # KeyError listing the GPUs
    check_multiple("global_batch_tokens", global_batch_tokens, seq_len, "seq_len")  # whole sequences per step
    nv = nvlink or g.nvlink
    if nv is None:
        raise ValueError(f"gpu={gpu!r} has no NVLink in data/hardware.yaml: pass nvlink= (a link name)")
    hardware.link(nv)
    hardware.link(network)
    g.peak(dtype)
    check_probability("compute_efficiency", compute_efficiency, lo_open=True)
    check_probability("dp_overlap", dp_overlap)
    check_number("overhead_bytes", overhead_bytes, 0, unit="bytes")
    memory.bytes_per_param(precision, "adam", False, None)  # raises naming precision
    if ep_copies is not None:  # None: top_k
        check_number("ep_copies", ep_copies, 0, lo_open=True, unit="token copies sent per MoE layer")
    check_number("ep_bytes", ep_bytes, 0, 4, lo_open=True, unit="bytes per element on the wire")
    nvl, net = hardware.link(nv), hardware.link(network)
    if isinstance(calibration, str):
        check_choice("calibration", calibration, ("fitted",))
        calibration = fitted_calibration()
    if calibration is not None:
        if not isinstance(calibration, Calibration):
            raise TypeError(f"calibration must be a Calibration, 'fitted' or None, got {type(calibration).__name__}")
        calibration.efficiency(gpu)  # raises naming the GPU when its generation was not fitted
    return _Ctx(
        model,
        gpus,
        gpu,
        global_batch_tokens,
        seq_len,
        gpus_per_node,
        network,
        nv,
        precision,
        dtype,
        float(compute_efficiency),
        float(dp_overlap),
        float(overhead_bytes),
        ep_copies,
        float(ep_bytes),
        (nvl.latency_s, nvl.per_direction_bytes_per_s),
        (net.latency_s, net.per_direction_bytes_per_s),
        g.peak(dtype),
        g.memory_bytes,
        g.hbm_bandwidth_bytes_per_s,
        calibration,
    )


# the assumptions every number depends on (each is a keyword of search/evaluate): _context's keyword defaults
DEFAULTS = {
    k: p.default for k, p in inspect.signature(_context).parameters.items() if p.default is not inspect.Parameter.empty
}


@lru_cache(maxsize=64)
def _layer_flops(model: ModelConfig, seq_len: int) -> tuple[tuple[float, ...], float, float]:
    """(forward FLOPs per token of each layer, of the LM head, of one layer's attention scores)."""
    b = _flops.breakdown(model, seq_len, causal=True).forward
    L = model.n_layers
    attn = (b["qkv"] + b["attn_scores"] + b["attn_values"] + b["out_proj"]) / L
    dense = _flops.mlp_forward_flops(model, model.ffn_hidden)
    if model.is_moe:
        moe = 2.0 * model.hidden * model.n_experts + (model.top_k + model.n_shared_experts) * _flops.mlp_forward_flops(
            model, model.expert_ffn_hidden
        )
        per = tuple(attn + (moe if i >= model.n_dense_layers else dense) for i in range(L))
    else:
        per = (attn + dense,) * L
    return per, b["lm_head"], b["attn_scores"] / L


@lru_cache(maxsize=64)
def _attn_core(model: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of one layer's attention core (scores + weighted values, causal)."""
    b = _flops.breakdown(model, seq_len, causal=True).forward
    return (b["attn_scores"] + b["attn_values"]) / model.n_layers


@lru_cache(maxsize=4096)
def _stage_compute(model: ModelConfig, seq_len: int, pp: int, dualpipe: bool) -> tuple[float, float, float, int, int]:
    """Heaviest rank: (forward FLOPs per token, of which in layers, attention scores, its layers,
    its MoE layers)."""
    per, head, scores = _layer_flops(model, seq_len)
    sizes = memory.stage_layers(model.n_layers, pp)
    starts = [sum(sizes[:i]) for i in range(pp)]
    best = None
    for st in range(pp):
        stages = [st, pp - 1 - st] if (dualpipe and pp > 1) else [st]
        layers = [i for s in stages for i in range(starts[s], starts[s] + sizes[s])]
        lay = sum(per[i] for i in layers) / len(stages)  # DualPipe: two half-loaded stages per rank
        fwd = lay + (head / len(stages) if pp - 1 in stages else 0.0)
        moe = sum(1 for i in layers if model.is_moe and i >= model.n_dense_layers) / len(stages)
        cand = (fwd, lay, scores * len(layers) / len(stages), len(layers) / len(stages), moe)
        if best is None or cand[0] > best[0]:
            best = cand
    return best


def _memo(ctx: _Ctx, fn, *args):
    """``fn(ctx.model, *args)`` remembered in the context: a search asks the same closed forms ~10^5
    times, and hashing the ModelConfig for an lru_cache costs more than most of them."""
    key = (fn, *args)
    try:
        return ctx.memo[key]
    except KeyError:
        out = ctx.memo[key] = fn(ctx.model, *args)
        return out


def _link(ctx: _Ctx, stride: int, size: int) -> tuple[str, float, float]:
    """(name, alpha s, beta B/s) of the link a group of ``size`` ranks at ``stride`` uses."""
    if stride * size <= ctx.gpus_per_node:
        return (ctx.nvlink, *ctx.nv_ab)
    return (ctx.network, *ctx.net_ab)


@lru_cache(maxsize=1 << 16)
def _coll(op: str, nbytes: float, n: int, alpha: float, beta: float) -> float:
    if n == 1 or nbytes == 0:
        return 0.0
    return collective_time(op, nbytes, n, alpha, beta, "pairwise" if op == "all_to_all" else "ring")


@lru_cache(maxsize=4096)
def bubble_ratio(schedule: str, p: int, m: int, v: int, r: float) -> float | None:
    """A pipeline's bubble, idle / busy time per stage (a ratio), from the closed forms of ``pipeline``:
    ``schedule`` at ``p`` stages, ``m`` micro-batches, ``v`` chunks per stage, backward = (2 + ``r``) x forward
    (``r``: the share of a forward recomputed). None where the schedule does not apply; memoised."""
    from ..pipeline import closed_form

    if p == 1:
        return 0.0
    name = "gpipe" if schedule == "gpipe" else schedule
    try:
        if schedule in ("zb-h1", "dualpipe"):
            cf = closed_form(name, p, m, v if schedule == "dualpipe" else None, F=1.0, B=1.0 + r, W=1.0)
        else:
            cf = closed_form(name, p, m, v if schedule == "interleaved-1f1b" else None, F=1.0, B=2.0 + r)
    except Exception:  # noqa: BLE001 - the schedule does not accept (p, m, v)
        return None
    return cf["bubble_ratio"]


@lru_cache(maxsize=8192)
def _stage_states(model: ModelConfig, tp: int, pp: int, ep: int, dualpipe: bool) -> tuple[float, float]:
    """(dense, expert) parameters per rank on the heaviest stage (for the closed-form memory bound
    and the DP gradient volume)."""
    t = TrainConfig(tp=tp, pp=pp, ep=ep, dp=ep, pp_schedule="dualpipe" if dualpipe else "1f1b")
    best = (0.0, 0.0)
    for st in range(pp):
        d, e, _, _ = memory.stage_params(model, t, st)
        if dualpipe and pp > 1:
            d2, e2, _, _ = memory.stage_params(model, t, pp - 1 - st)
            d, e = d + d2, e + e2
        if d + e > sum(best):
            best = (d, e)
    return best


def _states_bound(ctx: _Ctx, lay: Layout) -> float:
    """Closed-form lower bound of the memory per GPU: model states of the heaviest stage + overhead."""
    return (
        _memo(
            ctx,
            _states_bytes,
            ctx.precision,
            lay.tp,
            lay.pp,
            lay.ep,
            lay.schedule == "dualpipe",
            lay.dp * lay.cp,
            lay.zero,
        )
        + ctx.overhead_bytes
    )


@lru_cache(maxsize=1 << 14)
def _states_bytes(model, precision, tp, pp, ep, dual, zg, zero) -> float:
    d, e = _stage_states(model, tp, pp, ep, dual)
    b = memory.bytes_per_param(precision, "adam", False, None)
    eg = zg // ep
    tot = 0.0
    for key, zmin in (("param", 3), ("grad", 2), ("optimizer", 1), ("master", 1)):
        tot += b[key] * (d / zg if (zero >= zmin and zg > 1) else d)
        tot += b[key] * (e / eg if (zero >= zmin and eg > 1) else e)
    return tot


@lru_cache(maxsize=8192)
def _act_layer(model: ModelConfig, seq_len: int, precision: str, tp: int, cp: int, mb: int, recompute: str) -> float:
    """Smallest saved activations of one layer for one micro-batch (bytes, ``memory.layer_terms``)."""
    t = TrainConfig(micro_batch=mb, seq_len=seq_len, precision=precision, recompute=recompute, tp=tp, sp=tp > 1, cp=cp)
    kinds = {0, model.n_layers - 1}
    return min(sum(b for _, b in memory.layer_terms(model, t, layer=i)) for i in kinds)


@lru_cache(maxsize=4096)
def _in_flight_last(schedule: str, pp: int, m: int, v: int) -> float:
    t = TrainConfig(
        pp=pp,
        n_microbatches=m,
        pp_schedule=_MEM_SCHEDULE.get(schedule, schedule),
        virtual_stages=v if schedule == "interleaved-1f1b" else 1,
    )
    return memory.in_flight_microbatches(t, pp - 1)


@lru_cache(maxsize=1024)
def _max_chunks(n_layers: int, pp: int) -> int:
    return memory.max_chunks(n_layers, pp)


@lru_cache(maxsize=1024)
def _min_layers(n_layers: int, pp: int) -> int:
    return min(memory.stage_layers(n_layers, pp))


@lru_cache(maxsize=1024)
def _max_layers(n_layers: int, pp: int) -> int:
    return max(memory.stage_layers(n_layers, pp))


def _layers_short(ctx: _Ctx, lay: Layout, plan: Plan) -> int:
    """Recomputed layers per stage that ``plan`` (which does not fit) needs at least in addition: each one
    frees at most its stage's in-flight micro-batches x (a kept layer - its input) bytes on the heaviest
    stage, so fewer cannot bring that stage under the GPU's memory."""
    import math

    args = (ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch)
    (n_d, n_m), (f_d, f_m) = (_memo(ctx, _act_kinds, *args, rc) for rc in ("none", "full"))
    freed = plan.memory.in_flight * max(n_d - f_d, n_m - f_m)
    if freed <= 0:
        return 1
    return max(1, math.ceil((plan.memory_bytes - ctx.cap) / freed - 1e-9))


def _fewest_recomputed(ctx: _Ctx, lay: Layout, m: int, start: int) -> Layout | None:
    """``lay`` recomputing the fewest layers per stage, from ``start`` on, whose ``_stage_bound`` fits in
    the GPU; None once that is every layer of the heaviest stage (the ``recompute_layers=0`` candidate)."""
    for k in range(start, _max_layers(ctx.model.n_layers, lay.pp)):
        cand = dataclasses.replace(lay, recompute_layers=k)
        if _stage_bound(ctx, cand, m) * (1.0 - 1e-9) <= ctx.cap:
            return cand
    return None


def _bound(ctx: _Ctx, lay: Layout, m: int) -> float:
    """Closed-form lower bound of the heaviest stage's memory (bytes): the larger of the model
    states of the heaviest stage and the saved activations of the last stage (fewest layers,
    fewest in-flight micro-batches), each with ``overhead_bytes``."""
    states = _states_bound(ctx, lay)
    fl = _in_flight_last(lay.schedule, lay.pp, m, lay.v)
    n_min = _min_layers(ctx.model.n_layers, lay.pp)
    acts = _memo(ctx, _act_layer, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, lay.recompute)
    return max(states, acts * n_min * fl + ctx.overhead_bytes)


@lru_cache(maxsize=1 << 14)
def _act_kinds(model: ModelConfig, seq_len: int, precision: str, tp: int, cp: int, mb: int, recompute: str) -> tuple:
    """Saved activations of one dense-MLP layer and of one MoE layer for one micro-batch (bytes,
    ``memory.layer_terms``; the two kinds ``memory.estimate`` distinguishes)."""
    t = TrainConfig(micro_batch=mb, seq_len=seq_len, precision=precision, recompute=recompute, tp=tp, sp=tp > 1, cp=cp)
    last = model.n_layers - 1  # an MoE layer when the model has experts
    dense = sum(
        b for _, b in memory.layer_terms(model, t, layer=0 if model.n_dense_layers or not model.is_moe else last)
    )
    return dense, sum(b for _, b in memory.layer_terms(model, t, layer=last))


@lru_cache(maxsize=4096)
def _rank_layers(model: ModelConfig, pp: int, dualpipe: bool) -> tuple:
    """Per pipeline rank: (its stages, dense-MLP layers, MoE layers) summed over the stages it holds
    (DualPipe: stage st and pp-1-st)."""
    sizes = memory.stage_layers(model.n_layers, pp)
    starts = [sum(sizes[:i]) for i in range(pp)]
    out = []
    for st in range(pp):
        stages = [st, pp - 1 - st] if (dualpipe and pp > 1) else [st]
        layers = [i for s in stages for i in range(starts[s], starts[s] + sizes[s])]
        moe = sum(1 for i in layers if model.is_moe and i >= model.n_dense_layers)
        out.append((len(stages), len(layers) - moe, moe))
    return tuple(out)


@lru_cache(maxsize=1 << 14)
def _rank_states(model, precision, tp, pp, ep, dual, zg, zero) -> tuple:
    """Model-state bytes of every pipeline rank (the ``_states_bytes`` formula, stage by stage)."""
    t = TrainConfig(tp=tp, pp=pp, ep=ep, dp=ep, pp_schedule="dualpipe" if dual else "1f1b")
    b = memory.bytes_per_param(precision, "adam", False, None)
    eg = zg // ep
    out = []
    for st in range(pp):
        d, e, _, _ = memory.stage_params(model, t, st)
        if dual and pp > 1:
            d2, e2, _, _ = memory.stage_params(model, t, pp - 1 - st)
            d, e = d + d2, e + e2
        tot = 0.0
        for key, zmin in (("param", 3), ("grad", 2), ("optimizer", 1), ("master", 1)):
            tot += b[key] * (d / zg if (zero >= zmin and zg > 1) else d)
            tot += b[key] * (e / eg if (zero >= zmin and eg > 1) else e)
        out.append(tot)
    return tuple(out)


@lru_cache(maxsize=4096)
def _in_flight_all(schedule: str, pp: int, m: int, v: int) -> tuple:
    if pp == 1:
        return (1.0,)
    t = TrainConfig(
        pp=pp,
        n_microbatches=m,
        pp_schedule=_MEM_SCHEDULE.get(schedule, schedule),
        virtual_stages=v if schedule == "interleaved-1f1b" else 1,
    )
    return tuple(memory.in_flight_microbatches(t, st) for st in range(pp))


def _stage_bound(ctx: _Ctx, lay: Layout, m: int) -> float:
    """A tighter lower bound of ``memory.estimate``'s total (bytes), rank by rank: model states +
    saved activations of the rank's layers (dense and MoE layers counted apart) x its in-flight
    micro-batches + ``overhead_bytes``; only the layers outside the blocks (embedding, head, loss) and
    the transient buffers are left out. Costs O(pp): ``search`` asks it only for the layouts whose
    step time is good enough to be shown, before the exact estimate."""
    dual = lay.schedule == "dualpipe"
    states = _memo(ctx, _rank_states, ctx.precision, lay.tp, lay.pp, lay.ep, dual, lay.dp * lay.cp, lay.zero)
    k = lay.recompute_layers if lay.recompute == "full" else 0
    a_dense, a_moe = _memo(
        ctx, _act_kinds, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, "none" if k else lay.recompute
    )
    saved = 0.0  # a recomputed layer keeps only its input: at most this much less than a kept one
    if k:
        f_dense, f_moe = _memo(ctx, _act_kinds, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, "full")
        saved = max(a_dense - f_dense, a_moe - f_moe)
    fl = _in_flight_all(lay.schedule, lay.pp, m, lay.v)
    best = 0.0
    for s, (n_st, nd, nm), f in zip(states, _memo(ctx, _rank_layers, lay.pp, dual), fl):
        best = max(best, s + f * (nd * a_dense + nm * a_moe - min(k * n_st, nd + nm) * saved) / n_st)
    return best + ctx.overhead_bytes


def _train_config(ctx: _Ctx, lay: Layout, m: int) -> TrainConfig:
    return TrainConfig(
        micro_batch=lay.micro_batch,
        seq_len=ctx.seq_len,
        precision=ctx.precision,
        recompute=lay.recompute,
        recompute_layers=lay.recompute_layers or None,
        dp=lay.dp,
        tp=lay.tp,
        sp=lay.tp > 1,
        pp=lay.pp,
        pp_schedule=_MEM_SCHEDULE.get(lay.schedule, lay.schedule),
        virtual_stages=lay.v if lay.schedule == "interleaved-1f1b" else 1,
        n_microbatches=m,
        cp=lay.cp,
        ep=lay.ep,
        zero=lay.zero,
        flash_attention=True,
        kernels="fused",
        device="cuda",
        gpu=ctx.gpu,
        overhead_bytes=ctx.overhead_bytes,
    )


def _ctx_memo(ctx: _Ctx, fn, *args):
    """``fn(ctx, *args)`` remembered in the context (the communication terms: a few hundred distinct
    argument tuples among ~10^5 layouts)."""
    key = (fn, *args)
    try:
        return ctx.memo[key]
    except KeyError:
        out = ctx.memo[key] = fn(ctx, *args)
        return out


def _tp_cp_comm(ctx: _Ctx, tp: int, cp: int, mb: int, n_lay: int, frac: float) -> tuple:
    """(TP seconds, CP seconds per micro-batch, TP link, CP link). Rank order tp, cp, ep, dp/ep, pp.
    TP with sequence parallelism: all-gather + reduce-scatter of the activations twice per layer and
    forward pass (fwd, bwd, + re-fwd of the share ``frac`` of layers fully recomputed); CP: all-gather
    of K and V per forward pass, reduce-scatter of their gradients in backward."""
    model = ctx.model
    tp_l = _link(ctx, 1, tp)
    cp_l = _link(ctx, tp, cp)
    tokens = mb * ctx.seq_len  # one micro-batch, before CP
    act = tokens / cp * model.hidden * _ACT_BYTES  # one micro-batch's hidden states on this CP rank
    n_rc = 2.0 + frac  # forward passes with TP/CP traffic (fwd, bwd, re-fwd)
    tp_t = n_lay * n_rc * 2 * (_coll("all_gather", act, tp, *tp_l[1:]) + _coll("reduce_scatter", act, tp, *tp_l[1:]))
    kv_heads = model.n_heads if model.kv_lora_rank else model.n_kv_heads
    kv = 2 * tokens * kv_heads * model.head_dim * _ACT_BYTES / min(tp, kv_heads)
    cp_t = n_lay * (n_rc - 1) * _coll("all_gather", kv, cp, *cp_l[1:]) + n_lay * _coll(
        "reduce_scatter", kv, cp, *cp_l[1:]
    )
    return tp_t, cp_t, tp_l[0], cp_l[0]


def _ep_comm(ctx: _Ctx, tp: int, cp: int, ep: int, mb: int, n_moe: float) -> tuple:
    """(EP seconds per micro-batch: dispatch + combine all-to-all per MoE layer, forward and backward; link)."""
    model = ctx.model
    ep_l = _link(ctx, tp * cp, ep)
    copies = ctx.ep_copies if ctx.ep_copies is not None else (model.top_k or 1)
    a2a = mb * ctx.seq_len / cp / tp * copies * model.hidden * ctx.ep_bytes  # one rank's send buffer
    return (n_moe * 4 * _coll("all_to_all", a2a, ep, *ep_l[1:]) if ep > 1 else 0.0), ep_l[0]


def _pp_comm(ctx: _Ctx, tp: int, cp: int, dp: int, pp: int, mb: int) -> tuple:
    """(seconds of one activation send between stages per micro-batch, link)."""
    pp_l = _link(ctx, tp * cp * dp, pp)
    act = mb * ctx.seq_len / cp * ctx.model.hidden * _ACT_BYTES
    return ((pp_l[1] + act / (tp if tp > 1 else 1) / pp_l[2]) if pp > 1 else 0.0), pp_l[0]


def _dp_comm(ctx: _Ctx, tp: int, cp: int, ep: int, dp: int, pp: int, dual: bool, zero3: bool, m: int) -> tuple:
    """(DP seconds per step: gradient all-reduce over dp x cp, experts over dp x cp / ep; ZeRO-3 also
    gathers parameters in forward and backward of every micro-batch; link)."""
    dp_l = _link(ctx, tp, cp * dp)  # gradients reduced over dp x cp
    d_par, e_par = _memo(ctx, _stage_states, tp, pp, ep, dual)
    gbytes = _ACT_BYTES  # bf16 gradients on the wire
    zg = dp * cp
    dp_grad = _coll("all_reduce", d_par * gbytes, zg, *dp_l[1:]) + _coll(
        "all_reduce", e_par * gbytes, zg // ep, *dp_l[1:]
    )
    z3 = 0.0
    if zero3:  # gather parameters in forward and backward of every micro-batch
        z3 = (
            2
            * m
            * (_coll("all_gather", d_par * 2, zg, *dp_l[1:]) + _coll("all_gather", e_par * 2, zg // ep, *dp_l[1:]))
        )
    return dp_grad + z3, dp_l[0]


def _recomputed_share(lay: Layout, n_lay: float) -> float:
    """Share of the heaviest rank's layers (``n_lay`` per stage) fully recomputed: 0 without full
    recomputation, 1 with ``recompute_layers`` 0 (all), else ``recompute_layers / n_lay`` (each stage
    recomputes that many of its layers)."""
    if lay.recompute != "full":
        return 0.0
    if not lay.recompute_layers or not n_lay:
        return 1.0
    return min(1.0, lay.recompute_layers / n_lay)


def _pieces(ctx: _Ctx, lay: Layout) -> dict | None:
    """The calibration-free pieces of a layout's step (seconds at the datasheet peak and bandwidths,
    per micro-batch unless named otherwise); None if the schedule does not accept (pp, m, v).
    ``_assemble`` turns them into the time components under a ``Calibration``."""
    model = ctx.model
    m = ctx.sequences // (lay.dp * lay.micro_batch)
    dual = lay.schedule == "dualpipe"
    fwd_tok, lay_tok, scores_tok, n_lay, n_moe = _memo(ctx, _stage_compute, ctx.seq_len, lay.pp, dual)
    frac = _recomputed_share(lay, n_lay)  # of the heaviest rank's layers, re-run in backward
    r = {"none": 0.0, "selective": scores_tok / fwd_tok, "full": frac * lay_tok / fwd_tok}[lay.recompute]
    ratio = bubble_ratio(lay.schedule, lay.pp, m, lay.v, r)
    if ratio is None:
        return None
    core_tok = _memo(ctx, _attn_core, ctx.seq_len) * n_lay  # scores + values: the FlashAttention kernel's FLOPs
    tokens = lay.micro_batch * ctx.seq_len  # one micro-batch, before CP
    fwd = fwd_tok * tokens / (lay.tp * lay.cp)  # forward FLOPs of one micro-batch on this rank
    f_at = core_tok * tokens / (lay.tp * lay.cp)  # of which in the attention kernel
    rc_at = {"none": 0.0, "selective": scores_tok * tokens / (lay.tp * lay.cp), "full": frac * f_at}[lay.recompute]
    tp_t, cp_t, tp_l, cp_l = _ctx_memo(ctx, _tp_cp_comm, lay.tp, lay.cp, lay.micro_batch, n_lay, frac)
    ep_raw, ep_l = _ctx_memo(ctx, _ep_comm, lay.tp, lay.cp, lay.ep, lay.micro_batch, n_moe)
    p2p, pp_l = _ctx_memo(ctx, _pp_comm, lay.tp, lay.cp, lay.dp, lay.pp, lay.micro_batch)
    pp_t = 2 * (lay.v if lay.schedule == "interleaved-1f1b" else 1) * p2p
    dp_t, dp_l = _ctx_memo(ctx, _dp_comm, lay.tp, lay.cp, lay.ep, lay.dp, lay.pp, dual, lay.zero >= 3, m)
    h = model.hidden
    # non-matmul work (norms, residual adds, activations, dropout, softmax bookkeeping): memory-bound,
    # seconds per micro-batch for 1 byte per token per hidden unit per layer at HBM bandwidth
    elem = n_lay * tokens / (lay.tp * lay.cp) * h / ctx.hbm * (1.0 + frac / 3.0)
    links = {"tp": tp_l, "cp": cp_l, "ep": ep_l, "dp": dp_l, "pp": pp_l}
    return dict(
        m=m,
        ratio=ratio,
        r=r,
        fwd=fwd,
        at=f_at,
        rc_at=rc_at,
        peak=ctx.peak,
        tp=tp_t,
        cp=cp_t,
        ep=ep_raw,
        dual=dual,
        pp=pp_t,
        dp=dp_t,
        elem=elem,
        layers=n_lay * (1.0 + frac / 3.0),
        links=links,
    )


def _where(cond, a, b):
    """numpy.where on arrays (calibrate's runs), a plain branch on one layout (search: ~10^5 calls)."""
    if isinstance(cond, bool):
        return a if cond else b
    import numpy as np

    return np.where(cond, a, b)


def _maximum(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a if a >= b else b
    import numpy as np

    return np.maximum(a, b)


def _minimum(a, b):
    if isinstance(a, float) and isinstance(b, float):
        return a if a <= b else b
    import numpy as np

    return np.minimum(a, b)


def _assemble(p: dict, eta, attn_eff, overlap, elem_bytes, layer_s, dp_overlap) -> dict:
    """Seconds per step by component from ``_pieces``: matmuls at ``eta`` x peak (backward = 2 x
    forward, the DP traffic hides behind backward's matmul time), attention at
    ``eta x attn_eff`` x peak, a fraction ``overlap`` of TP/CP/EP traffic hidden (DualPipe hides EP
    behind the other micro-batch's compute instead), ``elem_bytes`` per token per hidden unit per layer
    at HBM bandwidth, ``layer_s`` seconds per layer and micro-batch that do not scale with its tokens
    (forward + backward, + a third per recomputed forward), ``dp_overlap`` of the DP traffic hidden behind
    backward. Works on floats and on numpy arrays of runs (``calibrate``)."""
    m = p["m"]
    f = p["fwd"] / (p["peak"] * eta)  # forward seconds of one micro-batch at matmul efficiency
    extra = (1.0 / attn_eff - 1.0) / (p["peak"] * eta)  # attention's extra seconds per FLOP
    compute = 3.0 * f + 3.0 * p["at"] * extra
    recompute = p["r"] * f + p["rc_at"] * extra
    tp_t = (1.0 - overlap) * p["tp"]
    cp_t = (1.0 - overlap) * p["cp"]
    ep_t = _where(p["dual"], _maximum(0.0, p["ep"] - (compute + recompute)), (1.0 - overlap) * p["ep"])
    elem = elem_bytes * p["elem"]
    fixed = layer_s * p["layers"]
    per_mb = compute + recompute + tp_t + cp_t + ep_t + p["pp"] + elem + fixed
    hidden = _minimum(dp_overlap * p["dp"], m * 2.0 * f)
    return {
        "compute": m * compute,
        "recompute": m * recompute,
        "non-matmul": m * elem,
        "fixed per layer": m * fixed,
        "TP comm": m * tp_t,
        "CP comm": m * cp_t,
        "EP comm": m * ep_t,
        "PP comm": m * p["pp"],
        "bubble": m * per_mb * p["ratio"],
        "DP comm": p["dp"] - hidden,
    }


def _time(ctx: _Ctx, lay: Layout) -> tuple[dict, int, dict] | None:
    """Modelled seconds per step by component, micro-batches per pipeline, links; None if the
    schedule does not accept (pp, m, v)."""
    p = _pieces(ctx, lay)
    if p is None:
        return None
    cal = ctx.calibration
    if cal is None:
        eta, ae, ov, eb, ls = ctx.compute_efficiency, 1.0, 0.0, 0.0, 0.0
    else:
        eta = ctx.compute_efficiency * cal.efficiency(ctx.gpu)
        ae, ov, eb, ls = cal.attn_eff, cal.overlap, cal.elem_bytes, cal.layer_s
    t = _assemble(p, eta, ae, ov, eb, ls, ctx.dp_overlap)  # floats in, floats out
    if cal is None:  # the uncalibrated model has no non-matmul or fixed term: its components as before calibration
        del t["non-matmul"], t["fixed per layer"]
    return t, p["m"], p["links"]


def _bottleneck(t: dict, step: float, mem: float, cap: float) -> str:
    loss = {k: v for k, v in t.items() if k != "compute"}
    name, worst = max(loss.items(), key=lambda kv: kv[1])
    parts = []
    if mem > 0.9 * cap:
        parts.append(f"memory ({mem / cap:.0%} of {cap / 1e9:.1f} GB)")
    if worst > 0.0:
        parts.append(f"{name} ({worst / step:.0%} of step)")
    else:
        parts.append("compute-bound (no overhead modelled)")
    return "; ".join(parts)


def _model_flops(ctx: _Ctx) -> float:
    return _flops.flops_per_token(ctx.model, ctx.seq_len, causal=True) * ctx.global_batch_tokens


def _plan(ctx: _Ctx, lay: Layout, tm=None, with_memory: bool = True) -> Plan | None:
    tm = tm or _time(ctx, lay)
    if tm is None:
        return None
    t, m, links = tm
    step = sum(t.values())
    mfu = _model_flops(ctx) / (ctx.gpus * ctx.peak * step)
    fwd_tok, lay_tok, scores_tok, n_lay, _ = _stage_compute(ctx.model, ctx.seq_len, lay.pp, lay.schedule == "dualpipe")
    frac = _recomputed_share(lay, n_lay)
    r = {"none": 0.0, "selective": scores_tok / fwd_tok, "full": frac * lay_tok / fwd_tok}[lay.recompute]
    br = memory.estimate(ctx.model, _train_config(ctx, lay, m)) if with_memory else None
    mem = br.total if br is not None else float("nan")
    return Plan(
        layout=lay,
        microbatches=m,
        memory_bytes=mem,
        gpu_memory_bytes=ctx.cap,
        step_s=step,
        mfu=mfu,
        bottleneck=_bottleneck(t, step, mem, ctx.cap),
        time=t,
        links=links,
        memory=br,
        hfu=mfu * (3.0 + r) / 3.0,
    )


def _rules(ctx: _Ctx, lay: Layout) -> str | None:
    """Why a layout is not allowed (None if it is): the planner's rules, then mlsys_nb.memory.check."""
    m = ctx.model
    if lay.gpus != ctx.gpus:
        return f"dp x tp x pp x cp = {lay.gpus} must equal gpus={ctx.gpus}"
    if lay.tp > ctx.gpus_per_node:
        return f"tp={lay.tp} must be <= gpus_per_node={ctx.gpus_per_node} (TP stays on NVLink)"
    if ctx.sequences % (lay.dp * lay.micro_batch):
        return (
            f"dp x micro_batch = {lay.dp * lay.micro_batch} must divide the {ctx.sequences} sequences of a step "
            f"(global_batch_tokens / seq_len)"
        )
    if lay.pp == 1 and (lay.schedule != "none" or lay.v != 1):
        return "pp=1 has no pipeline schedule (schedule='none', v=1)"
    if lay.pp > 1 and lay.schedule not in SCHEDULES:
        return f"schedule={lay.schedule!r}: allowed {SCHEDULES}"
    try:
        memory.check(m, _train_config(ctx, lay, ctx.sequences // (lay.dp * lay.micro_batch)))
    except ValueError as e:
        return str(e)
    return None


def evaluate(
    model, layout: Layout | None = None, *, gpus: int, gpu: str, global_batch_tokens: int, seq_len: int, **kw
) -> Plan:
    """The modelled cost of one layout (``Layout(...)`` or its fields as keywords: ``dp=``,
    ``tp=``, ...). Raises ValueError naming the rule a layout breaks; see ``search`` for the
    assumptions (keywords ``DEFAULTS``)."""
    lay_kw = {k: kw.pop(k) for k in list(kw) if k in Layout.__dataclass_fields__}
    ctx = _context(model, gpus=gpus, gpu=gpu, global_batch_tokens=global_batch_tokens, seq_len=seq_len, **kw)
    if layout is None:
        if "dp" not in lay_kw:
            lay_kw["dp"] = ctx.gpus // (lay_kw.get("tp", 1) * lay_kw.get("pp", 1) * lay_kw.get("cp", 1)) or 1
        if lay_kw.get("pp", 1) == 1:
            lay_kw.setdefault("schedule", "none")
        layout = Layout(**lay_kw)
    why = _rules(ctx, layout)
    if why:
        raise ValueError(f"layout {layout} is not allowed: {why}")
    plan = _plan(ctx, layout)
    if plan is None:
        raise ValueError(
            f"schedule={layout.schedule!r} does not accept pp={layout.pp}, "
            f"m={ctx.sequences // (layout.dp * layout.micro_batch)} micro-batches, v={layout.v}"
        )
    return plan


def _candidates(ctx: _Ctx, tp, pp, cp, ep, zero, recompute, micro_batch, schedules, v) -> tuple[list, dict]:
    """Layouts passing the rules, and a count of rejections by reason (for the error message)."""
    m = ctx.model
    rejected: dict[str, int] = {}
    out = []
    pow2 = [2**i for i in range(0, 12)]
    tps = _degrees("tp", tp, [d for d in pow2 if d <= ctx.gpus_per_node])
    pps = _degrees("pp", pp, [d for d in _divisors(ctx.gpus) if d <= m.n_layers])
    cps = _degrees("cp", cp, [d for d in pow2 if d <= 32 and ctx.seq_len // d >= 1024])
    eps = _degrees("ep", ep, [d for d in _divisors(m.n_experts)] if m.is_moe else [1])
    mbs = _degrees("micro_batch", micro_batch, [1, 2, 4, 8])
    vs = _degrees("v", v, [2, 4, 8])
    for name, vals, allowed in (
        ("zero", zero, (0, 1, 2, 3)),
        ("recompute", recompute, ("none", "selective", "full")),
        ("schedules", schedules, SCHEDULES),
    ):
        for x in vals:
            check_choice(f"each of {name}", x, allowed)
    for t_, p_, c_ in itertools.product(tps, pps, cps):
        if ctx.gpus % (t_ * p_ * c_):
            continue
        d_ = ctx.gpus // (t_ * p_ * c_)
        for e_ in eps:
            chunks = {"interleaved-1f1b": vs, "dualpipe": [2]}
            scheds = [("none", 1)] if p_ == 1 else [(s, vv) for s in schedules for vv in chunks.get(s, [1])]
            base = Layout(dp=d_, tp=t_, pp=p_, cp=c_, ep=e_, micro_batch=1, schedule=scheds[0][0], v=scheds[0][1])
            why = (
                _rules(ctx, base)
                if ctx.sequences % d_ == 0
                else (f"dp={d_} must divide the {ctx.sequences} sequences of a step")
            )
            if why and "sequences" not in why:
                key = why.split(":")[0][:120]
                rejected[key] = rejected.get(key, 0) + 1
                continue
            for mb, (s, vv) in itertools.product(mbs, scheds):
                if ctx.sequences % (d_ * mb):
                    key = "dp x micro_batch must divide the sequences per step"
                    rejected[key] = rejected.get(key, 0) + 1
                    continue
                if s == "interleaved-1f1b" and vv > _max_chunks(m.n_layers, p_):
                    continue
                partial = "full" in recompute and _max_layers(m.n_layers, p_) > 1
                for z, r in itertools.product(zero, recompute):
                    out.append(Layout(d_, t_, p_, c_, e_, z, r, mb, s, vv))
                    if r == "full" and partial:  # recompute some layers only: search picks how many
                        out.append(Layout(d_, t_, p_, c_, e_, z, r, mb, s, vv, 1))
    return out, rejected


def search(
    model,
    *,
    gpus: int,
    gpu: str,
    global_batch_tokens: int,
    seq_len: int,
    gpus_per_node: int = 8,
    tp=None,
    pp=None,
    cp=None,
    ep=None,
    zero=(0, 1, 2, 3),
    recompute=("none", "selective", "full"),
    micro_batch=None,
    schedules=("1f1b", "interleaved-1f1b", "zb-h1", "dualpipe"),
    v=None,
    top: int | None = 50,
    **assumptions,
):
    """Layouts of ``model`` (a ``ModelConfig`` or preset name) on ``gpus`` GPUs of type ``gpu``
    (``data/hardware.yaml``) that fit in memory, best first by modelled step time (seconds).

    ``global_batch_tokens`` per optimizer step, ``seq_len`` tokens per sequence (``dp x micro_batch``
    must divide the sequences per step; the rest is gradient accumulation / pipeline micro-batches).
    ``tp``/``pp``/``cp``/``ep``/``micro_batch``/``v``: an int or candidates (default: tp powers of 2
    up to ``gpus_per_node``, pp divisors of ``gpus`` up to the layer count, cp 1..32, ep divisors of
    the expert count, micro-batch 1..8 sequences, v in 2, 4, 8 chunks per rank for interleaved 1F1B, up to
    ``memory.max_chunks``: the first chunk may hold only the embedding, the last only the head). ``top``: keep the
    best ``top`` feasible rows (None: all). ``assumptions``: ``DEFAULTS`` (network link, NVLink override,
    precision, peak dtype, compute_efficiency, dp_overlap, overhead_bytes); see the module docstring.

    Returns a DataFrame with ``COLUMNS`` (``memory_bytes`` of the heaviest stage incl. overhead,
    ``step_s`` modelled seconds per step, ``mfu`` model FLOPs utilisation, ``bottleneck`` in words),
    index 0..n-1; ``.attrs`` holds the assumptions and counts. Raises ValueError when nothing fits,
    naming the layout with the smallest memory shortfall (or the rules that rejected everything)."""
    import pandas as pd

    unknown = set(assumptions) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown keyword(s) {sorted(unknown)}; allowed assumptions: {sorted(DEFAULTS)}")
    ctx = _context(
        model,
        gpus=gpus,
        gpu=gpu,
        global_batch_tokens=global_batch_tokens,
        seq_len=seq_len,
        gpus_per_node=gpus_per_node,
        **assumptions,
    )
    if top is not None:
        check_int("top", top)
    zero = [zero] if isinstance(zero, int) else list(zero)
    recompute = [recompute] if isinstance(recompute, str) else list(recompute)
    schedules = [schedules] if isinstance(schedules, str) else list(schedules)
    cands, rejected = _candidates(ctx, tp, pp, cp, ep, zero, recompute, micro_batch, schedules, v)
    if not cands:
        reasons = "; ".join(f"{k} ({n}x)" for k, n in sorted(rejected.items(), key=lambda kv: -kv[1])[:5])
        raise ValueError(f"no layout of {ctx.model.name or 'the model'} on gpus={gpus} passes the rules: {reasons}")
    # 1) closed forms for every candidate: a memory lower bound (prune), then the step time
    cap = ctx.cap
    timed, pruned, cache = [], [], {}
    for lay in cands:
        m = ctx.sequences // (lay.dp * lay.micro_batch)
        bound = _bound(ctx, lay, m)
        if bound > cap:
            pruned.append((bound, lay))
            continue
        key = (
            lay.dp,
            lay.tp,
            lay.pp,
            lay.cp,
            lay.ep,
            lay.zero == 3,
            lay.recompute,
            lay.recompute_layers,
            lay.micro_batch,
            lay.schedule,
            lay.v,
        )
        if key not in cache:
            cache[key] = _time(ctx, lay)
        tm = cache[key]
        if tm is not None:
            timed.append((sum(tm[0].values()), lay, tm))
    # 2) memory estimates in order of step time until `top` layouts fit. A layout recomputing some layers
    # (recompute_layers > 0) enters timed with one layer, a lower bound of its time; when it does not fit it
    # comes back with the fewest layers that may fit, re-timed (slower: it waits its turn in the heap)
    heap = [(step, i, lay, tm) for i, (step, lay, tm) in enumerate(timed)]
    heapq.heapify(heap)
    seq = len(heap)
    plans, evaluated, best_short = [], 0, None  # best_short: (shortfall bytes, layout, bytes)
    kept_all = set()  # layouts that fit recomputing nothing: recomputing some layers is slower and not needed
    while heap:
        _step, _, lay, tm = heapq.heappop(heap)
        if lay.recompute_layers and dataclasses.replace(lay, recompute="none", recompute_layers=0) in kept_all:
            continue  # (the variant without recomputation is faster, so it came out of the heap first)
        sb = _stage_bound(ctx, lay, tm[1])
        fits = sb * (1.0 - 1e-9) <= cap  # else cannot fit (a lower bound; margin for rounding): no estimate
        plan = None
        if fits:
            plan = _plan(ctx, lay, tm)
            evaluated += 1
        if plan is None or not plan.fits:
            if lay.recompute_layers:  # as many more recomputed layers as the estimate or the bound asks
                more = 0 if plan is None else _layers_short(ctx, lay, plan)
                nxt = _fewest_recomputed(ctx, lay, tm[1], lay.recompute_layers + more)
                if nxt is not None:
                    t2 = _time(ctx, nxt)
                    heapq.heappush(heap, (sum(t2[0].values()), seq, nxt, t2))
                    seq += 1
                continue
            if plan is None:
                pruned.append((sb, lay))
            elif best_short is None or plan.memory_bytes - cap < best_short[0]:
                best_short = (plan.memory_bytes - cap, lay, plan.memory_bytes)
            continue
        plans.append(plan)
        if lay.recompute == "none":
            kept_all.add(lay)
        if top is not None and len(plans) >= top:
            break
    if not plans:
        # branch and bound over the pruned layouts: their bound is a lower bound of their need
        for bound, lay in sorted(pruned, key=lambda x: x[0]):
            if best_short is not None and bound - cap >= best_short[0]:
                break
            m = ctx.sequences // (lay.dp * lay.micro_batch)
            try:
                need = memory.estimate(ctx.model, _train_config(ctx, lay, m)).total
            except ValueError:
                continue
            evaluated += 1
            if best_short is None or need - cap < best_short[0]:
                best_short = (need - cap, lay, need)
        if best_short is None:
            raise ValueError("no candidate layout is accepted by its pipeline schedule (try schedules='1f1b')")
        short, lay, mem = best_short
        raise ValueError(
            f"no layout fits in {gpu} memory ({cap / 1e9:.0f} GB): the closest, {lay}, needs {mem / 1e9:.1f} GB, "
            f"{short / 1e9:.1f} GB too much (incl. overhead_bytes={ctx.overhead_bytes / 1e9:.1f} GB). "
            "Add GPUs, recomputation, ZeRO, or a smaller micro-batch/sequence."
        )
    rows = []
    for p in plans:
        lay = p.layout
        rows.append(
            dict(
                dp=lay.dp,
                tp=lay.tp,
                pp=lay.pp,
                cp=lay.cp,
                ep=lay.ep,
                zero=lay.zero,
                recompute=lay.recompute,
                recompute_layers=lay.recompute_layers,
                micro_batch=lay.micro_batch,
                schedule=lay.schedule,
                v=lay.v,
                memory_bytes=p.memory_bytes,
                step_s=p.step_s,
                mfu=p.mfu,
                bottleneck=p.bottleneck,
            )
        )
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(
        dict(
            candidates=len(cands),
            pruned=len(pruned),
            timed=len(timed),
            memory_estimates=evaluated,
            assumptions={k: getattr(ctx, k) for k in DEFAULTS},
            gpu_memory_bytes=cap,
            gpus=gpus,
            gpu=gpu,
            global_batch_tokens=global_batch_tokens,
            seq_len=seq_len,
        )
    )
    return df


def clear_caches() -> None:
    """Forget the memoised closed forms (benchmarks time a cold search with it)."""
    for f in (
        _layer_flops,
        _stage_compute,
        _coll,
        bubble_ratio,
        _stage_states,
        _states_bytes,
        _act_layer,
        _in_flight_last,
        _min_layers,
        _max_layers,
        _max_chunks,
        _attn_core,
        _act_kinds,
        _rank_layers,
        _rank_states,
        _in_flight_all,
    ):
        f.cache_clear()


def rank_of(df, **layout) -> int | None:
    """Position (0 = best) of the first row matching the given column values, or None."""
    mask = None
    for k, val in layout.items():
        check_choice("column", k, list(df.columns))
        mk = df[k] == val
        mask = mk if mask is None else (mask & mk)
    idx = df.index[mask] if mask is not None else df.index
    return int(idx[0]) if len(idx) else None


# ---- calibration on published runs -----------------------------------------------------------
_GENERATIONS = {"A100": "ampere", "H100": "hopper", "H800": "hopper", "H200": "hopper"}
PARAMS = ("eff_ampere", "eff_hopper", "attn_eff", "overlap", "elem_bytes", "layer_s")
# fitted by calibrate(); attn_eff is held at 1.0 (attention at the matmuls' efficiency): only one
# published run (Llama 3's 128K stage) is attention-heavy, so a fit cannot both use it and be checked on it
FITTED = ("eff_ampere", "eff_hopper", "overlap", "elem_bytes", "layer_s")
FIXED = {"attn_eff": 1.0}
# (low, high) of each fitted parameter, with its physical meaning (see Calibration)
BOUNDS = {
    "eff_ampere": (0.3, 1.0),
    "eff_hopper": (0.3, 1.0),
    "attn_eff": (0.2, 1.0),
    "overlap": (0.0, 1.0),
    "elem_bytes": (0.0, 400.0),
    "layer_s": (0.0, 2e-3),
}


@lru_cache(maxsize=64)
def generation(gpu: str) -> str:
    """GPU generation whose matmul efficiency is fitted ('ampere' for A100, 'hopper' for H100/H800/H200)."""
    for prefix, gen in _GENERATIONS.items():
        if gpu.startswith(prefix):
            return gen
    raise ValueError(
        f"gpu={gpu!r}: no published run of its generation to fit a matmul efficiency on "
        f"(fitted: {sorted(set(_GENERATIONS.values()))}); pass calibration=None (datasheet peak) "
        "or a Calibration naming its efficiency"
    )


@dataclass(frozen=True)
class Calibration:
    """Efficiency parameters of the step-time model, each with a physical meaning and a range (``BOUNDS``):

    - ``eff_ampere``, ``eff_hopper``: achievable fraction of the datasheet dense peak for the
      transformer's matmuls on A100 / H100-class GPUs (a large BF16 GEMM reaches about 0.7-0.8);
    - ``attn_eff``: the attention kernel's (FlashAttention: scores + values) throughput relative to
      those matmuls (FlashAttention-2 reports about 50-70 % of peak forward+backward on A100, less
      than a GEMM: Dao 2023, arXiv:2307.08691);
    - ``overlap``: fraction of TP/CP/EP traffic hidden behind compute (0: none);
    - ``elem_bytes``: bytes moved at HBM bandwidth per token per hidden unit per layer by the
      non-matmul kernels (norms, residuals, activations, dropout), forward + backward;
    - ``layer_s``: seconds per layer and micro-batch, forward + backward, that do not scale with the
      micro-batch's tokens (kernel launches and tails, synchronisation between a layer's kernels and
      collectives; the fit also puts here the lower efficiency of narrow per-rank GEMMs of small models): why
      throughput per GPU grows with the micro-batch size (Narayanan et al. 2021, arXiv:2104.04473, §3.4).

    ``dp_overlap`` (DP traffic hidden behind backward) stays an assumption of ``search``
    (default 0.8), not fitted. ``calibrate()`` fits these on ``data/published_runs.yaml``."""

    eff_ampere: float
    eff_hopper: float
    attn_eff: float
    overlap: float
    elem_bytes: float
    layer_s: float = 0.0

    def __post_init__(self):
        for k in PARAMS:
            lo, hi = BOUNDS[k]
            check_number(k, getattr(self, k), lo, hi)

    def efficiency(self, gpu: str) -> float:
        return getattr(self, f"eff_{generation(gpu)}")

    def as_tuple(self) -> tuple:
        return tuple(getattr(self, k) for k in PARAMS)


def _runs_file():
    from pathlib import Path

    return Path(__file__).resolve().parent.parent.parent / "data" / "published_runs.yaml"


@lru_cache(maxsize=1)
def _runs_raw() -> dict:
    import yaml

    return yaml.safe_load(_runs_file().read_text())


@lru_cache(maxsize=1)
def fitted_calibration() -> Calibration:
    """The calibration stored in ``data/published_runs.yaml`` (key ``calibration``), written from
    ``calibrate()`` on every run with role 'fit' (tests/test_planner.py checks it is that fit)."""
    return Calibration(**{k: float(v) for k, v in _runs_raw()["calibration"].items() if k in PARAMS})


def published_runs(role: str | None = None) -> list[dict]:
    """The runs of ``data/published_runs.yaml`` (``role``: 'fit', 'check' or None for all), each with
    ``config`` (a ModelConfig), ``setup`` (keywords of ``evaluate``/``search``), ``layout`` (a Layout),
    ``reported_step_s`` (seconds per step implied by the reported throughput and the FLOPs the paper
    counts; None where no throughput is reported) and ``reported_mfu`` (this kit's model FLOPs over
    GPUs x BF16 peak x that step)."""
    out = []
    for raw in _runs_raw()["runs"]:
        if role is not None and raw["role"] != role:
            continue
        r = dict(raw)
        if "shape" in r:
            cfg = ModelConfig(**r["shape"], name=r["name"])
        else:
            cfg = memory.preset(r["model"])
        tokens = r["global_batch"] * r["seq_len"]
        setup = dict(gpus=r["gpus"], gpu=r["gpu"], global_batch_tokens=tokens, seq_len=r["seq_len"])
        setup.update(network=r["network"], **r.get("options", {}))
        lay = Layout(**r["layout"])
        rep, g = r["reported"], hardware.gpu(r["gpu"])
        model_flops = _flops.flops_per_token(cfg, r["seq_len"], causal=True) * tokens
        step = None
        if "step_s" in rep:
            step = float(rep["step_s"])
        elif r["counts"] == "megatron-eq3":
            B, s_, L, h, V = r["global_batch"], r["seq_len"], cfg.n_layers, cfg.hidden, cfg.vocab_size
            F = 96 * B * s_ * L * h**2 * (1 + s_ / (6 * h) + V / (16 * L * h))  # Narayanan et al. 2021, eq. 3
            step = F / (r["gpus"] * rep["tflops_per_gpu"] * 1e12)
        elif r["counts"] == "package-model":
            step = model_flops / (r["gpus"] * rep["tflops_per_gpu"] * 1e12)
        r.update(config=cfg, setup=setup, layout=lay, reported_step_s=step)
        r["reported_mfu"] = model_flops / (r["gpus"] * g.peak("bf16") * step) if step else None
        out.append(r)
    return out


def _run_pieces(runs) -> dict:
    """``_pieces`` of each run's published layout as numpy arrays (calibration-free, computed once)."""
    import numpy as np

    rows = []
    for r in runs:
        ctx = _context(r["config"], **r["setup"], calibration=None)
        p = _pieces(ctx, r["layout"])
        if p is None:
            raise ValueError(f"run {r['name']}: schedule {r['layout'].schedule} does not accept its layout")
        if not r.get("sequence_parallel", True):  # norms/dropout not split over TP ranks
            p = {**p, "elem": p["elem"] * r["layout"].tp}
        rows.append(p)
    keys = [k for k in rows[0] if k != "links"]
    out = {k: np.array([p[k] for p in rows], dtype=float) for k in keys}
    out["dual"] = out["dual"].astype(bool)
    out["gen"] = np.array([generation(r["gpu"]) == "hopper" for r in runs])
    return out


def _predict(pieces: dict, theta, dp_overlap: float = DEFAULTS["dp_overlap"]):
    """Modelled step seconds of each run for parameters ``theta`` (order ``PARAMS``)."""
    import numpy as np

    ea, eh, ae, ov, eb, ls = theta
    eta = np.where(pieces["gen"], eh, ea)
    return sum(_assemble(pieces, eta, ae, ov, eb, ls, dp_overlap).values())


@dataclass
class Fit:
    """Result of ``calibrate``: the ``calibration``, the runs it used, the modelled and reported MFU
    of each (in-sample), leave-one-out predictions (each run predicted by a fit without it) and
    bootstrap percentile intervals of every parameter (resampling runs)."""

    calibration: Calibration
    table: object  # pandas DataFrame, one row per run
    intervals: dict  # parameter -> (2.5 %, 97.5 %)
    bootstrap: object  # numpy array (n_boot, len(PARAMS))


def _full(free, fixed) -> list:
    """All ``PARAMS`` from the fitted ones (order ``FITTED``) and the fixed ones."""
    it = iter(free)
    return [fixed[k] if k in fixed else next(it) for k in PARAMS]


def _fit(pieces, logrep, idx, x0=None, fixed=FIXED):
    """Fitted parameters (order: ``PARAMS`` less ``fixed``) on the runs ``idx``."""
    import numpy as np
    from scipy.optimize import least_squares

    free = [k for k in PARAMS if k not in fixed]
    lo = np.array([BOUNDS[k][0] for k in free])
    hi = np.array([BOUNDS[k][1] for k in free])
    sub = {k: v[idx] for k, v in pieces.items()}
    y = logrep[idx]
    start = {"eff_ampere": 0.7, "eff_hopper": 0.7, "attn_eff": 0.7, "overlap": 0.5, "elem_bytes": 50.0, "layer_s": 1e-4}
    x0 = np.array([start[k] for k in free]) if x0 is None else np.asarray(x0)
    x0 = np.clip(x0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))

    def res(th):
        return y - np.log(_predict(sub, _full(th, fixed)))

    return least_squares(res, x0, bounds=(lo, hi), x_scale=hi - lo).x


def calibrate(runs=None, *, loo: bool = True, n_boot: int = 0, seed: int = 0, fixed=None) -> Fit:
    """Fit ``FITTED`` (the others held at ``fixed``, default ``FIXED``) by bounded least squares on
    log(reported step / modelled step) over ``runs``
    (default: every run with role 'fit' in ``data/published_runs.yaml``), i.e. on log MFU with the
    same FLOPs on both sides. ``loo``: predict each run from a fit on the others; ``n_boot``: refits on
    runs resampled with replacement (percentile intervals, ``seed``)."""
    import numpy as np
    import pandas as pd

    runs = published_runs("fit") if runs is None else runs
    fixed = FIXED if fixed is None else fixed
    for k in fixed:
        check_choice("each key of fixed", k, PARAMS)
    free = [k for k in PARAMS if k not in fixed]
    if len(runs) <= len(free):
        raise ValueError(f"runs: need more than {len(free)} runs to fit {len(free)} parameters, got {len(runs)}")
    pieces = _run_pieces(runs)
    step_rep = np.array([r["reported_step_s"] for r in runs])
    logrep = np.log(step_rep)
    n = len(runs)
    theta = _fit(pieces, logrep, np.arange(n), fixed=fixed)
    fit_step = _predict(pieces, _full(theta, fixed))
    rep_mfu = np.array([r["reported_mfu"] for r in runs])
    table = pd.DataFrame(
        {
            "run": [r["name"] for r in runs],
            "gpu": [r["gpu"] for r in runs],
            "gpus": [r["gpus"] for r in runs],
            "reported_mfu": rep_mfu,
            "fit_mfu": rep_mfu * step_rep / fit_step,
        }
    )
    if loo:
        pred = np.empty(n)
        for i in range(n):
            keep = np.array([j for j in range(n) if j != i])
            th = _fit(pieces, logrep, keep, x0=theta, fixed=fixed)
            pred[i] = _predict({k: v[[i]] for k, v in pieces.items()}, _full(th, fixed))[0]
        table["heldout_mfu"] = rep_mfu * step_rep / pred
        table["heldout_error"] = table["heldout_mfu"] / table["reported_mfu"] - 1.0
    boots = np.empty((0, len(free)))
    intervals = {}
    if n_boot:
        rng = np.random.default_rng(seed)
        boots = np.array([_fit(pieces, logrep, rng.integers(0, n, n), x0=theta, fixed=fixed) for _ in range(n_boot)])
        intervals = {k: tuple(np.percentile(boots[:, j], [2.5, 97.5])) for j, k in enumerate(free)}
    return Fit(Calibration(*map(float, _full(theta, fixed))), table, intervals, boots)


# where each time component's formula comes from (compare() names it with the deciding term)
TERM_SOURCES = {
    "compute": "matmul FLOPs of the heaviest stage (mlsys_nb.flops; Narayanan et al. 2021, arXiv:2104.04473, "
    "eq. 3 less recomputation) at the fitted matmul efficiency",
    "recompute": "Korthikanti et al. 2022, arXiv:2205.05198 (full recomputation re-runs the forward, "
    "selective the attention core)",
    "non-matmul": "Ivanov et al. 2021, arXiv:2007.00072 (normalisation and element-wise kernels are memory-bound); "
    "bytes fitted",
    "TP comm": "Korthikanti et al. 2022, arXiv:2205.05198 (sequence parallelism: all-gather + reduce-scatter per "
    "layer), alpha-beta ring costs (Thakur et al. 2005)",
    "CP comm": "Llama Team 2024, arXiv:2407.21783, §3.3.2 (all-gather of K and V per layer)",
    "EP comm": "DeepSeek-AI 2024, arXiv:2412.19437, §3.2 (dispatch and combine all-to-all, DualPipe overlap)",
    "PP comm": "Narayanan et al. 2021, arXiv:2104.04473 (one activation per stage boundary and micro-batch)",
    "bubble": "Narayanan et al. 2021, arXiv:2104.04473 (1F1B, interleaved); Qi et al. 2023, arXiv:2401.10241 "
    "(ZB-H1); DeepSeek-AI 2024, arXiv:2412.19437 (DualPipe)",
    "DP comm": "Patarasuk & Yuan 2009 (ring all-reduce); Rajbhandari et al. 2020, arXiv:1910.02054 (ZeRO)",
    "fixed per layer": "Narayanan et al. 2021, arXiv:2104.04473, §3.4 (a micro-batch's time does not scale with its "
    "size: throughput per GPU grows with it); seconds per layer fitted",
}


def effective_training_time(run: str = "llama3-405b") -> tuple[float, str]:
    """(fraction of wall-clock time spent training, source) of a published run (``goodput`` in
    ``data/published_runs.yaml``; Llama 3: 'higher than 90 %', a lower bound)."""
    table = _runs_raw()["goodput"]
    check_choice("run", run, list(table))
    return float(table[run]["effective_training_time"]), table[run]["source"]


def goodput_mfu(mfu: float, effective_time: float) -> float:
    """MFU over the wall-clock time of a run, failures and restarts included: ``mfu`` (while training)
    x ``effective_time`` (the fraction of the time spent training; Llama 3 reports > 0.90 over a 54-day
    snapshot, arXiv:2407.21783 §3.3.4)."""
    check_probability("mfu", mfu)
    check_probability("effective_time", effective_time)
    return mfu * effective_time


def compare(a: Plan, b: Plan):
    """Where the time goes in two plans: seconds per component of ``a`` and ``b``, ``b - a``, and in
    ``.attrs['decides']`` the component whose difference is largest in the direction of the total
    (the term by which the faster plan wins; ``.attrs['total']`` is b.step_s - a.step_s;
    ``.attrs['source']`` where that term's formula comes from, ``TERM_SOURCES``)."""
    import pandas as pd

    df = pd.DataFrame({"a": pd.Series(a.time), "b": pd.Series(b.time)}).fillna(0.0)
    df["b - a"] = df["b"] - df["a"]
    total = b.step_s - a.step_s
    sign = 1.0 if total >= 0 else -1.0
    decides = (sign * df["b - a"]).idxmax()
    df.attrs.update(decides=decides, total=total, source=TERM_SOURCES.get(decides))
    return df.rename_axis("component")


def _distinct_rank(ctx: _Ctx, lays: list, pieces: list, cal: Calibration, want: Layout) -> int | None:
    """Rank (1 = best) of ``want``'s degrees among the distinct (dp, tp, pp, cp, ep) of ``lays`` timed
    under ``cal`` (their ``_pieces``), or None."""
    eta = ctx.compute_efficiency * cal.efficiency(ctx.gpu)
    args = (cal.attn_eff, cal.overlap, cal.elem_bytes, cal.layer_s, ctx.dp_overlap)
    step = [sum(_assemble(p, eta, *args).values()) for p in pieces]
    seen, target = set(), (want.dp, want.tp, want.pp, want.cp, want.ep)
    for i in sorted(range(len(lays)), key=step.__getitem__):
        key = (lays[i].dp, lays[i].tp, lays[i].pp, lays[i].cp, lays[i].ep)
        if key not in seen:
            seen.add(key)
            if key == target:
                return len(seen)
    return None


def sensitivity(fit: Fit, runs=None, *, top: int = 100):
    """Which fitted parameter moves the ranking most: for each run (default: every 'fit' run) the rank
    (1 = best) of its published degrees among the distinct (dp, tp, pp, cp, ep) layouts, at the fit
    and with each parameter of ``FITTED`` set to either end of its bootstrap interval (the others at
    the fit). Memory does not depend on the calibration, so the layouts that fit stay the same: the
    ``top`` best rows of the search at the fit are re-timed (a layout outside them is not seen: rank
    None). Returns a DataFrame (run, parameter, value, rank, fitted_rank, change)."""
    import pandas as pd

    if not fit.intervals:
        raise ValueError("fit: needs bootstrap intervals (calibrate(n_boot=...) with n_boot > 0)")
    check_int("top", top)
    runs = published_runs("fit") if runs is None else runs
    cal = fit.calibration
    rows = []
    for r in runs:
        df = search(r["config"], **r["setup"], calibration=cal, top=top)
        ctx = _context(r["config"], **r["setup"], calibration=cal)
        lays = [Layout(*(row[k] for k in Layout.__dataclass_fields__)) for _, row in df.iterrows()]
        pieces = [_pieces(ctx, lay) for lay in lays]

        base = _distinct_rank(ctx, lays, pieces, cal, r["layout"])
        for k in FITTED:
            if k.startswith("eff_") and k != f"eff_{generation(ctx.gpu)}":
                continue  # another generation's efficiency: no effect on this run
            for v in fit.intervals[k]:
                moved = Calibration(**{**{q: getattr(cal, q) for q in PARAMS}, k: float(v)})
                got = _distinct_rank(ctx, lays, pieces, moved, r["layout"])
                change = None if (got is None or base is None) else got - base
                rows.append(dict(run=r["name"], parameter=k, value=float(v), rank=got, fitted_rank=base, change=change))
    return pd.DataFrame(rows)
