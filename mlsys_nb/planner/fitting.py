"""``calibrate()``: fit the step-time model's efficiencies on published runs (leave-one-out, bootstrap), and
``sensitivity(fit)``: how the published layouts' ranks move with each fitted parameter.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..config import check_choice, check_int
from . import model
from .calibration import FITTED, FIXED, PARAMS, BOUNDS, Calibration, generation, published_runs
from .context import DEFAULTS, PlanContext, plan_context
from .layout_search import search
from .plan import Layout


def run_pieces(runs) -> dict:
    """``step_pieces`` of each run's published layout as numpy arrays (calibration-free, computed once)."""
    import numpy as np

    rows = []
    for r in runs:
        ctx = plan_context(r["config"], **r["setup"], calibration=None)
        p = model.step_pieces(ctx, r["layout"])
        if p is None:
            raise ValueError(f"run {r['name']}: schedule {r['layout'].schedule} does not accept its layout")
        if not r.get("sequence_parallel", True):  # norms/dropout not split over TP ranks
            p = {**p, "elem": p["elem"] * r["layout"].tp}
        rows.append(p)
    keys = [k for k in rows[0] if k != "links"]
    out = {k: np.array([p[k] for p in rows], dtype=float) for k in keys}
    out["dual"] = out["dual"].astype(bool)
    out["gen"] = np.array([generation(r["gpu"]) == "hopper" for r in runs])
    return out


def predict_step_s(pieces: dict, theta, dp_overlap: float = DEFAULTS["dp_overlap"]):
    """Modelled step seconds of each run for parameters ``theta`` (order ``PARAMS``)."""
    import numpy as np

    ea, eh, ae, ov, eb, ls = theta
    eta = np.where(pieces["gen"], eh, ea)
    return sum(model.assemble_step(pieces, eta, ae, ov, eb, ls, dp_overlap).values())


@dataclass
class Fit:
    """Result of ``calibrate``: the ``calibration``, the runs it used, the modelled and reported MFU
    of each (in-sample), leave-one-out predictions (each run predicted by a fit without it) and
    bootstrap percentile intervals of every parameter (resampling runs)."""

    calibration: Calibration
    table: object  # pandas DataFrame, one row per run
    intervals: dict  # parameter -> (2.5 %, 97.5 %)
    bootstrap: object  # numpy array (n_boot, len(PARAMS))


def _full(free, fixed) -> list:
    """All ``PARAMS`` from the fitted ones (order ``FITTED``) and the fixed ones."""
    it = iter(free)
    return [fixed[k] if k in fixed else next(it) for k in PARAMS]


def _fit(pieces, logrep, idx, x0=None, fixed=FIXED):
    """Fitted parameters (order: ``PARAMS`` less ``fixed``) on the runs ``idx``."""
    import numpy as np
    from scipy.optimize import least_squares

    free = [k for k in PARAMS if k not in fixed]
    lo = np.array([BOUNDS[k][0] for k in free])
    hi = np.array([BOUNDS[k][1] for k in free])
    sub = {k: v[idx] for k, v in pieces.items()}
    y = logrep[idx]
    start = {"eff_ampere": 0.7, "eff_hopper": 0.7, "attn_eff": 0.7, "overlap": 0.5, "elem_bytes": 50.0, "layer_s": 1e-4}
    x0 = np.array([start[k] for k in free]) if x0 is None else np.asarray(x0)
    x0 = np.clip(x0, lo + 1e-6 * (hi - lo), hi - 1e-6 * (hi - lo))

    def res(th):
        return y - np.log(predict_step_s(sub, _full(th, fixed)))

    return least_squares(res, x0, bounds=(lo, hi), x_scale=hi - lo).x


