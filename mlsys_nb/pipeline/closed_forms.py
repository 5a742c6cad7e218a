"""Closed forms for pipeline bubbles and activation memory (sources: docs/references.md#gpipe, #pipedream-flush,
#megatron-ptdp, #zero-bubble, #zero-bubble-v, #dualpipe).

``closed_form(name, p, m, v, F, B, W, FB)`` returns what the formulas predict for the quantities the
simulator measures, in the simulator's units (costs per micro-batch over L/p layers; activations in
micro-batches × L/p layers). Keys that a formula does not cover for these inputs are ``None``.

- ``bubble_time`` = makespan − busy time of a rank.
- ``bubble_ratio`` = bubble_time / busy ("bubble/ideal", Megatron and the Playbook: (p−1)/m for 1F1B);
  ``bubble_fraction`` = bubble_time / makespan (idle fraction, the zero-bubble README: (p−1)/(m+p−1)).
- ``internal_idle`` = idle time inside each rank's busy span (0 for ZB-H2 and ZBV at equal costs).
- ``peak_activations`` = per rank, max in-flight activations.

And what crosses the stage boundaries: ``boundary_bytes(mbs, seq_len, hidden)`` = mbs·seq·h·bytes, one micro-batch's
activations forward (its gradient backward is the same size, so a round trip is 2·mbs·seq·h·bytes), and
``pp_bytes_per_step(p, m, ...)``, the bytes each rank sends per step.
"""

from __future__ import annotations

from ..config import check_int, dtype_bytes
from .schedules import ScheduleError, check_args


def peak_in_flight(name: str, p: int, m: int, v: int | None = None) -> list[float]:
    """Per rank, the most micro-batches whose activations the rank holds at once, in micro-batches
    × L/p layers (an interleaved chunk counts 1/v): GPipe ``m``; 1F1B and ZB-H1 ``min(p − r, m)``;
    ZB-H2 ``min(2p − 1 − 2r, m)``; interleaved 1F1B ``min(2(p − r − 1) + (v − 1)p + 1, m·v) / v``
    (Narayanan et al., 2021, arXiv:2104.04473, §2.2); ZBV ``p`` once ``m >= 2p − 1``, and at most
    ``min(m, p)`` below that (an upper bound: ``simulate`` gives the exact values). The closed form
    ``closed_form`` reports and ``mlsys_nb.memory`` uses; checks only that p, m, v are positive."""
    for label, value in (("p", p), ("m", m), ("v", v if v is not None else 1)):
        check_int(label, value, 1, error=ScheduleError)
    if name in ("gpipe",):
        return [float(m)] * p
    if name in ("1f1b", "zb-h1"):
        return [float(min(p - r, m)) for r in range(p)]
    if name == "zb-h2":
        return [float(min(2 * p - 1 - 2 * r, m)) for r in range(p)]
    if name == "interleaved-1f1b":
        v = 2 if v is None else v
        # rank 0: p + (p−1)/v (arXiv:2104.04473); rank r: one more than its warm-up forwards, in chunks of 1/v
        return [min(2 * (p - r - 1) + (v - 1) * p + 1, m * v) / v for r in range(p)]
    if name == "zbv":
        return [float(p) if m >= 2 * p - 1 else float(min(m, p))] * p
    raise ScheduleError(
        f"no closed form for the in-flight micro-batches of {name!r}: "
        f"allowed gpipe, 1f1b, interleaved-1f1b, zb-h1, zb-h2, zbv"
    )


