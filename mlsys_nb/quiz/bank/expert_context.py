"""Families of the topic ``expert_context``: expert parallelism (all-to-all bytes and time, EP vs TP
for the experts, MoE parameter counts) and context parallelism (ring attention bytes, causal imbalance).

Answer keys: ``mlsys_nb.parallel.expert`` / ``context`` closed forms (pinned by their own tests against
counted bytes), ``comm.collective_time``, ``memory.param_count``.
"""

from __future__ import annotations

from ... import comm, memory
from ..core import family
from ._util import gb, gbps, pick, us
from .comm import REF_COMM, link

REF_EP = "docs/references.md#gshard (Lepikhin et al. 2020, arXiv:2006.16668), #switch"
REF_CP = "docs/references.md#ring-attention (Liu et al. 2023, arXiv:2310.01889)"
SEC_EC = "notebooks/09_experts_and_context.ipynb"


@family(
    "expert_context.ep_bytes_per_layer",
    "expert_context",
    difficulty=2,
    section=SEC_EC + ", §3 Expert parallelism: two all-to-alls on real ranks",
    reference=REF_EP,
)
def _ep_bytes(rng):
    from ...parallel.expert import ep_bytes_per_layer

    tokens = pick(rng, [2048, 4096, 8192, 16384])
    h = pick(rng, [2048, 4096, 7168])
    k = pick(rng, [1, 2, 8])
    ep = pick(rng, [4, 8, 16, 64])
    v = ep_bytes_per_layer(tokens, h, k, ep)["step"]
    return dict(
        text=f"Expert parallelism over ep = {ep} ranks, T = {tokens} tokens per rank, hidden {h}, top-{k} "
        f"routing (uniform, no drops), bf16: bytes one rank sends per MoE layer per step "
        f"(forward + backward)?",
        params={"tokens": tokens, "hidden": h, "top_k": k, "ep": ep},
        answer=v,
        unit="bytes",
        hints=[
            "Dispatch and combine are all-to-alls of k·T·h elements; (ep−1)/ep leaves the rank.",
            "Forward: dispatch + combine; backward: both again.",
        ],
        solution=[
            f"One all-to-all: k·T·h·(ep−1)/ep·2 B = {v / 4:.4g} B.",
            f"4 per step (dispatch, combine, and their backward) = {v:.4g} B (parallel.expert.ep_bytes_per_layer).",
        ],
        diagnostics=[
            (0.5, "count the backward too: its all-to-alls mirror the forward"),
            (0.25, "4 all-to-alls per step: dispatch + combine, forward + backward"),
        ],
    )


@family(
    "expert_context.ep_vs_tp_moe",
    "expert_context",
    difficulty=3,
    section=SEC_EC + ", §4 EP or TP for the experts? Bytes and memory per rank",
    reference=REF_EP,
)
def _ep_vs_tp(rng):
    from ...parallel.expert import ep_bytes_per_layer, tp_moe_bytes_per_layer

    tokens, h = pick(rng, [4096, 8192]), pick(rng, [4096, 7168])
    k = pick(rng, [1, 2, 4, 8])
    n = pick(rng, [4, 8, 16])
    r = ep_bytes_per_layer(tokens, h, k, n)["step"] / tp_moe_bytes_per_layer(tokens, h, n)["step"]
    return dict(
        text=f"An MoE layer on {n} ranks, top-{k}: EP (all-to-all) vs splitting every expert over {n} ranks "
        f"(TP, one all-reduce forward and backward). Ratio of bytes per rank, EP / TP?",
        params={"tokens": tokens, "hidden": h, "top_k": k, "n": n},
        answer=r,
        unit="ratio",
        hints=["EP: 4·k·T·h·(n−1)/n per step.", "TP: 2 all-reduces of T·h: 4·T·h·(n−1)/n.", "The ratio is k."],
        solution=["EP step bytes = 4·k·T·h·(n−1)/n·2 B; TP step bytes = 2·2(n−1)/n·T·h·2 B.", f"Ratio = k = {r:.3g}."],
    )


