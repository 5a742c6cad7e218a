"""Families on communication: collectives and the α-β model, DDP/ZeRO traffic, TP/SP, EP/CP.

Every answer key calls ``mlsys_nb.comm`` (``collective_time``, ``bytes_sent_per_rank``, ``busbw``,
``crossover_bytes``) or ``mlsys_nb.parallel.expert`` / ``context`` closed forms (pinned by their own
tests against counted bytes).
"""

from __future__ import annotations

from ... import comm
from ..core import family
from ._util import MB, gbps, pick, us

REF_COMM = "docs/references.md#thakur2005 (Thakur, Rabenseifner & Gropp 2005), #patarasuk2009, #nccl-tests"
SEC_COST = "notebooks/04_communication_cost.ipynb, §1 The α-β model"


def _link(rng):
    alpha = pick(rng, [2e-6, 5e-6, 10e-6, 20e-6])
    beta = pick(rng, [25e9, 50e9, 100e9, 200e9, 450e9])
    return alpha, beta


# (family, op, algorithm, op words)
_TIME_FAMILIES = [
    ("comm.allreduce_time", "all_reduce", "ring", "a ring all-reduce"),
    ("comm.allreduce_tree_time", "all_reduce", "tree", "a pipelined (NCCL-style) tree all-reduce"),
    (
        "comm.allreduce_binomial_time",
        "all_reduce",
        "binomial_tree",
        "an unpipelined binomial-tree all-reduce (reduce + broadcast)",
    ),
    (
        "comm.allreduce_rabenseifner_time",
        "all_reduce",
        "rabenseifner",
        "a Rabenseifner (recursive halving + doubling) all-reduce",
    ),
    ("comm.allreduce_recursive_doubling_time", "all_reduce", "recursive_doubling", "a recursive-doubling all-reduce"),
    ("comm.allgather_time", "all_gather", "ring", "a ring all-gather (S = the full gathered output)"),
    ("comm.reduce_scatter_time", "reduce_scatter", "ring", "a ring reduce-scatter (S = the full input)"),
    ("comm.all_to_all_time", "all_to_all", "pairwise", "a pairwise all-to-all (S = one rank's send buffer)"),
    ("comm.broadcast_tree_time", "broadcast", "binomial_tree", "a binomial-tree broadcast"),
    ("comm.broadcast_chain_time", "broadcast", "pipelined_chain", "a pipelined-chain broadcast (many pieces)"),
]

_HINTS = {
    ("all_reduce", "ring"): [
        "T = k_α·α + k_β·S/β: count the messages and the bytes per rank.",
        "Ring all-reduce = reduce-scatter + all-gather: 2(n−1) steps, each S/n bytes.",
    ],
    ("all_reduce", "tree"): ["A pipelined tree sends everything up and down once.", "k_α = 2⌈log2 n⌉, k_β = 2."],
    ("all_reduce", "binomial_tree"): [
        "Unpipelined: the whole buffer travels each of the ⌈log2 n⌉ levels, twice.",
        "k_α = k_β = 2⌈log2 n⌉.",
    ],
    ("all_reduce", "rabenseifner"): [
        "Recursive halving then doubling: latency like a tree, bytes like a ring.",
        "k_α = 2⌈log2 n⌉, k_β = 2(n−1)/n.",
    ],
    ("all_reduce", "recursive_doubling"): [
        "Every step exchanges the full buffer with a partner at distance 2^i.",
        "k_α = k_β = log2 p (+2 if n is not a power of two).",
    ],
    ("all_gather", "ring"): ["n−1 steps, each moving one S/n chunk.", "k_α = n−1, k_β = (n−1)/n."],
    ("reduce_scatter", "ring"): ["n−1 steps, each moving one S/n chunk.", "k_α = n−1, k_β = (n−1)/n."],
    ("all_to_all", "pairwise"): [
        "Each rank sends S/n to each of the n−1 others, one at a time.",
        "k_α = n−1, k_β = (n−1)/n.",
    ],
    ("broadcast", "binomial_tree"): ["The full buffer crosses ⌈log2 n⌉ levels.", "k_α = k_β = ⌈log2 n⌉."],
    ("broadcast", "pipelined_chain"): [
        "Cut into many pieces: the chain streams at link speed once full.",
        "k_α = n−1, k_β = 1.",
    ],
}


