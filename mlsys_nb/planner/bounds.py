"""Closed-form lower bounds of a layout's memory (bytes), so that ``search`` calls ``memory.estimate`` only
for layouts that may fit: model states or last-stage activations for every candidate (``memory_bound``),
then model states + block activations x in-flight micro-batches of every pipeline rank
(``stage_memory_bound``); and how many layers a partially recomputing layout must recompute at least.
"""

from __future__ import annotations

import dataclasses
import math

from .. import memory
from ..config import ModelConfig, TrainConfig
from .context import PlanContext, memoised
from .plan import Layout, Plan, memory_schedule


@memoised(8192)
def heaviest_stage_params(model: ModelConfig, tp: int, pp: int, ep: int, dualpipe: bool) -> tuple[float, float]:
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


def _states_bound(ctx: PlanContext, lay: Layout) -> float:
    """Closed-form lower bound of the memory per GPU: model states of the heaviest stage + overhead."""
    return (
        ctx.memo(
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


@memoised(1 << 14)
def _states_bytes(model, precision, tp, pp, ep, dual, zg, zero) -> float:
    """Model-state bytes per GPU of the heaviest stage, ZeRO stage ``zero`` over ``zg`` ranks (experts over
    ``zg / ep``), bf16-mixed Adam as ``memory.bytes_per_param`` counts it."""
    d, e = heaviest_stage_params(model, tp, pp, ep, dual)
    return _zero_state_bytes(memory.bytes_per_param(precision, "adam", False, None), d, e, zg, ep, zero)


def _zero_state_bytes(b: dict, d: float, e: float, zg: int, ep: int, zero: int) -> float:
    """Model-state bytes of ``d`` dense and ``e`` expert parameters at ``b`` bytes per parameter and state
    (``memory.bytes_per_param``), ZeRO stage ``zero`` sharding the dense ones over ``zg`` ranks, the experts
    over ``zg / ep`` (``memory.model_state_bytes``' rule, without its padding)."""
    eg = zg // ep
    tot = 0.0
    for key, zmin in (("param", 3), ("grad", 2), ("optimizer", 1), ("master", 1)):
        tot += b[key] * (d / zg if (zero >= zmin and zg > 1) else d)
        tot += b[key] * (e / eg if (zero >= zmin and eg > 1) else e)
    return tot


@memoised(8192)
def _act_layer(model: ModelConfig, seq_len: int, precision: str, tp: int, cp: int, mb: int, recompute: str) -> float:
    """Smallest saved activations of one layer for one micro-batch (bytes, ``memory.layer_terms``)."""
    t = TrainConfig(micro_batch=mb, seq_len=seq_len, precision=precision, recompute=recompute, tp=tp, sp=tp > 1, cp=cp)
    kinds = {0, model.n_layers - 1}
    return min(sum(b for _, b in memory.layer_terms(model, t, layer=i)) for i in kinds)


@memoised(4096)
def _in_flight_last(schedule: str, pp: int, m: int, v: int) -> float:
    """Micro-batches in flight on the last pipeline stage (``memory.in_flight_microbatches``)."""
    t = TrainConfig(
        pp=pp,
        n_microbatches=m,
        **memory_schedule(schedule, v),
    )
    return memory.in_flight_microbatches(t, pp - 1)


@memoised(1024)
def _min_layers(n_layers: int, pp: int) -> int:
    """Layers of the lightest pipeline stage (``memory.stage_layers``)."""
    return min(memory.stage_layers(n_layers, pp))


@memoised(1024)
def max_stage_layers(n_layers: int, pp: int) -> int:
    """Layers of the heaviest pipeline stage (``memory.stage_layers``)."""
    return max(memory.stage_layers(n_layers, pp))


def layers_short(ctx: PlanContext, lay: Layout, plan: Plan) -> int:
    """Recomputed layers per stage that ``plan`` (which does not fit) needs at least in addition: each one
    frees at most its stage's in-flight micro-batches x (a kept layer - its input) bytes on the heaviest
    stage, so fewer cannot bring that stage under the GPU's memory."""
    args = (ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch)
    (n_d, n_m), (f_d, f_m) = (ctx.memo(_act_kinds, *args, rc) for rc in ("none", "full"))
    freed = plan.memory.in_flight * max(n_d - f_d, n_m - f_m)
    if freed <= 0:
        return 1
    return max(1, math.ceil((plan.memory_bytes - ctx.cap) / freed - 1e-9))


def fewest_recomputed(ctx: PlanContext, lay: Layout, m: int, start: int) -> Layout | None:
    """``lay`` recomputing the fewest layers per stage, from ``start`` on, whose ``stage_memory_bound`` fits in
    the GPU; None once that is every layer of the heaviest stage (the ``recompute_layers=0`` candidate)."""
    for k in range(start, max_stage_layers(ctx.model.n_layers, lay.pp)):
        cand = dataclasses.replace(lay, recompute_layers=k)
        if stage_memory_bound(ctx, cand, m) * (1.0 - 1e-9) <= ctx.cap:
            return cand
    return None


def memory_bound(ctx: PlanContext, lay: Layout, m: int) -> float:
    """Closed-form lower bound of the heaviest stage's memory (bytes): the larger of the model
    states of the heaviest stage and the saved activations of the last stage (fewest layers,
    fewest in-flight micro-batches), each with ``overhead_bytes``."""
    states = _states_bound(ctx, lay)
    fl = _in_flight_last(lay.schedule, lay.pp, m, lay.v)
    n_min = _min_layers(ctx.model.n_layers, lay.pp)
    acts = ctx.memo(_act_layer, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, lay.recompute)
    return max(states, acts * n_min * fl + ctx.overhead_bytes)


@memoised(1 << 14)
def _act_kinds(model: ModelConfig, seq_len: int, precision: str, tp: int, cp: int, mb: int, recompute: str) -> tuple:
    """Saved activations of one dense-MLP layer and of one MoE layer for one micro-batch (bytes,
    ``memory.layer_terms``; the two kinds ``memory.estimate`` distinguishes)."""
    t = TrainConfig(micro_batch=mb, seq_len=seq_len, precision=precision, recompute=recompute, tp=tp, sp=tp > 1, cp=cp)
    last = model.n_layers - 1  # an MoE layer when the model has experts
    dense = sum(
        b for _, b in memory.layer_terms(model, t, layer=0 if model.n_dense_layers or not model.is_moe else last)
    )
    return dense, sum(b for _, b in memory.layer_terms(model, t, layer=last))


@memoised(4096)
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


@memoised(1 << 14)
def _rank_states(model, precision, tp, pp, ep, dual, zg, zero) -> tuple:
    """Model-state bytes of every pipeline rank (``_zero_state_bytes``, stage by stage)."""
    t = TrainConfig(tp=tp, pp=pp, ep=ep, dp=ep, pp_schedule="dualpipe" if dual else "1f1b")
    b = memory.bytes_per_param(precision, "adam", False, None)
    out = []
    for st in range(pp):
        d, e, _, _ = memory.stage_params(model, t, st)
        if dual and pp > 1:
            d2, e2, _, _ = memory.stage_params(model, t, pp - 1 - st)
            d, e = d + d2, e + e2
        out.append(_zero_state_bytes(b, d, e, zg, ep, zero))
    return tuple(out)


@memoised(4096)
def _in_flight_all(schedule: str, pp: int, m: int, v: int) -> tuple:
    """Micro-batches in flight on every pipeline stage (``memory.in_flight_microbatches``)."""
    if pp == 1:
        return (1.0,)
    t = TrainConfig(
        pp=pp,
        n_microbatches=m,
        **memory_schedule(schedule, v),
    )
    return tuple(memory.in_flight_microbatches(t, st) for st in range(pp))


def stage_memory_bound(ctx: PlanContext, lay: Layout, m: int) -> float:
    """A tighter lower bound of ``memory.estimate``'s total (bytes), rank by rank: model states +
    saved activations of the rank's layers (dense and MoE layers counted apart) x its in-flight
    micro-batches + ``overhead_bytes``; only the layers outside the blocks (embedding, head, loss) and
    the transient buffers are left out. Costs O(pp): ``search`` asks it only for the layouts whose
    step time is good enough to be shown, before the exact estimate."""
    dual = lay.schedule == "dualpipe"
    states = ctx.memo(_rank_states, ctx.precision, lay.tp, lay.pp, lay.ep, dual, lay.dp * lay.cp, lay.zero)
    k = lay.recompute_layers if lay.recompute == "full" else 0
    a_dense, a_moe = ctx.memo(
        _act_kinds, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, "none" if k else lay.recompute
    )
    saved = 0.0  # a recomputed layer keeps only its input: at most this much less than a kept one
    if k:
        f_dense, f_moe = ctx.memo(_act_kinds, ctx.seq_len, ctx.precision, lay.tp, lay.cp, lay.micro_batch, "full")
        saved = max(a_dense - f_dense, a_moe - f_moe)
    fl = _in_flight_all(lay.schedule, lay.pp, m, lay.v)
    best = 0.0
    for s, (n_st, nd, nm), f in zip(states, ctx.memo(_rank_layers, lay.pp, dual), fl):
        best = max(best, s + f * (nd * a_dense + nm * a_moe - min(k * n_st, nd + nm) * saved) / n_st)
    return best + ctx.overhead_bytes
