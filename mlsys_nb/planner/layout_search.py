"""``search``: every layout that passes the rules, pruned by closed-form memory bounds, timed, then estimated
in order of step time until ``top`` of them fit; ``rank_of`` finds a layout among the rows.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
from .. import memory
from ..config import check_choice, check_int
from . import bounds
from .context import DEFAULTS, PlanContext, layout_train_config, memoised, plan_context
from .model import layout_plan, rule_broken, step_time
from .plan import COLUMNS, SCHEDULES, Layout


def _degrees(name, value, default):
    """None -> the default candidates; an int -> just it; an iterable -> those values."""
    if value is None:
        return list(default)
    vals = [value] if isinstance(value, int) and not isinstance(value, bool) else list(value)
    for v in vals:
        check_int(name, v)
    return sorted(set(vals))


def _divisors(n: int) -> list[int]:
    """Every divisor of ``n``, ascending."""
    return [d for d in range(1, n + 1) if n % d == 0]


@memoised(1024)
def _max_chunks(n_layers: int, pp: int) -> int:
    """``memory.max_chunks`` without a published split, memoised (asked per candidate)."""
    return memory.max_chunks(n_layers, pp)


def layout_candidates(
    ctx: PlanContext, tp, pp, cp, ep, zero, recompute, micro_batch, schedules, v
) -> tuple[list, dict]:
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
                rule_broken(ctx, base)
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
                partial = "full" in recompute and bounds.max_stage_layers(m.n_layers, p_) > 1
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
    unknown = set(assumptions) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"unknown keyword(s) {sorted(unknown)}; allowed assumptions: {sorted(DEFAULTS)}")
    ctx = plan_context(
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
    cands, rejected = layout_candidates(ctx, tp, pp, cp, ep, zero, recompute, micro_batch, schedules, v)
    if not cands:
        reasons = "; ".join(f"{k} ({n}x)" for k, n in sorted(rejected.items(), key=lambda kv: -kv[1])[:5])
        raise ValueError(f"no layout of {ctx.model.name or 'the model'} on gpus={gpus} passes the rules: {reasons}")
    timed, pruned = _time_candidates(ctx, cands)
    plans, estimates, best_short = _estimate_in_order(ctx, timed, pruned, top)
    if not plans:
        _raise_nothing_fits(ctx, pruned, best_short)
    counts = dict(candidates=len(cands), pruned=len(pruned), timed=len(timed), memory_estimates=estimates)
    return _frame(ctx, plans, counts)


def _time_candidates(ctx: PlanContext, cands: list) -> tuple[list, list]:
    """1) Closed forms for every candidate: a memory lower bound (``bounds.memory_bound``) prunes, then the step
    time (one per distinct timing key: the ZeRO stage matters only as ZeRO-3). Returns ``timed`` [(step seconds,
    layout, ``step_time``)] and ``pruned`` [(bound, layout)]."""
    timed, pruned, cache = [], [], {}
    for lay in cands:
        m = ctx.sequences // (lay.dp * lay.micro_batch)
        bound = bounds.memory_bound(ctx, lay, m)
        if bound > ctx.cap:
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
            cache[key] = step_time(ctx, lay)
        tm = cache[key]
        if tm is not None:
            timed.append((sum(tm[0].values()), lay, tm))
    return timed, pruned


def _estimate_in_order(ctx: PlanContext, timed: list, pruned: list, top: int | None) -> tuple[list, int, tuple]:
    """2) Memory estimates in order of step time until ``top`` layouts fit. A layout recomputing some layers
    (recompute_layers > 0) enters ``timed`` with one layer, a lower bound of its time; when it does not fit it
    comes back with the fewest layers that may fit, re-timed (slower: it waits its turn in the heap). Layouts
    whose per-rank bound (``bounds.stage_memory_bound``) does not fit are added to ``pruned`` unestimated.
    Returns (the plans that fit, estimates made, the smallest shortfall seen: (bytes short, layout, bytes))."""
    heap = [(step, i, lay, tm) for i, (step, lay, tm) in enumerate(timed)]
    heapq.heapify(heap)
    seq = len(heap)
    plans, estimates, best_short = [], 0, None
    kept_all = set()  # layouts that fit recomputing nothing: recomputing some layers is slower and not needed
    while heap:
        _step, _, lay, tm = heapq.heappop(heap)
        if lay.recompute_layers and dataclasses.replace(lay, recompute="none", recompute_layers=0) in kept_all:
            continue  # (the variant without recomputation is faster, so it came out of the heap first)
        sb = bounds.stage_memory_bound(ctx, lay, tm[1])
        plan = None
        if sb * (1.0 - 1e-9) <= ctx.cap:  # else cannot fit (a lower bound; margin for rounding): no estimate
            plan = layout_plan(ctx, lay, tm)
            estimates += 1
        if plan is not None and plan.fits:
            plans.append(plan)
            if lay.recompute == "none":
                kept_all.add(lay)
            if top is not None and len(plans) >= top:
                break
        elif lay.recompute_layers:  # as many more recomputed layers as the estimate or the bound asks
            more = 0 if plan is None else bounds.layers_short(ctx, lay, plan)
            nxt = bounds.fewest_recomputed(ctx, lay, tm[1], lay.recompute_layers + more)
            if nxt is not None:
                t2 = step_time(ctx, nxt)
                heapq.heappush(heap, (sum(t2[0].values()), seq, nxt, t2))
                seq += 1
        elif plan is None:
            pruned.append((sb, lay))
        elif best_short is None or plan.memory_bytes - ctx.cap < best_short[0]:
            best_short = (plan.memory_bytes - ctx.cap, lay, plan.memory_bytes)
    return plans, estimates, best_short


def _raise_nothing_fits(ctx: PlanContext, pruned: list, best_short: tuple | None):
    """Raise ValueError naming the layout with the smallest memory shortfall: branch and bound over the pruned
    layouts (their bound is a lower bound of their need), from ``best_short`` (the estimated ones')."""
    cap = ctx.cap
    for bound, lay in sorted(pruned, key=lambda x: x[0]):
        if best_short is not None and bound - cap >= best_short[0]:
            break
        m = ctx.sequences // (lay.dp * lay.micro_batch)
        try:
            need = memory.estimate(ctx.model, layout_train_config(ctx, lay, m)).total
        except ValueError:
            continue
        if best_short is None or need - cap < best_short[0]:
            best_short = (need - cap, lay, need)
    if best_short is None:
        raise ValueError("no candidate layout is accepted by its pipeline schedule (try schedules='1f1b')")
    short, lay, mem = best_short
    raise ValueError(
        f"no layout fits in {ctx.gpu} memory ({cap / 1e9:.0f} GB): the closest, {lay}, needs {mem / 1e9:.1f} GB, "
        f"{short / 1e9:.1f} GB too much (incl. overhead_bytes={ctx.overhead_bytes / 1e9:.1f} GB). "
        "Add GPUs, recomputation, ZeRO, or a smaller micro-batch/sequence."
    )


def _frame(ctx: PlanContext, plans: list, counts: dict):
    """The search's DataFrame: one row per plan (``COLUMNS``), the assumptions and ``counts`` in ``.attrs``."""
    import pandas as pd

    fields = Layout.__dataclass_fields__
    rows = [{k: getattr(p.layout, k) if k in fields else getattr(p, k) for k in COLUMNS} for p in plans]
    df = pd.DataFrame(rows, columns=COLUMNS)
    df.attrs.update(
        dict(
            **counts,
            assumptions={k: getattr(ctx, k) for k in DEFAULTS},
            gpu_memory_bytes=ctx.cap,
            gpus=ctx.gpus,
            gpu=ctx.gpu,
            global_batch_tokens=ctx.global_batch_tokens,
            seq_len=ctx.seq_len,
        )
    )
    return df


def rank_of(df, **layout) -> int | None:
    """Position (0 = best) of the first row matching the given column values, or None."""
    mask = None
    for k, val in layout.items():
        check_choice("column", k, list(df.columns))
        mk = df[k] == val
        mask = mk if mask is None else (mask & mk)
    idx = df.index[mask] if mask is not None else df.index
    return int(idx[0]) if len(idx) else None
