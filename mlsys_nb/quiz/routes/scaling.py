"""Second routes of the topic ``scaling``: the Chinchilla closed form and a brute-force search along
the iso-loss curve."""

from __future__ import annotations

import math

from .registry import register_route


def optimum(law, c):
    a, b = law.alpha, law.beta
    G = (a * law.A / (b * law.B)) ** (1 / (a + b))
    n = G * (c / 6) ** (b / (a + b))
    return n, c / (6 * n)


@register_route("scaling.chinchilla_params", "scaling.chinchilla_tokens", "scaling.tokens_per_param", "scaling.loss")
def _(p):
    from ... import scaling

    L = scaling.law(p["law"])
    if p["_family"] == "scaling.loss":
        return L.E + L.A / p["N"] ** L.alpha + L.B / p["D"] ** L.beta
    n, d = optimum(L, p["C"])
    return {"scaling.chinchilla_params": n, "scaling.chinchilla_tokens": d}.get(p["_family"], d / n)


@register_route("scaling.twenty_rule_params")
def _(p):
    return math.sqrt(p["C"] / 120)


@register_route("scaling.inference_optimal_shrink")
def _(p):
    """Brute force along the Chinchilla iso-loss curve: the N of least 6·N·D + 2·N·D_inference
    (Sardana et al. 2023, arXiv:2401.00448, eq. 2) on a fine grid, then refined by a golden search."""
    from ... import scaling

    law = scaling.law("chinchilla")
    n0, d0 = optimum(law, p["C"])
    target = law.E + law.A / n0**law.alpha + law.B / d0**law.beta

    def cost(n):
        gap = target - law.E - law.A / n**law.alpha
        if gap <= 0:
            return math.inf
        return 6 * n * (law.B / gap) ** (1 / law.beta) + 2 * n * p["inference_multiple"] * d0

    grid = [n0 * 10 ** (-1.5 + 1.7 * i / 2000) for i in range(2001)]
    i = min(range(len(grid)), key=lambda j: cost(grid[j]))
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    for _ in range(100):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, m2) if cost(m1) < cost(m2) else (m1, hi)
    return n0 / ((lo + hi) / 2)
