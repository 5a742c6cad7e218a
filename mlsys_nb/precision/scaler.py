"""Dynamic loss scaling from scratch, step for step the rule of ``torch.amp.GradScaler``.

fp16's smallest subnormal is 2^-24 ≈ 6e-8, so small gradients underflow to zero in an fp16 backward. The
fix (Micikevicius et al., 2018, arXiv:1710.03740) multiplies the loss by a scale S before backward, so every
gradient is S times larger, and divides the gradients by S (in fp32) before the optimizer step. Dynamic
scaling picks S on the fly:

- if any gradient is inf or NaN after unscaling, the step is **skipped** and ``S *= backoff_factor`` (0.5);
- otherwise the step runs, and after ``growth_interval`` (2000) consecutive good steps ``S *= growth_factor`` (2).

``LossScaler`` has GradScaler's interface (``scale``, ``unscale_``, ``step``, ``update``, ``get_scale``), so one
training loop drives either; ``scaler_trajectory`` runs that loop with infs injected at chosen steps and
returns the scales and the skipped steps, which ``tests/test_precision.py`` compares with
``torch.amp.GradScaler("cpu")``'s (and shows that a scaler that never backs off fails the comparison).
"""

from __future__ import annotations

import math

from ..config import check_int, check_number


class LossScaler:
    """A dynamic loss scaler (GradScaler's rule and defaults). ``init_scale``: the first S;
    ``growth_factor`` > 1, ``backoff_factor`` in (0, 1] (1 never backs off: a broken scaler, for the test),
    ``growth_interval``: good steps before S grows."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000):
        self.scale_value = check_number("init_scale", init_scale, 0, lo_open=True)
        self.growth_factor = check_number("growth_factor", growth_factor, 1, lo_open=True)
        self.backoff_factor = check_number("backoff_factor", backoff_factor, 0, 1, lo_open=True)
        self.growth_interval = check_int("growth_interval", growth_interval, 1)
        self.good_steps = 0
        self._found_inf = None  # per optimizer step: None (not unscaled yet) or bool

    def get_scale(self) -> float:
        """The current loss scale S."""
        return self.scale_value

    def scale(self, loss):
        """``loss · S`` (backward of it gives S times the gradients)."""
        return loss * self.scale_value

    def unscale_(self, optimizer) -> bool:
        """Divide every gradient of ``optimizer``'s parameters by S in place (fp32 arithmetic) and return
        whether any is inf or NaN. Done once per step; ``step`` calls it if you did not."""
        import torch

        if self._found_inf is not None:
            return self._found_inf
        inv = 1.0 / self.scale_value
        found = False
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                p.grad.mul_(torch.tensor(inv, dtype=torch.float32))
                found = found or not bool(torch.isfinite(p.grad).all())
        self._found_inf = found
        return found

    def step(self, optimizer) -> bool:
        """Run ``optimizer.step()`` unless a gradient is inf/NaN; returns whether the step was skipped."""
        found = self.unscale_(optimizer)
        if not found:
            optimizer.step()
        return found

    def observe(self, found_inf: bool) -> None:
        """Update S as after a step whose gradients were (``True``) or were not (``False``) inf/NaN, without a
        model: the rule alone, for calculators and quiz keys."""
        self._found_inf = bool(found_inf)
        self.update()

    def update(self) -> None:
        """Back off after an overflow, grow after ``growth_interval`` good steps in a row."""
        if self._found_inf is None:
            return
        if self._found_inf:
            self.scale_value *= self.backoff_factor
            self.good_steps = 0
        else:
            self.good_steps += 1
            if self.good_steps == self.growth_interval:
                self.scale_value *= self.growth_factor
                self.good_steps = 0
        self._found_inf = None


def scaler_trajectory(scaler, n_steps: int = 40, inf_steps=(3, 4, 10, 25), seed: int = 0, lr: float = 0.05):
    """Train a small MLP for ``n_steps`` SGD steps through ``scaler`` (a ``LossScaler`` or a
    ``torch.amp.GradScaler``), with the scaled gradients rounded to fp16 (so a scale too large overflows to
    inf, as in an fp16 backward) and the loss made inf at the steps in ``inf_steps``, and return
    ``(scales, skipped, params)``: the scale before each step, whether each step was skipped, and the final
    parameters (a flat fp32 tensor)."""
    import torch

    check_int("n_steps", n_steps, 1)
    g = torch.Generator().manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(64, 8, generator=g), torch.randn(64, 1, generator=g)
    scales, skipped = [], []
    for step in range(n_steps):
        scales.append(float(scaler.get_scale()))
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if step in inf_steps:
            loss = loss * math.inf  # what an fp16 overflow in the forward or backward does to the gradients
        scaler.scale(loss).backward()
        for p in model.parameters():
            p.grad = p.grad.half().float()  # the fp16 gradient: above 65504 it is inf
        before = [p.detach().clone() for p in model.parameters()]
        scaler.step(opt)
        scaler.update()
        skipped.append(all(torch.equal(b, p) for b, p in zip(before, model.parameters())))
    return scales, skipped, torch.cat([p.detach().flatten() for p in model.parameters()])
