"""Second routes of the topic ``kernels``: FLOPs and bytes written out by hand, a hand roofline, the block
loop of FlashAttention's Algorithm 1 walked in plain Python, the softmax over all keys rebuilt from the
partials' exp-sums, and flash-attn's decode split from every split count's wave efficiency in exact fractions,
without ``mlsys_nb.kernels``."""

from __future__ import annotations

import math
from fractions import Fraction

from .registry import register_route

# (FLOPs per output element or per matmul n³, elements moved per n²): written out from the question text
_PER_ELEMENT = {"add": (1, 3), "softmax": (5, 2), "layernorm": (8, 2)}


def _flops_bytes(name, n, nbytes):
    if name == "matmul":
        return 2 * n**3, 3 * n * n * nbytes
    f, moved = _PER_ELEMENT[name]
    return f * n * n, moved * n * n * nbytes


@register_route("kernels.op_intensity")
def _(p):
    flops, nbytes = _flops_bytes(p["name"], p["n"], p["bytes"])
    return flops / nbytes


@register_route("kernels.op_bound")
def _(p):
    flops, nbytes = _flops_bytes(p["name"], p["n"], 2)
    return "compute" if flops / p["peak"] >= nbytes / p["bw"] else "memory"  # which roof is lower in time


@register_route("kernels.op_roofline_time")
def _(p):
    flops, nbytes = _flops_bytes(p["name"], p["n"], 2)
    return max(flops / p["peak"], nbytes / p["bw"])


@register_route("kernels.fusion_speedup")
def _(p):
    eager = sum(2 for _ in range(p["k"]))  # each op: one read, one write per element
    return eager / 2


@register_route("kernels.flash_block_sizes")
def _(p):
    bc = 1
    while 4 * p["d"] * bc < p["m"]:  # the smallest B with 4·B·d >= M: ceil(M / 4d)
        bc += 1
    return float(bc)


@register_route("kernels.flash_hbm_bytes")
def _(p):
    s, d, m = p["s"], p["d"], p["m"]
    bc = -(-m // (4 * d))
    br = min(bc, d)
    moved = s * d + s  # O and lse initialised
    for ka in range(0, s, bc):  # Algorithm 1's outer loop over K/V blocks
        moved += 2 * (min(ka + bc, s) - ka) * d
        for qa in range(0, s, br):
            rows = min(qa + br, s) - qa
            moved += rows * d * 2 + rows  # Q_i, O_i, lse_i read
            moved += rows * d + rows  # O_i, lse_i written
    return float(moved * p["bytes"])


@register_route("kernels.score_matrix_memory")
def _(p):
    return float(p["b"] * p["h"] * p["s"] ** 2 * 2)


@register_route("kernels.online_softmax_merge")
def _(p):
    za, zb = math.exp(p["la"]), math.exp(p["lb"])  # the exp-sums of the two key sets
    return (za * p["oa"] + zb * p["ob"]) / (za + zb)


@register_route("kernels.decode_splits")
def _(p):
    """flash-attn's rule from the question text, in exact fractions: every split count's wave efficiency."""
    work, sms = p["b"] * p["h"], p["sms"]
    if 5 * work >= 4 * sms:  # batch·heads >= 0.8·SMs
        return 1.0
    eff = {}
    for s in range(1, min(128, sms) + 1):
        waves = Fraction(work * s, sms)
        eff[s] = waves / math.ceil(waves)
    best = max(eff.values())
    return float(min(s for s, e in eff.items() if e >= Fraction(85, 100) * best))
