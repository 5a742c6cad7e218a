"""Hyper-parameter search for a fixed budget: a seeded random search and the learning-rate range test.

- ``sample_configs(space, n, seed)``: ``n`` configurations drawn from ``space`` by a generator seeded with
  ``seed`` and nothing else, so the same seed gives the same trials on any machine. ``space`` maps a name to
  ``("log", lo, hi)`` (log-uniform float), ``("float", lo, hi)`` or ``("int", lo, hi)`` (inclusive).
  Bergstra and Bengio (2012) show random search beats a grid for the same number of trials when only a few
  of the dimensions matter: a grid tries few distinct values of each.
- ``random_search(objective, space, n_trials, seed)``: each trial's ``objective(**config)`` (a held-out loss,
  lower is better), the trials in order and the best one. The objective seeds its own training, so a trial
  re-run gives the same loss.
- ``lr_range_test(make_model, data, ...)``: one short run whose learning rate grows geometrically from ``lr_min``
  to ``lr_max`` (fastai's learning-rate finder; Smith 2017 grows it linearly and watches the accuracy); the loss
  falls, flattens, then blows up. ``pick_lr`` takes the learning rate where the smoothed loss was lowest, divided
  by ``margin`` (10 by default, fastai's rule of thumb; notebook 25 uses 3 for its short runs): below the blow-up
  (``blow_up_lr``).
"""

from __future__ import annotations

import math

import numpy as np

from ..config import ArgumentError, check_int, check_number

__all__ = ["blow_up_lr", "lr_range_test", "pick_lr", "random_search", "sample_configs"]


def sample_configs(space: dict, n: int, seed: int) -> list[dict]:
    """``n`` configurations drawn from ``space`` (see the module docstring) with ``np.random.default_rng(seed)``."""
    check_int("n", n, 1)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        cfg = {}
        for name, (kind, lo, hi) in space.items():
            if kind == "log":
                cfg[name] = float(math.exp(rng.uniform(math.log(lo), math.log(hi))))
            elif kind == "float":
                cfg[name] = float(rng.uniform(lo, hi))
            elif kind == "int":
                cfg[name] = int(rng.integers(lo, hi + 1))
            else:
                raise ArgumentError(f"space[{name!r}] kind must be 'log', 'float' or 'int', got {kind!r}")
        out.append(cfg)
    return out


def random_search(objective, space: dict, n_trials: int, seed: int) -> dict:
    """Run ``objective(**config)`` on ``n_trials`` configurations of ``sample_configs(space, n_trials, seed)``.
    Returns ``{"trials": [config + {"loss"}], "best": the trial with the lowest loss}``."""
    trials = [{**cfg, "loss": float(objective(**cfg))} for cfg in sample_configs(space, n_trials, seed)]
    return {"trials": trials, "best": min(trials, key=lambda t: t["loss"])}


def lr_range_test(make_model, data, *, lr_min: float = 1e-5, lr_max: float = 1.0, steps: int = 60, batch: int = 16):
    """Train ``make_model()`` for ``steps`` AdamW steps on consecutive batches of ``data`` ([n, s + 1] tokens)
    with the learning rate of step i ``lr_min · (lr_max / lr_min)^(i / (steps - 1))``. Returns ``(lrs, losses)``
    (lists of floats; a loss that became inf or nan is kept as inf)."""
    import torch

    check_int("steps", steps, 2)
    check_number("lr_min", lr_min, 0, lo_open=True)
    check_number(f"lr_max (lr_min={lr_min})", lr_max, lr_min, lo_open=True)
    model, data = make_model(), torch.as_tensor(data)
    opt = torch.optim.AdamW(model.parameters(), lr=lr_min)
    lrs, losses = [], []
    for i in range(steps):
        lr = lr_min * (lr_max / lr_min) ** (i / (steps - 1))
        for group in opt.param_groups:
            group["lr"] = lr
        start = (i * batch) % max(1, len(data) - batch + 1)
        x = data[start : start + batch]
        loss = model(x[:, :-1], targets=x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        value = float(loss.detach())
        lrs.append(lr)
        losses.append(value if math.isfinite(value) else math.inf)
    return lrs, losses


def _smooth(losses, beta: float = 0.7) -> list[float]:
    """Exponential moving average of ``losses`` (bias-corrected, as fastai's LR finder)."""
    out, avg = [], 0.0
    for i, v in enumerate(losses):
        avg = beta * avg + (1 - beta) * min(v, 1e6)
        out.append(avg / (1 - beta ** (i + 1)))
    return out


def blow_up_lr(lrs, losses, factor: float = 1.5) -> float:
    """The first learning rate past the minimum at which the smoothed loss exceeds ``factor`` times its
    minimum (inf if it never does)."""
    sm = _smooth(losses)
    best = int(np.argmin(sm))
    for lr, v in zip(lrs[best:], sm[best:]):
        if v > factor * sm[best]:
            return float(lr)
    return math.inf


def pick_lr(lrs, losses, margin: float = 10.0) -> float:
    """The learning rate at the smoothed loss's minimum, divided by ``margin``."""
    check_number("margin", margin, 1)
    return float(lrs[int(np.argmin(_smooth(losses)))] / margin)
