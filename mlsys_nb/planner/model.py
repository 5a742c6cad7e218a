"""The step-time model: a layout's seconds per step by component, its ``Plan`` and ``evaluate``.

``step_pieces`` computes the calibration-free pieces (FLOPs of the heaviest stage, traffic, bubble ratio);
``assemble_step`` turns them into seconds per component under a ``Calibration`` (also on numpy arrays of runs,
for ``calibrate``); ``layout_plan`` adds the memory estimate; ``rule_broken`` says why a layout is not allowed.
"""

from __future__ import annotations

from .. import flops as _flops
from .. import memory
from ..config import ModelConfig
from ..pipeline.closed_forms import closed_form
from . import traffic
from .context import PlanContext, layout_train_config, memoised, plan_context
from .plan import SCHEDULES, Layout, Plan


@memoised(64)
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


@memoised(64)
def _attn_core(model: ModelConfig, seq_len: int) -> float:
    """Forward FLOPs per token of one layer's attention core (scores + weighted values, causal)."""
    b = _flops.breakdown(model, seq_len, causal=True).forward
    return (b["attn_scores"] + b["attn_values"]) / model.n_layers


@memoised(4096)
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


@memoised(4096)
def bubble_ratio(schedule: str, p: int, m: int, v: int, r: float) -> float | None:
    """A pipeline's bubble, idle / busy time per stage (a ratio), from the closed forms of ``pipeline``:
    ``schedule`` at ``p`` stages, ``m`` micro-batches, ``v`` chunks per stage, backward = (2 + ``r``) x forward
    (``r``: the share of a forward recomputed). None where the schedule does not apply; memoised."""
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


def _recomputed_share(lay: Layout, n_lay: float) -> float:
    """Share of the heaviest rank's layers (``n_lay`` per stage) fully recomputed: 0 without full
    recomputation, 1 with ``recompute_layers`` 0 (all), else ``recompute_layers / n_lay`` (each stage
    recomputes that many of its layers)."""
    if lay.recompute != "full":
        return 0.0
    if not lay.recompute_layers or not n_lay:
        return 1.0
    return min(1.0, lay.recompute_layers / n_lay)


def step_pieces(ctx: PlanContext, lay: Layout) -> dict | None:
    """The calibration-free pieces of a layout's step (seconds at the datasheet peak and bandwidths,
    per micro-batch unless named otherwise); None if the schedule does not accept (pp, m, v).
    ``assemble_step`` turns them into the time components under a ``Calibration``."""
    model = ctx.model
    m = ctx.sequences // (lay.dp * lay.micro_batch)
    dual = lay.schedule == "dualpipe"
    fwd_tok, lay_tok, scores_tok, n_lay, n_moe = ctx.memo(_stage_compute, ctx.seq_len, lay.pp, dual)
    frac = _recomputed_share(lay, n_lay)  # of the heaviest rank's layers, re-run in backward
    r = {"none": 0.0, "selective": scores_tok / fwd_tok, "full": frac * lay_tok / fwd_tok}[lay.recompute]
    ratio = bubble_ratio(lay.schedule, lay.pp, m, lay.v, r)
    if ratio is None:
        return None
    core_tok = ctx.memo(_attn_core, ctx.seq_len) * n_lay  # scores + values: the FlashAttention kernel's FLOPs
    tokens = lay.micro_batch * ctx.seq_len  # one micro-batch, before CP
    fwd = fwd_tok * tokens / (lay.tp * lay.cp)  # forward FLOPs of one micro-batch on this rank
    f_at = core_tok * tokens / (lay.tp * lay.cp)  # of which in the attention kernel
    rc_at = {"none": 0.0, "selective": scores_tok * tokens / (lay.tp * lay.cp), "full": frac * f_at}[lay.recompute]
    tp_t, cp_t, tp_l, cp_l = ctx.memo_ctx(traffic.tp_cp_traffic, lay.tp, lay.cp, lay.micro_batch, n_lay, frac)
    ep_raw, ep_l = ctx.memo_ctx(traffic.ep_traffic, lay.tp, lay.cp, lay.ep, lay.micro_batch, n_moe)
    p2p, pp_l = ctx.memo_ctx(traffic.pp_traffic, lay.tp, lay.cp, lay.dp, lay.pp, lay.micro_batch)
    pp_t = 2 * (lay.v if lay.schedule == "interleaved-1f1b" else 1) * p2p
    dp_t, dp_l = ctx.memo_ctx(traffic.dp_traffic, lay.tp, lay.cp, lay.ep, lay.dp, lay.pp, dual, lay.zero >= 3, m)
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
    """max on floats, numpy.maximum on arrays (as ``_where``)."""
    if isinstance(a, float) and isinstance(b, float):
        return a if a >= b else b
    import numpy as np

    return np.maximum(a, b)