def closed_form(
    name: str,
    p: int,
    m: int,
    v: int | None = None,
    F: float = 1.0,
    B: float = 1.0,
    W: float | None = None,
    FB: float | None = None,
) -> dict:
    """Formula values for schedule ``name`` (see the module docstring); costs as in ``simulate``."""
    v = check_args(name, p, m, v)
    Wc = W or 0.0
    b_full = B + Wc  # whole backward
    busy = m * (F + b_full)  # every rank does m micro-batches over L/p layers (DualPipe: 2 copies, m total)
    out = {"bubble_time": None, "internal_idle": None, "peak_activations": None}
    equal = W is not None and F == B == W
    if name in ("gpipe", "1f1b"):
        out["bubble_time"] = (p - 1) * (F + b_full)
        out["peak_activations"] = peak_in_flight(name, p, m)
    elif name == "interleaved-1f1b":
        out["bubble_time"] = (p - 1) * (F + b_full) / v
        out["peak_activations"] = peak_in_flight(name, p, m, v)
    elif name == "zb-h1":
        if m >= p:  # the zero-bubble paper's ZB1P bubble; needs a full warm-up
            out["bubble_time"] = (p - 1) * (F + B - Wc)
        out["peak_activations"] = peak_in_flight(name, p, m)
    elif name == "zb-h2":
        out["peak_activations"] = peak_in_flight(name, p, m)
        if equal and m >= 2 * p - 1:
            out["internal_idle"] = [0.0] * p
            out["bubble_time"] = (p - 1) * F  # only the start-offset parallelogram remains
    elif name == "zbv":
        out["peak_activations"] = peak_in_flight(name, p, m) if m >= 2 * p - 1 else None  # 2p half-size chunks
        if equal and m >= 2 * p - 1:
            out["internal_idle"] = [0.0] * p
            out["bubble_time"] = (p - 1) * F / 2
    elif name in ("dualpipe", "dualpipev"):
        # DeepSeek's table: (PP/2 − 1)(F&B + B − 3W) per chunk; exact when F&B = F + B_full, W = F.
        n, w = (p // 2, 1.0) if name == "dualpipe" else (p, 0.5)
        fb = F + b_full if FB is None else FB
        if W is not None and fb == F + b_full and Wc == F:
            out["bubble_time"] = (n - 1) * (fb + b_full - 3 * Wc) * w
        chunks = p + 1 if name == "dualpipe" else 2 * p + 1
        out["peak_activations"] = [chunks * w] * p
    bt = out["bubble_time"]
    out["bubble_ratio"] = None if bt is None else bt / busy
    out["bubble_fraction"] = None if bt is None else bt / (busy + bt)
    return out


def boundary_bytes(mbs: int, seq_len: int, hidden: int, dtype="bf16") -> float:
    """Bytes one micro-batch sends across one stage boundary in ONE direction: its activations
    [mbs, seq_len, hidden] forward, mbs·seq_len·hidden·bytes (the gradient of the same tensor comes back in the
    backward: the same bytes, so a round trip is 2·mbs·seq_len·hidden·bytes). ``dtype``: a name in
    ``config.DTYPE_BYTES``, the activations' element type. No collective: one point-to-point send per boundary."""
    mbs, seq_len, hidden = (check_int(n, x, 1) for n, x in (("mbs", mbs), ("seq_len", seq_len), ("hidden", hidden)))
    return float(mbs * seq_len * hidden * dtype_bytes(dtype))


def pp_bytes_per_step(p: int, m: int, mbs: int, seq_len: int, hidden: int, v: int = 1, dtype="bf16") -> list[float]:
    """Bytes each of ``p`` pipeline ranks sends per step of ``m`` micro-batches, ``v`` chunks per rank (stages
    r, r+p, ...; v = 1: GPipe, 1F1B, ZB-H1/H2): every stage but the last sends each micro-batch's activations
    forward, every stage but the first sends their gradient backward, ``boundary_bytes`` each. So rank r sends
    m·(v − [r = p−1] + v − [r = 0])·boundary_bytes: a middle rank 2·m·v·mbs·seq·h·bytes; independent of the
    number of layers and of the parameters."""
    p, m, v = check_int("p", p, 1), check_int("m", m, 1), check_int("v", v, 1)
    x = boundary_bytes(mbs, seq_len, hidden, dtype)
    return [m * ((v - (r == p - 1)) + (v - (r == 0))) * x for r in range(p)]