def _time_family(name, op, algo, words):
    @family(
        name, "comm", difficulty=1 if (op, algo) == ("all_reduce", "ring") else 2, section=SEC_COST, reference=REF_COMM
    )
    def f(rng):
        n = pick(rng, [2, 4, 8, 16, 32, 64] if algo != "recursive_doubling" else [3, 4, 6, 8, 12, 16])
        nbytes = pick(rng, [1, 4, 16, 64, 256, 1024]) * MB
        alpha, beta = _link(rng)
        t = comm.collective_time(op, nbytes, n, alpha, beta, algo)
        ka, kb = comm.cost_coefficients(op, algo, n)
        return dict(
            text=(
                f"In the α-β model, how long does {words} of S = {nbytes / MB:g} MB take on n = {n} ranks "
                f"with α = {us(alpha)} per message and β = {gbps(beta)} per direction?"
            ),
            params={"bytes": nbytes, "n": n, "alpha": alpha, "beta": beta, "op": op, "algorithm": algo},
            answer=t,
            unit="seconds",
            hints=_HINTS[(op, algo)] + [f"Here k_α = {ka:g}, k_β = {kb:.4g}."],
            solution=[
                f"Coefficients for {op}/{algo} at n = {n}: k_α = {ka:g}, k_β = {kb:.4g}.",
                f"Latency: {ka:g} × {us(alpha)} = {ka * alpha * 1e6:.4g} us.",
                f"Bandwidth: {kb:.4g} × {nbytes:.4g} B / {beta:.4g} B/s = {kb * nbytes / beta * 1e3:.4g} ms.",
                f"T = {t * 1e3:.4g} ms (comm.collective_time).",
            ],
            diagnostics=[
                (comm.collective_time(op, nbytes, n, 0.0, beta, algo) / t, "you left out the latency term k_α·α"),
                (nbytes / beta / t, "you used S/β alone: count the bytes each rank really sends"),
            ],
        )

    return f


for _spec in _TIME_FAMILIES:
    _time_family(*_spec)


@family(
    "comm.ring_allreduce_bytes_sent",
    "comm",
    section="notebooks/03_collectives.ipynb, §4 Count the bytes, compare with the closed forms",
    reference=REF_COMM,
)
def _ring_bytes(rng):
    n = pick(rng, [2, 3, 4, 8, 16, 64, 256])
    nbytes = pick(rng, [100, 400, 1000, 4000]) * MB
    b = comm.bytes_sent_per_rank("all_reduce", nbytes, n, "ring")
    return dict(
        text=f"A ring all-reduce of a {nbytes / MB:g} MB gradient buffer over {n} ranks: how many bytes does "
        f"each rank send?",
        params={"bytes": nbytes, "n": n},
        answer=b,
        unit="bytes",
        hints=["Reduce-scatter then all-gather.", "Each phase sends n−1 chunks of S/n."],
        solution=[
            f"Reduce-scatter: (n−1)·S/n = {(n - 1) / n * nbytes:.4g} B.",
            f"All-gather: the same again. Total 2(n−1)/n·S = {b:.4g} B (comm.bytes_sent_per_rank).",
        ],
        diagnostics=[
            (nbytes / b, "you sent S once: the ring does a reduce-scatter AND an all-gather"),
            (2 * nbytes / b, "2S is the large-n limit; at this n it is 2(n−1)/n·S"),
        ],
    )


@family(
    "comm.allgather_bytes_sent",
    "comm",
    section="notebooks/03_collectives.ipynb, §1 Semantics: who holds what, before and after",
    reference=REF_COMM,
)
def _ag_bytes(rng):
    n = pick(rng, [2, 4, 8, 16, 32])
    nbytes = pick(rng, [64, 256, 1024]) * MB
    b = comm.bytes_sent_per_rank("all_gather", nbytes, n, "ring")
    return dict(
        text=f"A ring all-gather produces a {nbytes / MB:g} MB output on each of {n} ranks. Bytes sent per rank?",
        params={"bytes": nbytes, "n": n},
        answer=b,
        unit="bytes",
        hints=["Each rank starts with S/n and needs the other n−1 chunks.", "(n−1)/n·S."],
        solution=[f"(n−1)/n × S = {(n - 1)}/{n} × {nbytes:.4g} B = {b:.4g} B."],
        diagnostics=[(2.0 * (n - 1) / n * nbytes / b, "that is an all-reduce; all-gather is one phase")],
    )


