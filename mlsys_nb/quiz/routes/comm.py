"""Second routes of the topic ``comm``: the α-β times and byte counts written out (Thakur et al. 2005;
Patarasuk & Yuan 2009)."""

from __future__ import annotations

import math

from .registry import register_route


def _ab(op, algorithm, n, S, a, b):
    lg = math.ceil(math.log2(n))
    pw = 2 ** int(math.log2(n))
    table = {
        ("all_reduce", "ring"): (2 * (n - 1), 2 * (n - 1) / n),
        ("all_reduce", "tree"): (2 * lg, 2),
        ("all_reduce", "binomial_tree"): (2 * lg, 2 * lg),
        ("all_reduce", "rabenseifner"): (2 * lg, 2 * (n - 1) / n),
        ("all_reduce", "recursive_doubling"): (int(math.log2(pw)) + 2 * (pw != n),) * 2,
        ("all_gather", "ring"): (n - 1, (n - 1) / n),
        ("reduce_scatter", "ring"): (n - 1, (n - 1) / n),
        ("all_to_all", "pairwise"): (n - 1, (n - 1) / n),
        ("broadcast", "binomial_tree"): (lg, lg),
        ("broadcast", "pipelined_chain"): (n - 1, 1),
    }
    ka, kb = table[(op, algorithm)]
    return ka * a + kb * S / b


@register_route(
    "comm.allreduce_time",
    "comm.allreduce_tree_time",
    "comm.allreduce_binomial_time",
    "comm.allreduce_rabenseifner_time",
    "comm.allreduce_recursive_doubling_time",
    "comm.allgather_time",
    "comm.reduce_scatter_time",
    "comm.all_to_all_time",
    "comm.broadcast_tree_time",
    "comm.broadcast_chain_time",
)
def _comm_time(p):
    return _ab(p["op"], p["algorithm"], p["n"], p["bytes"], p["alpha"], p["beta"])


@register_route("comm.ring_allreduce_bytes_sent")
def _(p):
    return 2 * (p["n"] - 1) / p["n"] * p["bytes"]


@register_route("comm.allgather_bytes_sent")
def _(p):
    return (p["n"] - 1) / p["n"] * p["bytes"]


@register_route("comm.ring_tree_crossover")
def _(p):
    n = p["n"]
    return n * (n - 1 - math.ceil(math.log2(n))) * p["alpha"] * p["beta"]


@register_route("comm.busbw")
def _(p):
    n = p["n"]
    factor = 2 * (n - 1) / n if p["op"] == "all_reduce" else (n - 1) / n
    return p["bytes"] / p["seconds"] * factor


@register_route("comm.faster_allreduce")
def _(p):
    n, s, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
    ring = 2 * (n - 1) * a + 2 * (n - 1) / n * s / b
    tree = 2 * math.ceil(math.log2(n)) * a + 2 * s / b  # pipelined (double binary) tree
    return "ring" if ring < tree else "tree"
