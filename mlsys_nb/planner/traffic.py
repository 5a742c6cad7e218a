"""Communication per step: α-β costs (``comm.collective_time``) of each parallel dimension's collectives on
the link its group uses (ranks ordered tp, cp, ep, dp/ep, pp: a group that fits in a node uses NVLink).
"""

from __future__ import annotations

from ..comm.cost import collective_time
from . import bounds
from .context import PlanContext, memoised

_ACT_BYTES = 2  # bf16 activations on the wire


def group_link(ctx: PlanContext, stride: int, size: int) -> tuple[str, float, float]:
    """(name, alpha s, beta B/s) of the link a group of ``size`` ranks at ``stride`` uses."""
    if stride * size <= ctx.gpus_per_node:
        return (ctx.nvlink, *ctx.nv_ab)
    return (ctx.network, *ctx.net_ab)


@memoised(1 << 16)
def collective_seconds(op: str, nbytes: float, n: int, alpha: float, beta: float) -> float:
    """Seconds of collective ``op`` on ``nbytes`` over ``n`` ranks (ring; all-to-all pairwise), memoised."""
    if n == 1 or nbytes == 0:
        return 0.0
    return collective_time(op, nbytes, n, alpha, beta, "pairwise" if op == "all_to_all" else "ring")


def tp_cp_traffic(ctx: PlanContext, tp: int, cp: int, mb: int, n_lay: int, frac: float) -> tuple:
    """(TP seconds, CP seconds per micro-batch, TP link, CP link). Rank order tp, cp, ep, dp/ep, pp.
    TP with sequence parallelism: all-gather + reduce-scatter of the activations twice per layer and
    forward pass (fwd, bwd, + re-fwd of the share ``frac`` of layers fully recomputed); CP: all-gather
    of K and V per forward pass, reduce-scatter of their gradients in backward."""
    model = ctx.model
    tp_l = group_link(ctx, 1, tp)
    cp_l = group_link(ctx, tp, cp)
    tokens = mb * ctx.seq_len  # one micro-batch, before CP
    act = tokens / cp * model.hidden * _ACT_BYTES  # one micro-batch's hidden states on this CP rank
    n_rc = 2.0 + frac  # forward passes with TP/CP traffic (fwd, bwd, re-fwd)
    tp_t = (
        n_lay
        * n_rc
        * 2
        * (
            collective_seconds("all_gather", act, tp, *tp_l[1:])
            + collective_seconds("reduce_scatter", act, tp, *tp_l[1:])
        )
    )
    kv_heads = model.n_heads if model.kv_lora_rank else model.n_kv_heads
    kv = 2 * tokens * kv_heads * model.head_dim * _ACT_BYTES / min(tp, kv_heads)
    cp_t = n_lay * (n_rc - 1) * collective_seconds("all_gather", kv, cp, *cp_l[1:]) + n_lay * collective_seconds(
        "reduce_scatter", kv, cp, *cp_l[1:]
    )
    return tp_t, cp_t, tp_l[0], cp_l[0]


def ep_traffic(ctx: PlanContext, tp: int, cp: int, ep: int, mb: int, n_moe: float) -> tuple:
    """(EP seconds per micro-batch: dispatch + combine all-to-all per MoE layer, forward and backward; link)."""
    model = ctx.model
    ep_l = group_link(ctx, tp * cp, ep)
    copies = ctx.ep_copies if ctx.ep_copies is not None else (model.top_k or 1)
    a2a = mb * ctx.seq_len / cp / tp * copies * model.hidden * ctx.ep_bytes  # one rank's send buffer
    return (n_moe * 4 * collective_seconds("all_to_all", a2a, ep, *ep_l[1:]) if ep > 1 else 0.0), ep_l[0]


def pp_traffic(ctx: PlanContext, tp: int, cp: int, dp: int, pp: int, mb: int) -> tuple:
    """(seconds of one activation send between stages per micro-batch, link)."""
    pp_l = group_link(ctx, tp * cp * dp, pp)
    act = mb * ctx.seq_len / cp * ctx.model.hidden * _ACT_BYTES
    return ((pp_l[1] + act / (tp if tp > 1 else 1) / pp_l[2]) if pp > 1 else 0.0), pp_l[0]


def dp_traffic(ctx: PlanContext, tp: int, cp: int, ep: int, dp: int, pp: int, dual: bool, zero3: bool, m: int) -> tuple:
    """(DP seconds per step: gradient all-reduce over dp x cp, experts over dp x cp / ep; ZeRO-3 also
    gathers parameters in forward and backward of every micro-batch; link)."""
    dp_l = group_link(ctx, tp, cp * dp)  # gradients reduced over dp x cp
    d_par, e_par = ctx.memo(bounds.heaviest_stage_params, tp, pp, ep, dual)
    gbytes = _ACT_BYTES  # bf16 gradients on the wire
    zg = dp * cp
    dp_grad = collective_seconds("all_reduce", d_par * gbytes, zg, *dp_l[1:]) + collective_seconds(
        "all_reduce", e_par * gbytes, zg // ep, *dp_l[1:]
    )
    z3 = 0.0
    if zero3:  # gather parameters in forward and backward of every micro-batch
        z3 = (
            2
            * m
            * (
                collective_seconds("all_gather", d_par * 2, zg, *dp_l[1:])
                + collective_seconds("all_gather", e_par * 2, zg // ep, *dp_l[1:])
            )
        )
    return dp_grad + z3, dp_l[0]
