"""Notebook 22's checks on real training runs, as functions, so that a test can run each with its idea broken
(autocast switched off, a loss scale that does nothing) and show that it then fails.

- ``linear_output_dtypes(model)``: a context manager collecting the dtype of every ``nn.Linear`` output, i.e. the
  dtype autocast ran the matmuls in (bf16 inside a bf16 autocast region; fp32 outside or with ``enabled=False``).
- ``check_autocast_tracks_fp32``: the autocast run's matmuls ran in the low-precision dtype (the dtypes recorded),
  and its loss curve stays near fp32's without being fp32's: largest gap below ``tol`` and above ``floor`` (a
  run that autocast left in fp32 repeats fp32's losses exactly: gap 0).
- ``flat_grads(model, batch, scale)``: one real backward of ``loss · scale`` in the model's own dtype, the
  gradients divided by ``scale`` in fp32, as one vector; ``small_grad_error``: the median relative error of the
  gradient entries that are below a limit (fp16's smallest normal) in the fp32 reference.
- ``check_loss_scale_restores``: on real fp16 backwards, the small gradients' error at S = 1 is ``ratio`` times or
  more their error under a loss scale (a scale that does nothing gives a ratio of 1).
"""

from __future__ import annotations

from contextlib import contextmanager

from ..runtime.margins import check_margin

__all__ = [
    "check_autocast_tracks_fp32",
    "check_loss_scale_restores",
    "flat_grads",
    "linear_output_dtypes",
    "small_grad_error",
]


@contextmanager
def linear_output_dtypes(model):
    """Inside the block, the set yielded collects the dtype of every ``nn.Linear`` output of ``model``."""
    import torch

    seen: set = set()
    hooks = [
        m.register_forward_hook(lambda mod, args, out: seen.add(out.dtype))
        for m in model.modules()
        if isinstance(m, torch.nn.Linear)
    ]
    try:
        yield seen
    finally:
        for h in hooks:
            h.remove()


def check_autocast_tracks_fp32(
    fp32_losses, losses, dtypes, dtype, *, fp32_dtypes=None, tol: float = 0.05, floor: float = 1e-4
) -> float:
    """Assert that an autocast run ran its matmuls in ``dtype`` (``dtypes``: what ``linear_output_dtypes``
    recorded; ``fp32_dtypes``, if given, the fp32 run's, which must be fp32 only) and tracked fp32's loss curve:
    the largest |loss − fp32 loss| over the steps below ``tol`` and above ``floor`` (margin lines printed).
    Returns that gap."""
    import torch

    if set(dtypes) != {dtype}:
        seen = sorted(map(str, dtypes))
        raise AssertionError(f"autocast should run every linear layer in {dtype}, its outputs were {seen}")
    if fp32_dtypes is not None and set(fp32_dtypes) != {torch.float32}:
        raise AssertionError(f"the fp32 reference ran linear layers in {sorted(map(str, fp32_dtypes))}")
    if len(losses) != len(fp32_losses) or not losses:
        raise AssertionError(f"the runs differ in length: {len(losses)} and {len(fp32_losses)} steps")
    gap = max(abs(a - b) for a, b in zip(fp32_losses, losses))
    name = str(dtype).removeprefix("torch.")
    check_margin(f"autocast {name}: largest loss gap to fp32", gap, "<", tol, f"autocast {name} left fp32's curve")
    check_margin(
        f"autocast {name}: largest loss gap, lower bound",
        gap,
        ">",
        floor,
        "the run repeats fp32's losses: autocast changed nothing (fp32 on the same weights and batches gives 0)",
    )
    return gap


def flat_grads(model, batch, scale: float = 1.0):
    """Gradients of one batch's loss (cross-entropy on fp32 logits, ``batch`` [b, s + 1] tokens) as a flat fp32
    vector: backward of loss · ``scale`` in the model's own dtype, each gradient divided by ``scale`` in fp32."""
    import torch

    model.zero_grad()
    logits = model(batch[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), batch[:, 1:].flatten())
    (loss * scale).backward()
    return torch.cat([p.grad.float().flatten() for p in model.parameters()]) / scale


def small_grad_error(reference, grads, below: float) -> float:
    """Median relative error |g − g_ref| / |g_ref| over the entries of the fp32 ``reference`` that are non-zero and
    below ``below`` in magnitude (a gradient that became 0 counts as error 1)."""
    small = (reference != 0) & (reference.abs() < below)
    if not bool(small.any()):
        raise AssertionError(f"no reference gradient is below {below:g}: nothing to compare")
    ref = reference[small].double()
    return float(((grads[small].double() - ref).abs() / ref.abs()).median())


def check_loss_scale_restores(error_unscaled: float, error_scaled: float, ratio: float = 3.0) -> float:
    """Assert that a loss scale restores fp16's small gradients in a real fp16 backward: their median relative
    error without the scale is at least ``ratio`` times that with it (margin line printed). Returns the ratio."""
    r = error_unscaled / error_scaled if error_scaled > 0 else float("nan")
    check_margin(
        "real fp16 backward: small-gradient error, S=1 over S=2^10",
        r,
        ">",
        ratio,
        "the loss scale did not restore the gradients below fp16's normal range",
    )
    return r
