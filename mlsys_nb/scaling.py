"""Scaling laws: published loss fits, compute-optimal allocation, and a fitter.

``L(N, D) = E + A / N^alpha + B / D^beta`` (Chinchilla's parametric form; N parameters, D training
tokens, L in nats/token). Under ``C = 6 N D`` FLOPs the loss-minimising split is closed-form
(Hoffmann et al. 2022, arXiv:2203.15556, §3.3)::

    N*(C) = G (C/6)^a,  D*(C) = (C/6)^b / G,  a = beta/(alpha+beta), b = alpha/(alpha+beta),
    G = (alpha A / (beta B))^(1/(alpha+beta))

so the optimal tokens per parameter ``D*/N* = (C/6)^(b-a) / G^2`` is a constant only if alpha = beta:
"20 tokens per parameter" is a rounding of Chinchilla's approaches 1-2, not a law.

Kaplan et al.'s joint law ``L = [(N_c/N)^(alpha_N/alpha_D) + D_c/D]^alpha_D`` is included with its
published compute-efficient allocation ``N_opt = 1.3e9 (C/PF-day)^0.73``.

``fit(N, D, loss)`` fits the Chinchilla form as Hoffmann et al. and Epoch AI's replication do:
Huber loss (delta = 1e-3) on log-loss, L-BFGS from a grid of initialisations, parameters
``(log A, log B, log E, alpha, beta)``; ``bootstrap=k`` refits k resampled data sets for
percentile confidence intervals.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

import numpy as np
from threadpoolctl import threadpool_limits

from .config import check_number, check_probability, load_yaml
from .flops import PF_DAY

PARAMS = ("E", "A", "B", "alpha", "beta")


def _positive(name, x):
    arr = np.asarray(x, dtype=float)
    for bound in (arr.min(), arr.max()) if arr.size else ():  # nan makes min and max nan
        check_number(f"each of {name}", float(bound), 0, lo_open=True)
    return arr


def _out(x):
    return float(x) if np.ndim(x) == 0 else x


class Law:
    """Common interface: ``loss(N, D)``, ``compute_optimal(C) -> (N, D)``, iso-FLOP and iso-loss
    curves, inference-aware allocation. Arrays broadcast; scalars give floats."""

    name: str = ""
    label: str = ""

    def loss(self, N, D):  # pragma: no cover - abstract
        raise NotImplementedError

    def compute_optimal(self, C):  # pragma: no cover - abstract
        raise NotImplementedError

    def tokens_for_loss(self, loss, N):  # pragma: no cover - abstract
        raise NotImplementedError

    # ---- derived ----------------------------------------------------------------------------
    def tokens_per_parameter(self, C):
        """``D*/N*`` at the compute-optimal point for budget ``C`` (FLOPs)."""
        n, d = self.compute_optimal(C)
        return _out(np.asarray(d) / np.asarray(n))

    def optimal_loss(self, C):
        """Loss at the compute-optimal point for ``C`` FLOPs."""
        n, d = self.compute_optimal(C)
        return self.loss(n, d)

    def iso_flop(self, C, N):
        """Loss of models with ``N`` parameters trained on ``D = C / (6N)`` tokens (one budget)."""
        C, N = _positive("C", C), _positive("N", N)
        return self.loss(N, C / (6.0 * N))

    def iso_loss(self, loss, N):
        """Tokens ``D`` at which an ``N``-parameter model reaches ``loss`` (NaN where it cannot)."""
        return self.tokens_for_loss(loss, N)

    def inference_optimal(self, C, inference_tokens: float, *, n_grid: int = 400) -> dict:
        """Training allocation that reaches the compute-optimal loss ``L*(C)`` with the least
        *lifetime* compute ``6 N D_train + 2 N D_inference`` (Sardana et al. 2023): with inference
        demand the best model is smaller and trained on more tokens than Chinchilla-optimal.

        Returns ``{"N", "D", "train_flops", "inference_flops", "total_flops", "loss"}`` and the same
        quantities for the training-optimal point under keys prefixed ``chinchilla_``."""
        C = float(_positive("C", C))
        d_inf = float(inference_tokens)
        check_number("inference_tokens", d_inf, 0, unit="tokens")
        n0, d0 = self.compute_optimal(C)
        target = self.loss(n0, d0)
        ns = n0 * np.logspace(-3, 0.0, n_grid)  # smaller models only: larger ones cost more everywhere
        ds = self.tokens_for_loss(target, ns)
        total = 6 * ns * ds + 2 * ns * d_inf
        total = np.where(np.isfinite(total) & (ds > 0), total, np.inf)
        i = int(np.argmin(total))
        if i > 0 and i < n_grid - 1:  # refine between the neighbours
            lo, hi = math.log(ns[i - 1]), math.log(ns[i + 1])
            for _ in range(60):
                m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3

                def f(ln):
                    n = math.exp(ln)
                    return 6 * n * float(self.tokens_for_loss(target, n)) + 2 * n * d_inf

                if f(m1) < f(m2):
                    hi = m2
                else:
                    lo = m1
            n = math.exp((lo + hi) / 2)
        else:
            n = float(ns[i])
        d = float(self.tokens_for_loss(target, n))
        return {
            "N": n,
            "D": d,
            "train_flops": 6 * n * d,
            "inference_flops": 2 * n * d_inf,
            "total_flops": 6 * n * d + 2 * n * d_inf,
            "loss": float(target),
            "chinchilla_N": float(n0),
            "chinchilla_D": float(d0),
            "chinchilla_total_flops": 6 * float(n0) * float(d0) + 2 * float(n0) * d_inf,
        }

    def allocation_table(self, budgets):
        """``C, N*, D*, D*/N*, L*`` for each budget (FLOPs) as a DataFrame."""
        import pandas as pd

        rows = []
        for c in np.atleast_1d(budgets):
            n, d = self.compute_optimal(float(c))
            rows.append(
                {
                    "C (FLOPs)": float(c),
                    "N* (params)": n,
                    "D* (tokens)": d,
                    "D*/N* (tokens/param)": d / n,
                    "L* (nats/token)": self.loss(n, d),
                }
            )
        return pd.DataFrame(rows)


@dataclass(frozen=True)
class ChinchillaLaw(Law):
    """``L(N, D) = E + A/N^alpha + B/D^beta`` (nats/token)."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float
    name: str = "custom"
    label: str = ""
    source: str = field(default="", compare=False)
    stderr: dict = field(default_factory=dict, compare=False)

    def __post_init__(self):
        for k in PARAMS:
            v = getattr(self, k)
            check_number(k, v, 0, lo_open=True)
        if not self.label:
            object.__setattr__(self, "label", self.name)

    @property
    def a(self) -> float:
        """Exponent of N*(C): beta / (alpha + beta)."""
        return self.beta / (self.alpha + self.beta)

    @property
    def b(self) -> float:
        """Exponent of D*(C): alpha / (alpha + beta)."""
        return self.alpha / (self.alpha + self.beta)

    @property
    def G(self) -> float:
        return (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / (self.alpha + self.beta))

    def loss(self, N, D):
        N, D = _positive("N", N), _positive("D", D)
        return _out(self.E + self.A / N**self.alpha + self.B / D**self.beta)

    def compute_optimal(self, C):
        """``(N*, D*)`` minimising the loss under ``C = 6 N D`` (closed form)."""
        x = _positive("C", C) / 6.0
        return _out(self.G * x**self.a), _out(x**self.b / self.G)

    def tokens_for_loss(self, loss, N):
        N = _positive("N", N)
        rest = np.asarray(loss, dtype=float) - self.E - self.A / N**self.alpha
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(rest > 0, (self.B / np.where(rest > 0, rest, 1.0)) ** (1.0 / self.beta), np.nan)
        return _out(d)

    def params(self) -> dict:
        return {k: getattr(self, k) for k in PARAMS}


