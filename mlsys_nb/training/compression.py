"""Making a trained model smaller: magnitude pruning and knowledge distillation.

- **Pruning** sets a fraction ``sparsity`` of the weights of every linear layer inside the blocks to zero
  (embedding, head and norms stay dense). ``magnitude_prune`` zeroes the weights of smallest |w| in each
  matrix (Han et al. 2015); ``random_prune`` zeroes as many, chosen at random: the control. Small weights
  contribute little to the products, so at the same sparsity magnitude pruning costs less held-out loss.
- **Distillation** (Hinton et al. 2015) trains a small student on the teacher's whole next-token
  distribution instead of the one token the data holds: ``distill_loss = T² · KL(softmax(t/T) ‖
  softmax(s/T))``, mean over positions, with temperature ``T`` softening both (the T² keeps the gradient's
  scale as T changes). A sampled token is one draw from a distribution; the teacher's logits are the
  distribution (its estimate of it), so for the same steps the student ends closer to the teacher.
  ``kl_to_teacher`` measures how close: the mean KL(teacher ‖ student) at T = 1, in nats/token.
"""

from __future__ import annotations

from ..config import check_number

__all__ = [
    "distill_loss",
    "distillation",
    "kl_to_teacher",
    "magnitude_prune",
    "prunable_weights",
    "random_prune",
    "sparsity",
]


def prunable_weights(model) -> dict:
    """``{name: weight}`` of the linear layers inside ``model.blocks`` (the matrices pruning thins)."""
    import torch

    return {f"blocks.{n}.weight": m.weight for n, m in model.blocks.named_modules() if isinstance(m, torch.nn.Linear)}


def magnitude_prune(model, fraction: float):
    """Zero, in place, the ``fraction`` of each prunable matrix's weights with the smallest |w|; returns
    ``model``."""
    import torch

    check_number("fraction", fraction, 0, 1, hi_open=True)
    with torch.no_grad():
        for w in prunable_weights(model).values():
            k = int(fraction * w.numel())
            if k:
                cut = w.abs().flatten().kthvalue(k).values
                w.masked_fill_(w.abs() <= cut, 0.0)
    return model


def random_prune(model, fraction: float, *, seed: int):
    """Zero, in place, ``fraction`` of each prunable matrix's weights chosen at random (seeded); returns
    ``model``. The control for ``magnitude_prune``."""
    import torch

    check_number("fraction", fraction, 0, 1, hi_open=True)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for w in prunable_weights(model).values():
            k = int(fraction * w.numel())
            idx = torch.randperm(w.numel(), generator=gen)[:k]
            w.view(-1)[idx] = 0.0
    return model


def sparsity(model) -> float:
    """Fraction of the prunable weights that are exactly zero."""
    ws = list(prunable_weights(model).values())
    return sum(int((w == 0).sum()) for w in ws) / sum(w.numel() for w in ws)


def distill_loss(student_logits, teacher_logits, temperature: float = 2.0):
    """``T² · KL(softmax(teacher/T) ‖ softmax(student/T))``, mean over positions ([..., vocab] logits)."""
    import torch.nn.functional as F

    check_number("temperature", temperature, 0, lo_open=True)
    v = student_logits.shape[-1]
    log_s = F.log_softmax(student_logits.reshape(-1, v) / temperature, dim=-1)
    log_t = F.log_softmax(teacher_logits.reshape(-1, v) / temperature, dim=-1)
    kl = F.kl_div(log_s, log_t, log_target=True, reduction="batchmean")  # sum_v p_t (log p_t - log p_s), mean over rows
    return temperature**2 * kl


def distillation(teacher, temperature: float = 2.0):
    """A ``loss_fn(student, x)`` for ``loop.train_lm``: the distillation loss against ``teacher``'s logits on
    the same inputs (the teacher runs without gradients)."""
    import torch

    def loss_fn(student, x):
        with torch.no_grad():
            t = teacher(x[:, :-1])
        return distill_loss(student(x[:, :-1]), t, temperature)

    return loss_fn


def kl_to_teacher(student, teacher, tokens) -> float:
    """Mean KL(teacher ‖ student) in nats/token at T = 1 on ``tokens`` [n, s + 1] (inputs ``tokens[:, :-1]``)."""
    import torch

    x = torch.as_tensor(tokens)[:, :-1]
    with torch.no_grad():
        return float(distill_loss(student.eval()(x), teacher.eval()(x), 1.0))
