"""Families of the topic ``expert_context``: expert parallelism (all-to-all bytes and time, EP vs TP
for the experts, MoE parameter counts) and context parallelism (ring attention bytes, causal imbalance).

Answer keys: ``mlsys_nb.parallel.expert`` / ``context`` closed forms (pinned by their own tests against
counted bytes), ``comm.collective_time``, ``memory.param_count``.
"""

from __future__ import annotations

from ... import comm, memory
from ..core import family
from ._util import context_parallel, expert_parallel, gb, gbps, numeric_family, pick, picks, us
from .comm import REF_COMM, draw_link

REF_EP = "docs/references.md#gshard (Lepikhin et al. 2020, arXiv:2006.16668), #switch"
REF_CP = "docs/references.md#ring-attention (Liu et al. 2023, arXiv:2310.01889)"
SEC_EC = "notebooks/09_experts_and_context.ipynb"
SEC_RING = SEC_EC + ", §6 Ring attention and zig-zag chunks on real ranks"
SEC_EP_OR_TP = SEC_EC + ", §4 EP or TP for the experts? Bytes and memory per rank"
REF_MOE = "docs/references.md#mixtral (Jiang et al. 2024, arXiv:2401.04088), #switch"
SEC_EP = SEC_EC + ", §3 Expert parallelism: two all-to-alls on real ranks"


numeric_family(
    family("expert_context.ep_bytes_per_layer", difficulty=2, section=SEC_EP, reference=REF_EP),
    draw=lambda rng: picks(
        rng, tokens=[2048, 4096, 8192, 16384], hidden=[2048, 4096, 7168], top_k=[1, 2, 8], ep=[4, 8, 16, 64]
    ),
    calc=lambda p: expert_parallel.ep_bytes_per_layer(p["tokens"], p["hidden"], p["top_k"], p["ep"])["step"],
    unit="bytes",
    fields=lambda p, result: {"one": result / 4},
    text=(
        "Expert parallelism over ep = {ep} ranks, T = {tokens} tokens per rank, hidden {hidden}, top-{top_k} "
        "routing (uniform, no drops), bf16: bytes one rank sends per MoE layer per step (forward + backward)?"
    ),
    hints=[
        "Dispatch and combine are all-to-alls of k·T·h elements; (ep−1)/ep leaves the rank.",
        "Forward: dispatch + combine; backward: both again.",
    ],
    solution=[
        "One all-to-all: k·T·h·(ep−1)/ep·2 B = {one:.4g} B.",
        ("4 per step (dispatch, combine, and their backward) = {result:.4g} B (parallel.expert.ep_bytes_per_layer)."),
    ],
    diagnostics=[
        (0.5, "count the backward too: its all-to-alls mirror the forward"),
        (0.25, "4 all-to-alls per step: dispatch + combine, forward + backward"),
    ],
)


def _moe_case(rng) -> dict:
    tokens, h = pick(rng, [4096, 8192]), pick(rng, [4096, 7168])
    return {"tokens": tokens, "hidden": h, "top_k": pick(rng, [1, 2, 4, 8]), "n": pick(rng, [4, 8, 16])}


numeric_family(
    family("expert_context.ep_vs_tp_moe", difficulty=3, section=SEC_EP_OR_TP, reference=REF_EP),
    draw=_moe_case,
    calc=lambda p: (
        expert_parallel.ep_bytes_per_layer(p["tokens"], p["hidden"], p["top_k"], p["n"])["step"]
        / expert_parallel.tp_moe_bytes_per_layer(p["tokens"], p["hidden"], p["n"])["step"]
    ),
    unit="ratio",
    text=(
        "An MoE layer on {n} ranks, top-{top_k}: EP (all-to-all) vs splitting every expert over {n} ranks "
        "(TP, one all-reduce forward and backward). Ratio of bytes per rank, EP / TP?"
    ),
    hints=["EP: 4·k·T·h·(n−1)/n per step.", "TP: 2 all-reduces of T·h: 4·T·h·(n−1)/n.", "The ratio is k."],
    solution=["EP step bytes = 4·k·T·h·(n−1)/n·2 B; TP step bytes = 2·2(n−1)/n·T·h·2 B.", "Ratio = k = {result:.3g}."],
)


def _ring_case(rng) -> dict:
    b, cp, s = pick(rng, [1, 2]), pick(rng, [2, 4, 8, 16]), pick(rng, [32768, 65536, 131072])
    nkv, d = pick(rng, [8, 16]), 128
    direction = pick(rng, ["forward", "backward"])
    return {"b": b, "seq_len": s, "cp": cp, "n_kv_heads": nkv, "head_dim": d, "pass": direction}


def _ring_bytes(p) -> dict:
    """``parallel.context.ring_bytes_per_layer`` of the case ``p``."""
    return context_parallel.ring_bytes_per_layer(p["b"], p["seq_len"], p["cp"], p["n_kv_heads"], p["head_dim"])


numeric_family(
    family("expert_context.cp_ring_bytes", difficulty=2, section=SEC_RING, reference=REF_CP),
    draw=_ring_case,
    calc=lambda p: _ring_bytes(p)[p["pass"]],
    unit="bytes",
    fields=lambda p, result: {"block": _ring_bytes(p)["kv_block"]},
    text=(
        "Ring attention, cp = {cp}, batch {b} × {seq_len} tokens, {n_kv_heads} KV heads × {head_dim}, bf16: "
        "bytes one rank sends per attention layer in the {pass} pass?"
    ),
    hints=[
        "A K|V block is 2·b·(s/cp)·n_kv·d elements.",
        "Forward passes cp−1 blocks; backward passes cp−1 K|V blocks plus cp dK|dV accumulators.",
    ],
    solution=["Block = {block:.4g} B.", "{pass}: {result:.4g} B (parallel.context.ring_bytes_per_layer)."],
    diagnostics=[(0.5, "K and V both travel: 2 tensors per block")],
)

