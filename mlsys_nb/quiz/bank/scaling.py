"""Families of the topic ``scaling``: scaling laws (the compute-optimal N and D, tokens per
parameter, the 20-tokens rule, predicted loss, the inference-aware optimum).

Answer keys: ``mlsys_nb.scaling`` (``law``, ``twenty_tokens_per_param``).
"""

from __future__ import annotations

from ... import scaling
from ..core import family
from ._util import numeric_family, pick, picks
from .compute import SEC_FLOPS

REF_CHIN = "docs/references.md#chinchilla (Hoffmann et al. 2022, arXiv:2203.15556), #epoch-chinchilla"
SEC_LAWS = SEC_FLOPS + ", §5 Scaling laws and compute-optimal allocation"
REF_SARDANA = "docs/references.md#sardana2023 (Sardana et al. 2023, arXiv:2401.00448)"


def _budget(rng):
    return pick(rng, [1e21, 3e21, 1e22, 5.76e23, 1e23, 1e24, 3.8e25])


def _law_budget(rng) -> dict:
    law_name = pick(rng, ["chinchilla", "epoch"])
    return {"law": law_name, "C": _budget(rng)}


def _optimum(p) -> tuple[float, float]:
    """(N*, D*) of the law ``p["law"]`` at the budget ``p["C"]`` (``scaling.law(...).compute_optimal``)."""
    return scaling.law(p["law"]).compute_optimal(p["C"])


def _optimum_family(name: str, which: int, **words):
    """A question on a fitted law's compute-optimal (N*, D*) at a drawn budget: ``which`` 0 asks N*, 1 D*."""
    numeric_family(
        family(name, difficulty=2, section=SEC_LAWS, reference=REF_CHIN),
        draw=_law_budget,
        calc=_optimum,
        key=lambda nd: nd[which],
        **words,
    )


_optimum_family(
    "scaling.chinchilla_params",
    0,
    unit="params",
    tolerance=0.02,
    fields=lambda p, result: {"ratio": result[1] / result[0]},
    text=(
        "Under the '{law}' fit of L(N, D) = E + A/N^α + B/D^β, what model size is compute-optimal for C = "
        "{C:.3g} FLOPs (C = 6ND)?"
    ),
    hints=["N* = G·(C/6)^(β/(α+β)), G = (αA/(βB))^(1/(α+β)).", "D* = C/(6N*)."],
    solution=["N* = {result[0]:.4g}, D* = {result[1]:.4g}, D*/N* = {ratio:.3g} (scaling.law(...).compute_optimal)."],
)

_optimum_family(
    "scaling.chinchilla_tokens",
    1,
    unit="tokens",
    text="Under the '{law}' law, how many training tokens are compute-optimal for C = {C:.3g} FLOPs?",
    hints=["First N*, then D* = C / (6N*)."],
    solution=["N* = {result[0]:.4g}; D* = C/(6N*) = {result[1]:.4g} tokens."],
)

numeric_family(
    family("scaling.tokens_per_param", section=SEC_LAWS, reference=REF_CHIN),
    draw=_law_budget,
    calc=lambda p: float(scaling.law(p["law"]).tokens_per_parameter(p["C"])),
    unit="ratio",
    text="At C = {C:.3g} FLOPs, the '{law}' law's compute-optimal D*/N* (tokens per parameter)?",
    hints=["It is not a constant: it drifts with C unless α = β.", "Compute N*, D*, divide."],
    solution=["D*/N* = {result:.4g} (scaling.law(...).tokens_per_parameter)."],
)

numeric_family(
    family("scaling.twenty_rule_params", section=SEC_LAWS, reference=REF_CHIN),
    draw=lambda rng: {"C": _budget(rng)},
    calc=lambda p: scaling.twenty_tokens_per_param(p["C"]),
    key=lambda nd: float(nd[0]),
    unit="params",
    fields=lambda p, result: {"n_opt": float(result[0]), "d_opt": float(result[1])},
    text="With the '20 tokens per parameter' heuristic and C = 6ND, what N fits C = {C:.3g} FLOPs?",
    hints=["C = 6·N·(20N) = 120 N²."],
    solution=["N = sqrt(C/120) = {n_opt:.4g}; D = 20N = {d_opt:.4g}."],
    diagnostics=[(20.0**0.5, "N = sqrt(C/120), not sqrt(C/6)")],
)


def _loss_case(rng) -> dict:
    law_name = pick(rng, ["chinchilla", "epoch"])
    return {"law": law_name, "N": pick(rng, [1e9, 7e9, 70e9]), "D": pick(rng, [1e11, 1.4e12, 1.5e13])}


def _fit(law_name: str) -> str:
    law = scaling.law(law_name)
    return f"E = {law.E}, A = {law.A:.4g}, B = {law.B:.4g}, α = {law.alpha}, β = {law.beta}"


numeric_family(
    family("scaling.loss", section=SEC_LAWS, reference=REF_CHIN),
    draw=_loss_case,
    calc=lambda p: float(scaling.law(p["law"]).loss(p["N"], p["D"])),
    unit="nats/token",
    tolerance=0.005,
    fields=lambda p, result: {"fit": _fit(p["law"])},
    text=(
        "Predicted loss (nats/token) of N = {N:.3g} parameters trained on D = {D:.3g} tokens under the "
        "'{law}' fit ({fit})?"
    ),
    hints=["L = E + A/N^α + B/D^β."],
    solution=["L = {result:.4f} (scaling.law(...).loss)."],
)


def _lifetime_optimum(p) -> dict:
    """``scaling.law('chinchilla').inference_optimal`` for serving ``inference_multiple`` × the Chinchilla
    tokens; adds the Chinchilla optimum ``N0``."""
    law = scaling.law("chinchilla")
    n0, d0 = law.compute_optimal(p["C"])
    return {**law.inference_optimal(p["C"], p["inference_multiple"] * d0), "N0": n0}


numeric_family(
    family("scaling.inference_optimal_shrink", difficulty=3, section=SEC_LAWS, reference=REF_SARDANA),
    draw=lambda rng: picks(rng, C=[1e22, 1e23, 1e24], inference_multiple=[1, 3, 10]),
    calc=_lifetime_optimum,
    key=lambda r: r["chinchilla_N"] / r["N"],
    unit="ratio",
    tolerance=0.02,
    fields=lambda p, result: {"factor": result["chinchilla_N"] / result["N"]},
    text=(
        "Budget C = {C:.3g} FLOPs, Chinchilla law. The model will then serve {inference_multiple}× its "
        "Chinchilla-optimal training tokens at inference (2N FLOPs per token). Reaching the same loss with "
        "the least lifetime compute, by what factor is the model smaller than Chinchilla-optimal?"
    ),
    hints=["Lifetime = 6·N·D_train + 2·N·D_inference.", "Along the iso-loss curve, trade N for D."],
    solution=[
        ("Chinchilla N* = {result[N0]:.4g}; inference-aware N = {result[N]:.4g} trained on {result[D]:.4g} tokens."),
        "Factor {factor:.4g} (scaling.law('chinchilla').inference_optimal).",
    ],
)