@dataclass(frozen=True)
class KaplanLaw(Law):
    """Kaplan et al. 2020: ``L = [(N_c/N)^(alpha_N/alpha_D) + D_c/D]^alpha_D`` (N non-embedding)
    and the compute-efficient ``N_opt = N_e (C/PF-day)^p_N`` with ``D = C / (6 N)``."""

    N_c: float
    alpha_N: float
    D_c: float
    alpha_D: float
    N_e: float
    p_N: float
    D_e: float = 0.0
    p_D: float = 0.0
    name: str = "kaplan"
    label: str = ""
    source: str = field(default="", compare=False)

    def loss(self, N, D):
        N, D = _positive("N", N), _positive("D", D)
        return _out(((self.N_c / N) ** (self.alpha_N / self.alpha_D) + self.D_c / D) ** self.alpha_D)

    def compute_optimal(self, C):
        C = _positive("C", C)
        n = self.N_e * (C / PF_DAY) ** self.p_N
        return _out(n), _out(C / (6.0 * n))

    def tokens_for_loss(self, loss, N):
        N = _positive("N", N)
        rest = np.asarray(loss, dtype=float) ** (1.0 / self.alpha_D) - (self.N_c / N) ** (self.alpha_N / self.alpha_D)
        with np.errstate(divide="ignore", invalid="ignore"):
            d = np.where(rest > 0, self.D_c / np.where(rest > 0, rest, 1.0), np.nan)
        return _out(d)