def _minimum(a, b):
    """min on floats, numpy.minimum on arrays (as ``_where``)."""
    if isinstance(a, float) and isinstance(b, float):
        return a if a <= b else b
    import numpy as np

    return np.minimum(a, b)


def assemble_step(p: dict, eta, attn_eff, overlap, elem_bytes, layer_s, dp_overlap) -> dict:
    """Seconds per step by component from ``step_pieces``: matmuls at ``eta`` x peak (backward = 2 x
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


def step_time(ctx: PlanContext, lay: Layout) -> tuple[dict, int, dict] | None:
    """Modelled seconds per step by component, micro-batches per pipeline, links; None if the
    schedule does not accept (pp, m, v)."""
    p = step_pieces(ctx, lay)
    if p is None:
        return None
    cal = ctx.calibration
    if cal is None:
        eta, ae, ov, eb, ls = ctx.compute_efficiency, 1.0, 0.0, 0.0, 0.0
    else:
        eta = ctx.compute_efficiency * cal.efficiency(ctx.gpu)
        ae, ov, eb, ls = cal.attn_eff, cal.overlap, cal.elem_bytes, cal.layer_s
    t = assemble_step(p, eta, ae, ov, eb, ls, ctx.dp_overlap)  # floats in, floats out
    if cal is None:  # the uncalibrated model has no non-matmul or fixed term: its components as before calibration
        del t["non-matmul"], t["fixed per layer"]
    return t, p["m"], p["links"]


def _bottleneck(t: dict, step: float, mem: float, cap: float) -> str:
    """The plan's bottleneck in words: memory above 90 % of the GPU's, and the largest time component after compute."""
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


def _model_flops(ctx: PlanContext) -> float:
    """Model FLOPs of one step (``flops.flops_per_token``, causal, x the global batch's tokens)."""
    return _flops.flops_per_token(ctx.model, ctx.seq_len, causal=True) * ctx.global_batch_tokens


def layout_plan(ctx: PlanContext, lay: Layout, tm=None, with_memory: bool = True) -> Plan | None:
    """The ``Plan`` of ``lay``: its step time (``tm``: ``step_time``'s result when already known), MFU and HFU,
    and with ``with_memory`` its ``memory.estimate``; None if the schedule does not accept (pp, m, v)."""
    tm = tm or step_time(ctx, lay)
    if tm is None:
        return None
    t, m, links = tm
    step = sum(t.values())
    mfu = _model_flops(ctx) / (ctx.gpus * ctx.peak * step)
    fwd_tok, lay_tok, scores_tok, n_lay, _ = _stage_compute(ctx.model, ctx.seq_len, lay.pp, lay.schedule == "dualpipe")
    frac = _recomputed_share(lay, n_lay)
    r = {"none": 0.0, "selective": scores_tok / fwd_tok, "full": frac * lay_tok / fwd_tok}[lay.recompute]
    br = memory.estimate(ctx.model, layout_train_config(ctx, lay, m)) if with_memory else None
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


def rule_broken(ctx: PlanContext, lay: Layout) -> str | None:
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
        memory.check(m, layout_train_config(ctx, lay, ctx.sequences // (lay.dp * lay.micro_batch)))
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
    ctx = plan_context(model, gpus=gpus, gpu=gpu, global_batch_tokens=global_batch_tokens, seq_len=seq_len, **kw)
    if layout is None:
        if "dp" not in lay_kw:
            lay_kw["dp"] = ctx.gpus // (lay_kw.get("tp", 1) * lay_kw.get("pp", 1) * lay_kw.get("cp", 1)) or 1
        if lay_kw.get("pp", 1) == 1:
            lay_kw.setdefault("schedule", "none")
        layout = Layout(**lay_kw)
    why = rule_broken(ctx, layout)
    if why:
        raise ValueError(f"layout {layout} is not allowed: {why}")
    plan = layout_plan(ctx, layout)
    if plan is None:
        raise ValueError(
            f"schedule={layout.schedule!r} does not accept pp={layout.pp}, "
            f"m={ctx.sequences // (layout.dp * layout.micro_batch)} micro-batches, v={layout.v}"
        )
    return plan