@family(
    "expert_context.cp_ring_bytes",
    "expert_context",
    difficulty=2,
    section=SEC_EC + ", §6 Ring attention and zig-zag chunks on real ranks",
    reference=REF_CP,
)
def _cp_bytes(rng):
    from ...parallel.context import ring_bytes_per_layer

    b = pick(rng, [1, 2])
    cp = pick(rng, [2, 4, 8, 16])
    s = pick(rng, [32768, 65536, 131072])
    nkv, d = pick(rng, [8, 16]), 128
    direction = pick(rng, ["forward", "backward"])
    v = ring_bytes_per_layer(b, s, cp, nkv, d)[direction]
    return dict(
        text=f"Ring attention, cp = {cp}, batch {b} × {s} tokens, {nkv} KV heads × {d}, bf16: bytes one rank "
        f"sends per attention layer in the {direction} pass?",
        params={"b": b, "seq_len": s, "cp": cp, "n_kv_heads": nkv, "head_dim": d, "pass": direction},
        answer=v,
        unit="bytes",
        hints=[
            "A K|V block is 2·b·(s/cp)·n_kv·d elements.",
            "Forward passes cp−1 blocks; backward passes cp−1 K|V blocks plus cp dK|dV accumulators.",
        ],
        solution=[
            f"Block = {ring_bytes_per_layer(b, s, cp, nkv, d)['kv_block']:.4g} B.",
            f"{direction}: {v:.4g} B (parallel.context.ring_bytes_per_layer).",
        ],
        diagnostics=[(0.5, "K and V both travel: 2 tensors per block")],
    )


@family(
    "expert_context.cp_causal_imbalance",
    "expert_context",
    difficulty=2,
    section=SEC_EC + ", §6 Ring attention and zig-zag chunks on real ranks",
    reference=REF_CP,
)
def _cp_imbalance(rng):
    from ...parallel.context import causal_work

    cp = pick(rng, [2, 4, 8, 16])
    s = 64 * cp * 2
    work = causal_work(s, cp, "contiguous")
    r = max(work) / min(work)
    return dict(
        text=f"Causal attention split contiguously over cp = {cp} ranks (fully masked blocks skipped): the "
        f"busiest rank does how many times the work of the least busy?",
        params={"cp": cp, "seq_len": s},
        answer=r,
        unit="ratio",
        hints=["Rank r's queries see r+1 chunks of keys.", "Busiest / least = cp."],
        solution=[
            f"Work per rank ∝ r+1: {work[0]} ... {work[-1]} (parallel.context.causal_work).",
            f"Ratio = {r:g}; the zig-zag layout makes it 1.",
        ],
    )


@family(
    "expert_context.ep_all_to_all_time",
    "expert_context",
    difficulty=2,
    section=SEC_EC + ", §3 Expert parallelism: two all-to-alls on real ranks",
    reference=REF_EP + ", " + REF_COMM,
)
def _ep_time(rng):
    tokens, h, k = pick(rng, [4096, 8192]), pick(rng, [4096, 7168]), pick(rng, [2, 8])
    ep = pick(rng, [8, 16, 64])
    alpha, beta = link(rng)
    s = k * tokens * h * 2
    t = comm.collective_time("all_to_all", s, ep, alpha, beta, "pairwise")
    return dict(
        text=f"One MoE dispatch all-to-all: each of ep = {ep} ranks sends its T = {tokens} tokens × top-{k} "
        f"copies × hidden {h} in bf16 (S = k·T·h·2 B per rank), pairwise, α = {us(alpha)}, "
        f"β = {gbps(beta)}. Seconds?",
        params={"tokens": tokens, "hidden": h, "top_k": k, "ep": ep, "alpha": alpha, "beta": beta},
        answer=t,
        unit="seconds",
        hints=["Pairwise all-to-all: (n−1) messages, (n−1)/n·S bytes.", "T = (n−1)α + (n−1)/n·S/β."],
        solution=[f"S = {s:.4g} B; T = {t * 1e3:.4g} ms (comm.collective_time all_to_all, pairwise)."],
    )


MOE_ASKS = ("total parameters", "active parameters per token", "bf16 weight bytes to serve it")


@family(
    "expert_context.moe_params",
    "expert_context",
    difficulty=2,
    section="notebooks/09_experts_and_context.ipynb, §4 EP or TP for the experts? Bytes and memory per rank",
    reference="docs/references.md#mixtral (Jiang et al. 2024, arXiv:2401.04088), #switch",
)
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