# ---- published laws ----------------------------------------------------------------------------
def _raw() -> dict:
    return load_yaml("scaling_laws.yaml")


def law_names() -> list[str]:
    return list(_raw()["laws"])


def law(name: str) -> Law:
    """A published law from ``data/scaling_laws.yaml``: ``"chinchilla"``, ``"epoch"``, ``"kaplan"``."""
    raw = _raw()["laws"]
    if name not in raw:
        raise KeyError(f"unknown scaling law {name!r}: choose one of {sorted(raw)}")
    spec = dict(raw[name])
    form = spec.pop("form")
    spec.pop("note", None)
    if form == "chinchilla":
        return ChinchillaLaw(
            name=name,
            label=spec.pop("label", name),
            source=spec.pop("source", ""),
            stderr=spec.pop("stderr", {}),
            **{k: float(spec[k]) for k in PARAMS},
        )
    return KaplanLaw(name=name, **{k: (float(v) if k not in ("label", "source") else v) for k, v in spec.items()})


def training_runs():
    """Famous training runs (params, tokens, tokens/param, 6ND) from ``data/scaling_laws.yaml``."""
    import pandas as pd

    rows = []
    for name, r in _raw()["training_runs"].items():
        n, d = float(r["params"]), float(r["tokens"])
        rows.append(
            {
                "run": name,
                "params": n,
                "tokens": d,
                "tokens/param": d / n,
                "C = 6ND (FLOPs)": 6 * n * d,
                "preset": r.get("preset"),
                "source": r["source"],
            }
        )
    return pd.DataFrame(rows).set_index("run")


def twenty_tokens_per_param(C):
    """The "20 tokens per parameter" heuristic: ``C = 6 N (20 N)``, so ``N = sqrt(C / 120)``."""
    n = np.sqrt(_positive("C", C) / 120.0)
    return _out(n), _out(20.0 * n)