@family(
    "comm.busbw",
    "comm",
    section="notebooks/04_communication_cost.ipynb, §2 algbw and busbw, as nccl-tests defines them",
    reference="docs/references.md#nccl-tests",
)
def _busbw(rng):
    op = pick(rng, ["all_reduce", "all_gather", "reduce_scatter"])
    n = pick(rng, [2, 4, 8, 16])
    nbytes = pick(rng, [256, 512, 1024]) * MB
    secs = pick(rng, [2, 5, 8, 10, 20]) * 1e-3
    bb = comm.busbw(op, nbytes, secs, n)
    f = comm.busbw_factor(op, n)
    return dict(
        text=f"nccl-tests reports a {op} of {nbytes / MB:g} MB on {n} ranks in {secs * 1e3:g} ms. "
        f"What bus bandwidth (busbw) does it print?",
        params={"op": op, "bytes": nbytes, "n": n, "seconds": secs},
        answer=bb,
        unit="bytes/s",
        hints=["algbw = S / t.", "busbw = algbw × factor: 2(n−1)/n for all_reduce, (n−1)/n for gathers."],
        solution=[
            f"algbw = {nbytes:.4g} / {secs:g} = {nbytes / secs:.4g} B/s.",
            f"factor({op}, {n}) = {f:.4g}; busbw = {bb:.4g} B/s (comm.busbw).",
        ],
        diagnostics=[(nbytes / secs / bb, "that is algbw; busbw multiplies by the op's factor")],
    )


@family("comm.ring_tree_crossover", "comm", difficulty=3, section=SEC_COST, reference=REF_COMM)
def _crossover(rng):
    n = pick(rng, [8, 16, 32, 64, 128])
    alpha, beta = _link(rng)
    s = comm.crossover_bytes(n, alpha, beta)
    return dict(
        text=f"Ring vs pipelined-tree all-reduce on n = {n} ranks, α = {us(alpha)}, β = {gbps(beta)}: "
        f"at what message size do they take equal time (bytes)?",
        params={"n": n, "alpha": alpha, "beta": beta},
        answer=s,
        unit="bytes",
        hints=["Equate 2(n−1)α + 2(n−1)/n·S/β and 2⌈log2 n⌉α + 2S/β.", "S* = n(n−1−⌈log2 n⌉)·α·β."],
        solution=[
            "Set the two α-β times equal and solve for S.",
            f"S* = {s:.4g} B (comm.crossover_bytes): the tree wins below, the ring above.",
        ],
    )


@family("comm.faster_allreduce", "comm", kind="choice", section=SEC_COST, reference=REF_COMM)
def _faster(rng):
    n = pick(rng, [8, 16, 64, 256])
    alpha, beta = _link(rng)
    nbytes = pick(rng, [4e3, 64e3, 1e6, 16e6, 256e6])
    tr = comm.collective_time("all_reduce", nbytes, n, alpha, beta, "ring")
    tt = comm.collective_time("all_reduce", nbytes, n, alpha, beta, "tree")
    ans = "ring" if tr < tt else "tree"
    return dict(
        text=f"All-reduce of {nbytes:.4g} B on {n} ranks (α = {us(alpha)}, β = {gbps(beta)}): which is "
        f"faster in the α-β model, the ring or the pipelined tree?",
        params={"bytes": nbytes, "n": n, "alpha": alpha, "beta": beta},
        answer=ans,
        choices=["ring", "tree"],
        hints=[
            "Small messages are latency-bound: count messages.",
            "Compare 2(n−1)α with 2⌈log2 n⌉α, then the bandwidth terms.",
        ],
        solution=[f"ring: {tr * 1e6:.4g} us; tree: {tt * 1e6:.4g} us (comm.collective_time).", f"The {ans} is faster."],
    )


