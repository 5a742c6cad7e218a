"""Families of the topic ``comm``: collectives and the α-β model (times, bytes per rank, busbw, the
ring/tree crossover).

Every answer key calls ``mlsys_nb.comm`` (``collective_time``, ``cost_coefficients``,
``bytes_sent_per_rank``, ``busbw``, ``crossover_bytes``), pinned by its own tests against counted bytes.
"""

from __future__ import annotations

from ... import comm
from ..core import family
from ._util import MB, gbps, numeric_family, pick, us

REF_COMM = "docs/references.md#thakur2005 (Thakur, Rabenseifner & Gropp 2005), #patarasuk2009, #nccl-tests"
SEC_COST = "notebooks/04_communication_cost.ipynb, §1 The α-β model"
SEC_BYTES = "notebooks/03_collectives.ipynb, §4 Count the bytes, compare with the closed forms"
SEC_SEMANTICS = "notebooks/03_collectives.ipynb, §1 Semantics: who holds what, before and after"
SEC_BUSBW = "notebooks/04_communication_cost.ipynb, §2 algbw and busbw, as nccl-tests defines them"
REF_NCCL_TESTS = "docs/references.md#nccl-tests"


def draw_link(rng):
    """(α, β) of a link: latency in seconds, bandwidth in bytes/s per direction."""
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
    @family(name, difficulty=1 if (op, algo) == ("all_reduce", "ring") else 2, section=SEC_COST, reference=REF_COMM)
    def f(rng):
        n = pick(rng, [2, 4, 8, 16, 32, 64] if algo != "recursive_doubling" else [3, 4, 6, 8, 12, 16])
        nbytes = pick(rng, [1, 4, 16, 64, 256, 1024]) * MB
        alpha, beta = draw_link(rng)
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


def _bytes_case(ns, mbs):
    """A draw of ``{"bytes": S, "n": ranks}`` with S in MB from ``mbs``."""
    return lambda rng: {"n": pick(rng, ns), "bytes": pick(rng, mbs) * MB}


numeric_family(
    family("comm.ring_allreduce_bytes_sent", section=SEC_BYTES, reference=REF_COMM),
    draw=_bytes_case([2, 3, 4, 8, 16, 64, 256], [100, 400, 1000, 4000]),
    calc=lambda p: comm.bytes_sent_per_rank("all_reduce", p["bytes"], p["n"], "ring"),
    params=("bytes", "n"),
    unit="bytes",
    fields=lambda p, result: {"mb": p["bytes"] / MB, "phase": (p["n"] - 1) / p["n"] * p["bytes"]},
    text="A ring all-reduce of a {mb:g} MB gradient buffer over {n} ranks: how many bytes does each rank send?",
    hints=["Reduce-scatter then all-gather.", "Each phase sends n−1 chunks of S/n."],
    solution=[
        "Reduce-scatter: (n−1)·S/n = {phase:.4g} B.",
        "All-gather: the same again. Total 2(n−1)/n·S = {result:.4g} B (comm.bytes_sent_per_rank).",
    ],
    diagnostics=lambda p, b: [
        (p["bytes"] / b, "you sent S once: the ring does a reduce-scatter AND an all-gather"),
        (2 * p["bytes"] / b, "2S is the large-n limit; at this n it is 2(n−1)/n·S"),
    ],
)


numeric_family(
    family("comm.allgather_bytes_sent", section=SEC_SEMANTICS, reference=REF_COMM),
    draw=_bytes_case([2, 4, 8, 16, 32], [64, 256, 1024]),
    calc=lambda p: comm.bytes_sent_per_rank("all_gather", p["bytes"], p["n"], "ring"),
    params=("bytes", "n"),
    unit="bytes",
    fields=lambda p, result: {"mb": p["bytes"] / MB, "n1": p["n"] - 1},
    text="A ring all-gather produces a {mb:g} MB output on each of {n} ranks. Bytes sent per rank?",
    hints=["Each rank starts with S/n and needs the other n−1 chunks.", "(n−1)/n·S."],
    solution=["(n−1)/n × S = {n1}/{n} × {bytes:.4g} B = {result:.4g} B."],
    diagnostics=lambda p, b: [
        (2.0 * (p["n"] - 1) / p["n"] * p["bytes"] / b, "that is an all-reduce; all-gather is one phase")
    ],
)


numeric_family(
    family("comm.busbw", section=SEC_BUSBW, reference=REF_NCCL_TESTS),
    draw=lambda rng: {
        "op": pick(rng, ["all_reduce", "all_gather", "reduce_scatter"]),
        "n": pick(rng, [2, 4, 8, 16]),
        "bytes": pick(rng, [256, 512, 1024]) * MB,
        "seconds": pick(rng, [2, 5, 8, 10, 20]) * 1e-3,
    },
    calc=lambda p: comm.busbw(p["op"], p["bytes"], p["seconds"], p["n"]),
    params=("op", "bytes", "n", "seconds"),
    unit="bytes/s",
    fields=lambda p, result: {
        "mb": p["bytes"] / MB,
        "ms": p["seconds"] * 1e3,
        "algbw": p["bytes"] / p["seconds"],
        "factor": comm.busbw_factor(p["op"], p["n"]),
    },
    text=(
        "nccl-tests reports a {op} of {mb:g} MB on {n} ranks in {ms:g} ms. What bus bandwidth (busbw) does it print?"
    ),
    hints=["algbw = S / t.", "busbw = algbw × factor: 2(n−1)/n for all_reduce, (n−1)/n for gathers."],
    solution=[
        "algbw = {bytes:.4g} / {seconds:g} = {algbw:.4g} B/s.",
        "factor({op}, {n}) = {factor:.4g}; busbw = {result:.4g} B/s (comm.busbw).",
    ],
    diagnostics=lambda p, bb: [(p["bytes"] / p["seconds"] / bb, "that is algbw; busbw multiplies by the op's factor")],
)


def _link_case(rng) -> dict:
    n = pick(rng, [8, 16, 32, 64, 128])
    alpha, beta = draw_link(rng)
    return {"n": n, "alpha": alpha, "beta": beta}


numeric_family(
    family("comm.ring_tree_crossover", difficulty=3, section=SEC_COST, reference=REF_COMM),
    draw=_link_case,
    calc=lambda p: comm.crossover_bytes(p["n"], p["alpha"], p["beta"]),
    unit="bytes",
    fields=lambda p, result: {"alpha_us": us(p["alpha"]), "beta_gbps": gbps(p["beta"])},
    text=(
        "Ring vs pipelined-tree all-reduce on n = {n} ranks, α = {alpha_us}, β = {beta_gbps}: at what message "
        "size do they take equal time (bytes)?"
    ),
    hints=["Equate 2(n−1)α + 2(n−1)/n·S/β and 2⌈log2 n⌉α + 2S/β.", "S* = n(n−1−⌈log2 n⌉)·α·β."],
    solution=[
        "Set the two α-β times equal and solve for S.",
        "S* = {result:.4g} B (comm.crossover_bytes): the tree wins below, the ring above.",
    ],
)


@family("comm.faster_allreduce", kind="choice", section=SEC_COST, reference=REF_COMM)
def _faster(rng):
    n = pick(rng, [8, 16, 64, 256])
    alpha, beta = draw_link(rng)
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