# ---- fitting -------------------------------------------------------------------------------------
GRIDS = {
    # Hoffmann et al. / Epoch: alpha, beta in {0, 0.5, ..., 2}, e in {-1, -0.5, ..., 1}, a, b in {0, 5, ..., 25}
    "paper": dict(
        alpha=np.arange(0, 2.01, 0.5),
        beta=np.arange(0, 2.01, 0.5),
        e=np.arange(-1, 1.01, 0.5),
        a=np.arange(0, 26, 5.0),
        b=np.arange(0, 26, 5.0),
    ),
    # a coarser grid over the same ranges, ~20x cheaper
    "coarse": dict(
        alpha=[0.25, 0.75, 1.5], beta=[0.25, 0.75, 1.5], e=[-1.0, 0.0, 1.0], a=[0.0, 10.0, 20.0], b=[0.0, 10.0, 20.0]
    ),
}


def huber_objective(theta, logN, logD, logL, delta):
    """The fit's objective and its gradient: ``(f, df/dtheta)``, ``f = sum Huber_delta(log L_pred - log L) / delta^2``
    over the points, ``theta = (log A, log B, log E, alpha, beta)``; ``log L_pred`` is the log-sum-exp of
    ``(log A - alpha log N, log B - beta log D, log E)``, i.e. ``L_pred = E + A/N^alpha + B/D^beta``."""
    a, b, e, alpha, beta = theta
    t = np.stack([a - alpha * logN, b - beta * logD, np.full_like(logN, e)])
    m = t.max(axis=0)
    w = np.exp(t - m)
    s = w.sum(axis=0)
    pred = m + np.log(s)
    w = w / s
    r = pred - logL
    absr = np.abs(r)
    quad = absr <= delta
    # scaled by 1/delta^2 (argmin unchanged) so L-BFGS's relative tolerances see an O(1) objective
    scale = 1.0 / (delta * delta)
    f = scale * np.where(quad, 0.5 * r * r, delta * (absr - 0.5 * delta)).sum()
    g_r = scale * np.where(quad, r, delta * np.sign(r))
    grad = np.array(
        [
            (g_r * w[0]).sum(),
            (g_r * w[1]).sum(),
            (g_r * w[2]).sum(),
            -(g_r * w[0] * logN).sum(),
            -(g_r * w[1] * logD).sum(),
        ]
    )
    return f, grad


_LBFGS = dict(maxiter=500, ftol=1e-12, gtol=1e-8)
_LBFGS_BOOT = dict(maxiter=300, ftol=1e-10, gtol=1e-6)


def _fit_theta(logN, logD, logL, delta, inits, options=None):
    from scipy.optimize import minimize

    best = None
    # L-BFGS-B on 5 parameters calls BLAS on 5-vectors: waking BLAS pool threads for each call is pure overhead
    # (a quick-mode fit ran ~9x slower on a busy 2-core machine); one thread gives the same optimum.
    with threadpool_limits(limits=1, user_api="blas"):
        for x0 in inits:
            res = minimize(
                huber_objective,
                np.asarray(x0, float),
                args=(logN, logD, logL, delta),
                jac=True,
                method="L-BFGS-B",
                options=options or _LBFGS,
            )
            if np.all(np.isfinite(res.x)) and (best is None or res.fun < best.fun):
                best = res
    return best


@dataclass(frozen=True)
class FittedLaw(ChinchillaLaw):
    """A ``ChinchillaLaw`` fitted to data, with bootstrap percentile intervals in ``ci``
    (``{param: (lo, hi)}``), the bootstrap samples in ``samples`` ({param: array}) and the Huber
    objective value at the optimum."""

    ci: dict = field(default_factory=dict, compare=False)
    samples: dict = field(default_factory=dict, compare=False, repr=False)
    objective: float = field(default=float("nan"), compare=False)
    n_points: int = 0

    def to_frame(self, truth: dict | None = None):
        import pandas as pd

        rows = []
        for k in PARAMS:
            lo, hi = self.ci.get(k, (float("nan"), float("nan")))
            row = {"parameter": k, "fit": getattr(self, k), "ci_lo": lo, "ci_hi": hi}
            if truth is not None and k in truth:
                row["truth"] = truth[k]
            rows.append(row)
        return pd.DataFrame(rows).set_index("parameter")