def calibrate(runs=None, *, loo: bool = True, n_boot: int = 0, seed: int = 0, fixed=None) -> Fit:
    """Fit ``FITTED`` (the others held at ``fixed``, default ``FIXED``) by bounded least squares on
    log(reported step / modelled step) over ``runs``
    (default: every run with role 'fit' in ``data/published_runs.yaml``), i.e. on log MFU with the
    same FLOPs on both sides. ``loo``: predict each run from a fit on the others; ``n_boot``: refits on
    runs resampled with replacement (percentile intervals, ``seed``)."""
    import numpy as np
    import pandas as pd

    runs = published_runs("fit") if runs is None else runs
    fixed = FIXED if fixed is None else fixed
    for k in fixed:
        check_choice("each key of fixed", k, PARAMS)
    free = [k for k in PARAMS if k not in fixed]
    if len(runs) <= len(free):
        raise ValueError(f"runs: need more than {len(free)} runs to fit {len(free)} parameters, got {len(runs)}")
    pieces = run_pieces(runs)
    step_rep = np.array([r["reported_step_s"] for r in runs])
    logrep = np.log(step_rep)
    n = len(runs)
    theta = _fit(pieces, logrep, np.arange(n), fixed=fixed)
    fit_step = predict_step_s(pieces, _full(theta, fixed))
    rep_mfu = np.array([r["reported_mfu"] for r in runs])
    table = pd.DataFrame(
        {
            "run": [r["name"] for r in runs],
            "gpu": [r["gpu"] for r in runs],
            "gpus": [r["gpus"] for r in runs],
            "reported_mfu": rep_mfu,
            "fit_mfu": rep_mfu * step_rep / fit_step,
        }
    )
    if loo:
        pred = np.empty(n)
        for i in range(n):
            keep = np.array([j for j in range(n) if j != i])
            th = _fit(pieces, logrep, keep, x0=theta, fixed=fixed)
            pred[i] = predict_step_s({k: v[[i]] for k, v in pieces.items()}, _full(th, fixed))[0]
        table["heldout_mfu"] = rep_mfu * step_rep / pred
        table["heldout_error"] = table["heldout_mfu"] / table["reported_mfu"] - 1.0
    boots = np.empty((0, len(free)))
    intervals = {}
    if n_boot:
        rng = np.random.default_rng(seed)
        boots = np.array([_fit(pieces, logrep, rng.integers(0, n, n), x0=theta, fixed=fixed) for _ in range(n_boot)])
        intervals = {k: tuple(np.percentile(boots[:, j], [2.5, 97.5])) for j, k in enumerate(free)}
    return Fit(Calibration(*map(float, _full(theta, fixed))), table, intervals, boots)


def _distinct_rank(ctx: PlanContext, lays: list, pieces: list, cal: Calibration, want: Layout) -> int | None:
    """Rank (1 = best) of ``want``'s degrees among the distinct (dp, tp, pp, cp, ep) of ``lays`` timed
    under ``cal`` (their ``step_pieces``), or None."""
    eta = ctx.compute_efficiency * cal.efficiency(ctx.gpu)
    args = (cal.attn_eff, cal.overlap, cal.elem_bytes, cal.layer_s, ctx.dp_overlap)
    step = [sum(model.assemble_step(p, eta, *args).values()) for p in pieces]
    seen, target = set(), (want.dp, want.tp, want.pp, want.cp, want.ep)
    for i in sorted(range(len(lays)), key=step.__getitem__):
        key = (lays[i].dp, lays[i].tp, lays[i].pp, lays[i].cp, lays[i].ep)
        if key not in seen:
            seen.add(key)
            if key == target:
                return len(seen)
    return None


def sensitivity(fit: Fit, runs=None, *, top: int = 100):
    """Which fitted parameter moves the ranking most: for each run (default: every 'fit' run) the rank
    (1 = best) of its published degrees among the distinct (dp, tp, pp, cp, ep) layouts, at the fit
    and with each parameter of ``FITTED`` set to either end of its bootstrap interval (the others at
    the fit). Memory does not depend on the calibration, so the layouts that fit stay the same: the
    ``top`` best rows of the search at the fit are re-timed (a layout outside them is not seen: rank
    None). Returns a DataFrame (run, parameter, value, rank, fitted_rank, change)."""
    import pandas as pd

    if not fit.intervals:
        raise ValueError("fit: needs bootstrap intervals (calibrate(n_boot=...) with n_boot > 0)")
    check_int("top", top)
    runs = published_runs("fit") if runs is None else runs
    cal = fit.calibration
    rows = []
    for r in runs:
        df = search(r["config"], **r["setup"], calibration=cal, top=top)
        ctx = plan_context(r["config"], **r["setup"], calibration=cal)
        lays = [Layout(*(row[k] for k in Layout.__dataclass_fields__)) for _, row in df.iterrows()]
        pieces = [model.step_pieces(ctx, lay) for lay in lays]

        base = _distinct_rank(ctx, lays, pieces, cal, r["layout"])
        for k in FITTED:
            if k.startswith("eff_") and k != f"eff_{generation(ctx.gpu)}":
                continue  # another generation's efficiency: no effect on this run
            for v in fit.intervals[k]:
                moved = Calibration(**{**{q: getattr(cal, q) for q in PARAMS}, k: float(v)})
                got = _distinct_rank(ctx, lays, pieces, moved, r["layout"])
                change = None if (got is None or base is None) else got - base
                rows.append(dict(run=r["name"], parameter=k, value=float(v), rank=got, fitted_rank=base, change=change))
    return pd.DataFrame(rows)