numeric_family(
    family("expert_context.cp_causal_imbalance", difficulty=2, section=SEC_RING, reference=REF_CP),
    draw=lambda rng: (lambda cp: {"cp": cp, "seq_len": 64 * cp * 2})(pick(rng, [2, 4, 8, 16])),
    calc=lambda p: context_parallel.causal_work(p["seq_len"], p["cp"], "contiguous"),
    key=lambda work: max(work) / min(work),
    unit="ratio",
    fields=lambda p, result: {"last": result[-1], "ratio": max(result) / min(result)},
    text=(
        "Causal attention split contiguously over cp = {cp} ranks (fully masked blocks skipped): the busiest "
        "rank does how many times the work of the least busy?"
    ),
    hints=["Rank r's queries see r+1 chunks of keys.", "Busiest / least = cp."],
    solution=[
        "Work per rank ∝ r+1: {result[0]} ... {last} (parallel.context.causal_work).",
        "Ratio = {ratio:g}; the zig-zag layout makes it 1.",
    ],
)


def _a2a_case(rng) -> dict:
    tokens, h, k = pick(rng, [4096, 8192]), pick(rng, [4096, 7168]), pick(rng, [2, 8])
    ep = pick(rng, [8, 16, 64])
    alpha, beta = draw_link(rng)
    return {"tokens": tokens, "hidden": h, "top_k": k, "ep": ep, "alpha": alpha, "beta": beta}


def _dispatch_bytes(p) -> int:
    """S = k·T·h·2 bytes: one rank's send buffer of a bf16 dispatch."""
    return p["top_k"] * p["tokens"] * p["hidden"] * 2


numeric_family(
    family("expert_context.ep_all_to_all_time", difficulty=2, section=SEC_EP, reference=REF_EP + ", " + REF_COMM),
    draw=_a2a_case,
    calc=lambda p: comm.collective_time("all_to_all", _dispatch_bytes(p), p["ep"], p["alpha"], p["beta"], "pairwise"),
    unit="seconds",
    fields=lambda p, result: {
        "alpha_us": us(p["alpha"]),
        "beta_gbps": gbps(p["beta"]),
        "send_bytes": _dispatch_bytes(p),
        "result_ms": result * 1e3,
    },
    text=(
        "One MoE dispatch all-to-all: each of ep = {ep} ranks sends its T = {tokens} tokens × top-{top_k} "
        "copies × hidden {hidden} in bf16 (S = k·T·h·2 B per rank), pairwise, α = {alpha_us}, β = "
        "{beta_gbps}. Seconds?"
    ),
    hints=["Pairwise all-to-all: (n−1) messages, (n−1)/n·S bytes.", "T = (n−1)α + (n−1)/n·S/β."],
    solution=["S = {send_bytes:.4g} B; T = {result_ms:.4g} ms (comm.collective_time all_to_all, pairwise)."],
)


MOE_ASKS = ("total parameters", "active parameters per token", "bf16 weight bytes to serve it")


@family("expert_context.moe_params", difficulty=2, section=SEC_EP_OR_TP, reference=REF_MOE)
def _moe(rng):
    base = memory.preset("mixtral-8x7b")
    e = pick(rng, [8, 16, 32])
    k = pick(rng, [1, 2, 4])
    cfg = base.replace(n_experts=e, top_k=k, name=f"mixtral-like-{e}x{k}")
    ask = pick(rng, MOE_ASKS)
    pc = memory.param_count(cfg)
    ans = {MOE_ASKS[0]: pc.total, MOE_ASKS[1]: pc.active, MOE_ASKS[2]: 2 * pc.total}[ask]
    return dict(
        text=f"A Mixtral-like MoE: {cfg.n_layers} layers, hidden {cfg.hidden}, attention with {cfg.n_heads} query "
        f"and {cfg.n_kv_heads} KV heads of dim {cfg.head_dim}, every layer's MLP replaced by {e} SwiGLU experts "
        f"of width {cfg.expert_ffn_hidden} with a linear router picking the top {k} per token, RMSNorms, "
        f"vocabulary {cfg.vocab_size} (untied embedding and head). Its {ask}?",
        params={"n_experts": e, "top_k": k, "ask": ask},
        answer=ans,
        unit="bytes" if ask == MOE_ASKS[2] else "params",
        hints=[
            "One expert: 3 × hidden × width (gate, up, down). The router: hidden × n_experts per layer.",
            "Active: attention, router, norms, embedding, head and only the top-k experts. Serving holds ALL.",
        ],
        solution=[
            f"Total {pc.total:,} parameters; active per token {pc.active:,} (memory.param_count).",
            f"Serving keeps every expert resident: {gb(2 * pc.total)} in bf16, while each token costs "
            f"2 × {pc.active:.4g} FLOPs.",
        ],
        diagnostics=[(pc.active / pc.total, "that is the active count: memory holds every expert")]
        if ask != MOE_ASKS[1]
        else [(pc.total / pc.active, "that is the total: a token only runs through its top-k experts")],
    )