# ---- DDP / ZeRO traffic -------------------------------------------------------------------------
REF_ZERO = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §7), #pytorch-ddp"
SEC_ZERO = "notebooks/06_zero_and_fsdp.ipynb, §5 ZeRO-3 (FSDP): shard the parameters too"


def zero_bytes_per_step(n_params: float, n: int, zero: int, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per step (ring algorithms) from ``comm.bytes_sent_per_rank``: DDP and
    ZeRO-1/2 = one all-reduce (or reduce-scatter + all-gather) of the gradients; ZeRO-3 adds a second
    all-gather of the parameters (forward and backward)."""
    s = n_params * dtype_bytes
    rs = comm.bytes_sent_per_rank("reduce_scatter", s, n)
    ag = comm.bytes_sent_per_rank("all_gather", s, n)
    if zero == 0:
        return comm.bytes_sent_per_rank("all_reduce", s, n)
    if zero in (1, 2):
        return rs + ag
    return rs + 2 * ag


@family(
    "data_parallel.ddp_bytes_per_step",
    "data_parallel",
    section="notebooks/05_data_parallelism.ipynb, §2 Naive DDP: one all-reduce per parameter",
    reference=REF_ZERO,
)
def _ddp_bytes(rng):
    n_params = pick(rng, [125e6, 350e6, 1.3e9, 7e9])
    n = pick(rng, [2, 4, 8, 16, 64])
    b = zero_bytes_per_step(n_params, n, 0)
    return dict(
        text=f"DDP over {n} ranks, {n_params:.3g} parameters, bf16 gradients, ring all-reduce: bytes each "
        f"rank sends per step?",
        params={"n_params": n_params, "n": n},
        answer=b,
        unit="bytes",
        hints=["Gradient bytes S = 2·N.", "Ring all-reduce sends 2(n−1)/n·S per rank."],
        solution=[
            f"S = 2 × {n_params:.4g} = {2 * n_params:.4g} B.",
            f"2(n−1)/n·S = {b:.4g} B (comm.bytes_sent_per_rank).",
        ],
        diagnostics=[
            (0.5, "did you count only the reduce-scatter half of the all-reduce?"),
            (2.0, "gradients are bf16 (2 B), not fp32"),
        ],
    )


@family("data_parallel.zero_bytes_per_step", "data_parallel", difficulty=2, section=SEC_ZERO, reference=REF_ZERO)
def _zero_bytes(rng):
    n_params = pick(rng, [1.3e9, 7e9, 13e9, 70e9])
    n = pick(rng, [8, 16, 64, 256])
    z = pick(rng, [1, 2, 3])
    b = zero_bytes_per_step(n_params, n, z)
    return dict(
        text=f"ZeRO stage {z} over {n} ranks, {n_params:.3g} bf16 parameters and gradients, ring collectives: "
        f"bytes each rank sends per training step?",
        params={"n_params": n_params, "n": n, "zero": z},
        answer=b,
        unit="bytes",
        hints=[
            "Stages 1-2: reduce-scatter the gradients, all-gather the updated parameters.",
            "Stage 3 gathers the parameters twice (forward and backward): 3 × (n−1)/n × 2N.",
        ],
        solution=[
            f"Each collective sends (n−1)/n × 2N = {comm.bytes_sent_per_rank('all_gather', 2 * n_params, n):.4g} B.",
            f"Stage {z}: {2 if z < 3 else 3} collectives = {b:.4g} B.",
        ],
        diagnostics=[
            (
                zero_bytes_per_step(n_params, n, 3) / b if z < 3 else 2 / 3,
                "ZeRO-1/2 move the same bytes as DDP; only stage 3 adds a parameter all-gather"
                if z < 3
                else "stage 3 adds the backward all-gather: 3 collectives",
            )
        ],
    )


@family("data_parallel.zero3_vs_ddp_traffic", "data_parallel", section=SEC_ZERO, reference=REF_ZERO)
def _z3_ratio(rng):
    n = pick(rng, [4, 8, 16, 64, 512])
    n_params = pick(rng, [1e9, 7e9, 70e9])
    r = zero_bytes_per_step(n_params, n, 3) / zero_bytes_per_step(n_params, n, 0)
    return dict(
        text=f"By what factor does ZeRO-3 multiply the bytes per rank per step compared with DDP "
        f"(n = {n} ranks, ring collectives)?",
        params={"n": n, "n_params": n_params},
        answer=r,
        unit="ratio",
        hints=["DDP: reduce-scatter + all-gather of the gradients.", "ZeRO-3: one more all-gather."],
        solution=["DDP: 2 × (n−1)/n × S; ZeRO-3: 3 × (n−1)/n × S.", f"Ratio = {r:.3g}."],
        diagnostics=[(2.0, "3× is the common misconception: DDP's all-reduce is already two phases")],
    )


# ---- tensor / sequence parallelism ------------------------------------------------------------
REF_TP = "docs/references.md#megatron (Shoeybi et al. 2019, arXiv:1909.08053), #megatron-sp (Korthikanti et al. 2022)"
SEC_TP = "notebooks/07_tensor_parallelism.ipynb, §7 What TP costs at scale, and why it stays inside a node"


def tp_bytes_per_layer(b: int, s: int, h: int, tp: int, sp: bool, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per transformer layer in the forward: Megatron TP has two all-reduces
    of b·s·h activations (after attention and after the MLP); SP replaces each by a reduce-scatter
    and an all-gather (same bytes, from ``comm.bytes_sent_per_rank``)."""
    x = b * s * h * dtype_bytes
    if sp:
        return 2 * (comm.bytes_sent_per_rank("reduce_scatter", x, tp) + comm.bytes_sent_per_rank("all_gather", x, tp))
    return 2 * comm.bytes_sent_per_rank("all_reduce", x, tp)


def _tp_params(rng):
    return (pick(rng, [1, 2, 4, 8]), pick(rng, [2048, 4096, 8192]), pick(rng, [4096, 5120, 8192]), pick(rng, [2, 4, 8]))


@family("tensor.tp_bytes_per_layer", "tensor", section=SEC_TP, reference=REF_TP)
def _tp_bytes(rng):
    b, s, h, tp = _tp_params(rng)
    v = tp_bytes_per_layer(b, s, h, tp, False)
    return dict(
        text=f"Megatron tensor parallelism, tp = {tp}, micro-batch {b} × {s} tokens, hidden {h}, bf16: bytes "
        f"one rank sends per layer in the FORWARD pass (ring all-reduce)?",
        params={"b": b, "s": s, "h": h, "tp": tp},
        answer=v,
        unit="bytes",
        hints=[
            "Two all-reduces per layer in the forward: after attention and after the MLP.",
            "Each all-reduce of b·s·h·2 B sends 2(tp−1)/tp of it.",
        ],
        solution=[f"Activation X = b·s·h·2 = {b * s * h * 2:.4g} B.", f"2 all-reduces × 2(tp−1)/tp × X = {v:.4g} B."],
        diagnostics=[(0.5, "there are TWO all-reduces per layer (attention and MLP)")],
    )


@family("tensor.sp_bytes_per_layer", "tensor", difficulty=2, section=SEC_TP, reference=REF_TP)
def _sp_bytes(rng):
    b, s, h, tp = _tp_params(rng)
    v = tp_bytes_per_layer(b, s, h, tp, True)
    return dict(
        text=f"Sequence parallelism on top of TP = {tp} (micro-batch {b} × {s} tokens, hidden {h}, bf16): "
        f"bytes one rank sends per layer in the forward pass?",
        params={"b": b, "s": s, "h": h, "tp": tp},
        answer=v,
        unit="bytes",
        hints=[
            "Each all-reduce becomes a reduce-scatter + an all-gather.",
            "A ring all-reduce IS a reduce-scatter + an all-gather: same bytes.",
        ],
        solution=[
            f"2 × (reduce-scatter + all-gather) of {b * s * h * 2:.4g} B = {v:.4g} B,",
            "exactly what TP's two all-reduces send (SP saves activation memory, not traffic).",
        ],
    )


@family("tensor.tp_allreduce_time_per_layer", "tensor", difficulty=2, section=SEC_TP, reference=REF_TP)
def _tp_time(rng):
    b, s, h, tp = _tp_params(rng)
    beta = pick(rng, [300e9, 450e9])
    alpha = 5e-6
    x = b * s * h * 2
    t = 2 * comm.collective_time("all_reduce", x, tp, alpha, beta, "ring")
    return dict(
        text=f"TP = {tp} over NVLink (assumed α = {us(alpha)}, β = {gbps(beta)}), micro-batch {b} × {s} tokens, "
        f"hidden {h}, bf16: time of one layer's forward all-reduces (two ring all-reduces)?",
        params={"b": b, "s": s, "h": h, "tp": tp, "alpha": alpha, "beta": beta},
        answer=t,
        unit="seconds",
        hints=["S = b·s·h·2 bytes per all-reduce.", "T = 2(tp−1)α + 2(tp−1)/tp·S/β, twice."],
        solution=[
            f"S = {x:.4g} B; one all-reduce {t / 2 * 1e3:.4g} ms (comm.collective_time).",
            f"Two per layer: {t * 1e3:.4g} ms.",
        ],
        diagnostics=[(0.5, "two all-reduces per layer in the forward")],
    )


# ---- experts and context ------------------------------------------------------------------------
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
    alpha, beta = _link(rng)
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


@family(
    "data_parallel.grad_allreduce_time",
    "data_parallel",
    section="notebooks/05_data_parallelism.ipynb, §2 Naive DDP: one all-reduce per parameter",
    reference=REF_ZERO + ", " + REF_COMM,
)
def _ddp_time(rng):
    n_params = pick(rng, [125e6, 1.3e9, 7e9, 13e9])
    n = pick(rng, [8, 16, 64, 256])
    alpha, beta = _link(rng)
    t = comm.collective_time("all_reduce", 2 * n_params, n, alpha, beta, "ring")
    return dict(
        text=f"DDP over {n} ranks: one ring all-reduce of the bf16 gradients of {n_params:.3g} parameters, "
        f"α = {us(alpha)}, β = {gbps(beta)}. Seconds (nothing overlapped)?",
        params={"n_params": n_params, "n": n, "alpha": alpha, "beta": beta},
        answer=t,
        unit="seconds",
        hints=["S = 2N bytes.", "T = 2(n−1)α + 2(n−1)/n·S/β."],
        solution=[f"S = {2 * n_params:.4g} B; T = {t:.4g} s (comm.collective_time)."],
        diagnostics=[(0.5, "a ring all-reduce moves 2(n−1)/n·S, not (n−1)/n·S")],
    )


@family(
    "data_parallel.bucketing_speedup",
    "data_parallel",
    difficulty=2,
    section="notebooks/05_data_parallelism.ipynb, §3 Bucketing: fewer, larger messages",
    reference=REF_ZERO,
)
def _buckets(rng):
    tensors = pick(rng, [100, 300, 1000])
    total = pick(rng, [100, 500, 1000]) * MB
    bucket = pick(rng, [25, 50]) * MB
    n = pick(rng, [8, 32, 128])
    alpha, beta = pick(rng, [10e-6, 20e-6, 50e-6]), pick(rng, [12.5e9, 25e9, 50e9])
    naive = tensors * comm.collective_time("all_reduce", total / tensors, n, alpha, beta)
    k = -(-int(total) // int(bucket))
    bucketed = k * comm.collective_time("all_reduce", total / k, n, alpha, beta)
    r = naive / bucketed
    return dict(
        text=f"{total / MB:g} MB of gradients in {tensors} equal tensors, {n} ranks, α = {us(alpha)}, "
        f"β = {gbps(beta)}: how many times faster is all-reducing them in ⌈S/{bucket / MB:g} MB⌉ equal "
        f"buckets than one ring all-reduce per tensor?",
        params={"tensors": tensors, "bytes": total, "bucket": bucket, "n": n, "alpha": alpha, "beta": beta},
        answer=r,
        unit="ratio",
        hints=[
            "The bandwidth term is the same: only the number of messages changes.",
            "Each all-reduce costs 2(n−1)α in latency.",
        ],
        solution=[
            f"per tensor: {tensors} × ... = {naive * 1e3:.4g} ms; {k} buckets: {bucketed * 1e3:.4g} ms "
            "(comm.collective_time).",
            f"Speed-up {r:.4g}×.",
        ],
    )
