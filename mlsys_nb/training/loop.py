"""The training loop every section of notebook 25 uses: AdamW, linear warm-up, cosine decay, one batch a step.

``train_lm(model, data, steps=..., lr=..., warmup=...)`` trains ``model`` (a ``Transformer``) on consecutive
batches of ``data`` ([n, s + 1] int64 tokens, cycled) and returns the training loss of each step. The learning
rate of step i is ``lr · lr_factor(i, steps, warmup)``: it rises linearly over ``warmup`` steps, then decays
along a cosine to 10 % of ``lr`` at the last step. ``loss_fn(model, x)`` replaces the next-token cross-entropy
(distillation passes its own).
"""

from __future__ import annotations

import math

from ..config import check_int, check_number

__all__ = ["lr_factor", "next_token_loss", "train_lm"]


def lr_factor(step: int, steps: int, warmup: int) -> float:
    """Multiplier of the peak learning rate at ``step`` (0-based) of ``steps``: linear warm-up over ``warmup``
    steps ((step + 1) / warmup), then a cosine from 1 down to 0.1 at the last step."""
    if step < warmup:
        return (step + 1) / warmup
    span = max(1, steps - 1 - warmup)
    return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / span)))


def next_token_loss(model, x):
    """Mean cross-entropy (nats/token) of predicting ``x[:, 1:]`` from ``x[:, :-1]``."""
    return model(x[:, :-1], targets=x[:, 1:])


def train_lm(model, data, *, steps: int, lr: float, warmup: int = 0, batch: int = 16, loss_fn=next_token_loss):
    """Train ``model`` with AdamW for ``steps`` steps of ``batch`` rows of ``data`` (consecutive, cycled) at peak
    learning rate ``lr`` (see ``lr_factor``); returns the loss of each step (floats). Seed torch before building
    the model: the loop itself draws no random numbers."""
    import torch

    check_int("steps", steps, 1)
    check_int(f"warmup (steps={steps})", warmup, 0, steps)
    check_number("lr", lr, 0, lo_open=True)
    data = torch.as_tensor(data)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    model.train()
    losses = []
    for i in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr * lr_factor(i, steps, warmup)
        start = (i * batch) % max(1, len(data) - batch + 1)
        loss = loss_fn(model, data[start : start + batch])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses
