"""Families of the topic ``scaling``: scaling laws (the compute-optimal N and D, tokens per
parameter, the 20-tokens rule, predicted loss, the inference-aware optimum).

Answer keys: ``mlsys_nb.scaling`` (``law``, ``twenty_tokens_per_param``).
"""

from __future__ import annotations

from ... import scaling
from ..core import family
from ._util import pick
from .compute import SEC_FLOPS

REF_CHIN = "docs/references.md#chinchilla (Hoffmann et al. 2022, arXiv:2203.15556), #epoch-chinchilla"


def _budget(rng):
    return pick(rng, [1e21, 3e21, 1e22, 5.76e23, 1e23, 1e24, 3.8e25])


@family(
    "scaling.chinchilla_params",
    "scaling",
    difficulty=2,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _chin_n(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    law = scaling.law(law_name)
    n, d = law.compute_optimal(c)
    return dict(
        text=f"Under the '{law_name}' fit of L(N, D) = E + A/N^α + B/D^β, what model size is compute-optimal "
        f"for C = {c:.3g} FLOPs (C = 6ND)?",
        params={"law": law_name, "C": c},
        answer=n,
        unit="params",
        tolerance=0.02,
        hints=["N* = G·(C/6)^(β/(α+β)), G = (αA/(βB))^(1/(α+β)).", "D* = C/(6N*)."],
        solution=[f"N* = {n:.4g}, D* = {d:.4g}, D*/N* = {d / n:.3g} (scaling.law(...).compute_optimal)."],
    )


@family(
    "scaling.chinchilla_tokens",
    "scaling",
    difficulty=2,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _chin_d(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    n, d = scaling.law(law_name).compute_optimal(c)
    return dict(
        text=f"Under the '{law_name}' law, how many training tokens are compute-optimal for C = {c:.3g} FLOPs?",
        params={"law": law_name, "C": c},
        answer=d,
        unit="tokens",
        hints=["First N*, then D* = C / (6N*)."],
        solution=[f"N* = {n:.4g}; D* = C/(6N*) = {d:.4g} tokens."],
    )


@family(
    "scaling.tokens_per_param",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _tpp(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    c = _budget(rng)
    r = float(scaling.law(law_name).tokens_per_parameter(c))
    return dict(
        text=f"At C = {c:.3g} FLOPs, the '{law_name}' law's compute-optimal D*/N* (tokens per parameter)?",
        params={"law": law_name, "C": c},
        answer=r,
        unit="ratio",
        hints=["It is not a constant: it drifts with C unless α = β.", "Compute N*, D*, divide."],
        solution=[f"D*/N* = {r:.4g} (scaling.law(...).tokens_per_parameter)."],
    )


@family(
    "scaling.twenty_rule_params",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _twenty(rng):
    c = _budget(rng)
    n, d = scaling.twenty_tokens_per_param(c)
    return dict(
        text=f"With the '20 tokens per parameter' heuristic and C = 6ND, what N fits C = {c:.3g} FLOPs?",
        params={"C": c},
        answer=float(n),
        unit="params",
        hints=["C = 6·N·(20N) = 120 N²."],
        solution=[f"N = sqrt(C/120) = {float(n):.4g}; D = 20N = {float(d):.4g}."],
        diagnostics=[(20.0**0.5, "N = sqrt(C/120), not sqrt(C/6)")],
    )


@family(
    "scaling.loss",
    "scaling",
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference=REF_CHIN,
)
def _loss(rng):
    law_name = pick(rng, ["chinchilla", "epoch"])
    n, d = pick(rng, [1e9, 7e9, 70e9]), pick(rng, [1e11, 1.4e12, 1.5e13])
    law = scaling.law(law_name)
    v = float(law.loss(n, d))
    return dict(
        text=f"Predicted loss (nats/token) of N = {n:.3g} parameters trained on D = {d:.3g} tokens under the "
        f"'{law_name}' fit (E = {law.E}, A = {law.A:.4g}, B = {law.B:.4g}, "
        f"α = {law.alpha}, β = {law.beta})?",
        params={"law": law_name, "N": n, "D": d},
        answer=v,
        unit="nats/token",
        tolerance=0.005,
        hints=["L = E + A/N^α + B/D^β."],
        solution=[f"L = {v:.4f} (scaling.law(...).loss)."],
    )


@family(
    "scaling.inference_optimal_shrink",
    "scaling",
    difficulty=3,
    section=SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation",
    reference="docs/references.md#sardana2023 (Sardana et al. 2023, arXiv:2401.00448)",
)
def _inf_opt(rng):
    c = pick(rng, [1e22, 1e23, 1e24])
    mult = pick(rng, [1, 3, 10])
    law = scaling.law("chinchilla")
    n0, d0 = law.compute_optimal(c)
    r = law.inference_optimal(c, mult * d0)
    ratio = r["chinchilla_N"] / r["N"]
    return dict(
        text=f"Budget C = {c:.3g} FLOPs, Chinchilla law. The model will then serve {mult}× its "
        f"Chinchilla-optimal training tokens at inference (2N FLOPs per token). "
        f"Reaching the same loss with the least lifetime compute, by what factor is the model "
        f"smaller than Chinchilla-optimal?",
        params={"C": c, "inference_multiple": mult},
        answer=ratio,
        unit="ratio",
        tolerance=0.02,
        hints=["Lifetime = 6·N·D_train + 2·N·D_inference.", "Along the iso-loss curve, trade N for D."],
        solution=[
            f"Chinchilla N* = {n0:.4g}; inference-aware N = {r['N']:.4g} trained on {r['D']:.4g} tokens.",
            f"Factor {ratio:.4g} (scaling.law('chinchilla').inference_optimal).",
        ],
    )