def fit(
    N,
    D,
    loss,
    *,
    delta: float = 1e-3,
    grid="coarse",
    bootstrap: int = 0,
    ci: float = 0.95,
    seed: int = 0,
    starts=24,
    n_restarts: int = 1,
    name: str = "fit",
    progress: bool = False,
) -> FittedLaw:
    """Fit ``L = E + A/N^alpha + B/D^beta`` to measured ``(N, D, loss)`` points.

    Minimises ``sum Huber_delta(log L_pred - log L)`` with L-BFGS from every point of ``grid``
    (``"coarse"``: 243 starts; ``"paper"``: the 4,500 starts of Hoffmann et al./Epoch; or a dict of
    lists for ``alpha, beta, e, a, b``) and keeps the best. ``starts=k`` runs L-BFGS only from the
    k grid points with the lowest objective (a cheap screen; ``"all"`` = the paper's procedure).
    ``bootstrap`` resamples the points with replacement and refits from the best estimate and the
    ``n_restarts - 1`` next-best distinct optima; ``ci`` is the two-sided percentile interval."""
    N, D, L = _positive("N", N).ravel(), _positive("D", D).ravel(), _positive("loss", loss).ravel()
    if not (len(N) == len(D) == len(L)):
        raise ValueError(f"N, D, loss must have the same length, got {len(N)}, {len(D)}, {len(L)}")
    if len(N) < 5:
        raise ValueError(f"need at least 5 points to fit 5 parameters, got {len(N)}")
    check_probability("ci", ci, lo_open=True, hi_open=True)
    g = GRIDS[grid] if isinstance(grid, str) else grid
    inits = [(a, b, e, al, be) for al, be, e, a, b in itertools.product(g["alpha"], g["beta"], g["e"], g["a"], g["b"])]
    logN, logD, logL = np.log(N), np.log(D), np.log(L)
    if starts != "all":  # screen the grid by objective value, run L-BFGS from the best starts
        f0 = np.array([huber_objective(np.asarray(x, float), logN, logD, logL, delta)[0] for x in inits])
        inits = [inits[i] for i in np.argsort(f0)[: int(starts)]]
    scored = []
    for x0 in inits:
        r = _fit_theta(logN, logD, logL, delta, [x0])
        if r is not None:
            scored.append((r.fun, tuple(r.x)))
    if not scored:
        raise RuntimeError("no initialisation converged to a finite optimum")
    scored.sort()
    best_f, best = scored[0]
    restarts = [best] + [x for _, x in scored[1:] if not np.allclose(x, best, rtol=1e-3)][: n_restarts - 1]

    def to_params(th):
        a, b, e, alpha, beta = th
        return {"E": math.exp(e), "A": math.exp(a), "B": math.exp(b), "alpha": alpha, "beta": beta}

    samples, intervals = {}, {}
    if bootstrap:
        rng = np.random.default_rng(seed)
        it = range(int(bootstrap))
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc="bootstrap fits")
        draws = []
        for _ in it:
            idx = rng.integers(0, len(N), len(N))
            r = _fit_theta(logN[idx], logD[idx], logL[idx], delta, restarts, _LBFGS_BOOT)
            draws.append(to_params(r.x))
        q = (1 - ci) / 2
        for k in PARAMS:
            arr = np.array([d[k] for d in draws])
            samples[k] = arr
            intervals[k] = (float(np.quantile(arr, q)), float(np.quantile(arr, 1 - q)))
    p = to_params(best)
    if p["alpha"] <= 0 or p["beta"] <= 0:
        raise RuntimeError(f"fit gave non-positive exponents {p}: the data do not constrain the law")
    return FittedLaw(
        name=name,
        label=f"fit to {len(N)} points",
        ci=intervals,
        samples=samples,
        objective=float(best_f),
        n_points=len(N),
        **p,
    )
