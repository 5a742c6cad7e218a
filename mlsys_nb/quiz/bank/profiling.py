"""Families of the topic ``profiling``: reading a trace (matmul FLOPs from an op's shapes), the
overlap fraction of communication from a timeline, the peak of a step from its memory events.

Answer keys: ``runtime.profiling`` (``mm_flops``, ``overlap_fraction``, ``memory_timeline``), the
functions notebook 05b runs on real traces.
"""

from __future__ import annotations

from ...runtime import profiling
from ..core import family
from ._util import MB, numeric_family, pick, picks

SEC_TRACE = "notebooks/05b_profiling.ipynb, §1 A trace of one training step"
SEC_DDP = "notebooks/05b_profiling.ipynb, §2 A DDP step on the timeline"
SEC_MEM = "notebooks/05b_profiling.ipynb, §3 The memory of a step over time"
REF_FLOPS = "docs/references.md#pytorch-profiler, #pytorch-autograd"
REF_DDP = "docs/references.md#pytorch-ddp (Li et al. 2020, arXiv:2006.15704, §3.2.3 overlap)"
REF_MEM = "docs/references.md#pytorch-profiler, #zero (Rajbhandari et al. 2020, arXiv:1910.02054, §3)"


def _mm_event(ts: float, m: int, k: int, n: int) -> dict:
    return {"ph": "X", "name": "aten::mm", "ts": ts, "dur": 1.0, "args": {"Input Dims": [[m, k], [k, n]]}}


def _linear_case(rng) -> dict:
    tokens = pick(rng, [2048, 4096, 8192, 16384])
    d_in, d_out = pick(rng, [1024, 2048, 4096]), pick(rng, [1024, 4096, 11008, 14336])
    return {"tokens": tokens, "d_in": d_in, "d_out": d_out}


def _backward_mm(p) -> tuple[int, float]:
    """(calls, FLOPs) of the two aten::mm events of a linear layer's backward (``runtime.profiling.mm_flops``).

    y = x W^T: grad_x = grad_y [t, out] @ W [out, in]; grad_W = grad_y^T [out, t] @ x [t, in]."""
    t, d_in, d_out = p["tokens"], p["d_in"], p["d_out"]
    return profiling.mm_flops([_mm_event(1.0, t, d_out, d_in), _mm_event(3.0, d_out, t, d_in)], (0.0, 10.0))


numeric_family(
    family("profiling.linear_backward_flops", section=SEC_TRACE, reference=REF_FLOPS),
    draw=_linear_case,
    calc=_backward_mm,
    key=lambda calls_flops: calls_flops[1],
    unit="FLOPs",
    fields=lambda p, result: {"calls": _backward_mm(p)[0]},
    text=(
        "A trace of the backward of one bias-free linear layer ({d_in} -> {d_out} features) on {tokens} "
        "tokens shows two aten::mm calls, with input shapes [{tokens}, {d_out}] x [{d_out}, {d_in}] and "
        "[{d_out}, {tokens}] x [{tokens}, {d_in}]. How many FLOPs do they do together?"
    ),
    hints=["An [M, K] x [K, N] matmul does M·N dot products of length K: 2·M·K·N FLOPs.", "{calls} calls."],
    solution=[
        ("grad of the input: 2 × {tokens} × {d_out} × {d_in}; grad of the weight: 2 × {d_out} × {tokens} × {d_in}."),
        "Sum = 4 × tokens × weights = {result[1]:.4g} FLOPs (runtime.profiling.mm_flops): twice the forward.",
    ],
    diagnostics=[(0.5, "backward runs two matmuls per linear layer (input and weight gradients)")],
)


def _spans(rng, n, lo, hi):
    starts = sorted(rng.uniform(lo, hi) for _ in range(n))
    return [(round(a, 1), round(a + rng.uniform(0.5, 4.0), 1)) for a in starts]


@family("profiling.overlap_fraction", difficulty=2, section=SEC_DDP, reference=REF_DDP)
def _overlap(rng):
    bwd_end = pick(rng, [20.0, 30.0, 40.0])
    comm = _spans(rng, pick(rng, [3, 4, 5]), 5.0, bwd_end + 8.0)
    frac = profiling.overlap_fraction(comm, [(0.0, bwd_end)])
    if frac in (0.0, 1.0):  # keep the question informative: part hidden, part exposed
        comm.append((bwd_end - 1.0, bwd_end + 2.0))
        frac = profiling.overlap_fraction(comm, [(0.0, bwd_end)])
    listed = ", ".join(f"{a:g}-{b:g}" for a, b in comm)
    return dict(
        text=f"A DDP step's trace: backward's compute runs from 0 to {bwd_end:g} ms; the all-reduce spans on "
        f"the communication thread are {listed} ms. What fraction of the communication time lies inside backward?",
        params={"comm": comm, "backward_end": bwd_end},
        answer=frac,
        unit="fraction",
        hints=[
            "Merge overlapping spans first: an instant of communication counts once.",
            "Hidden = the part of each span before backward ends.",
        ],
        solution=[
            f"Communication time = |union of spans| = {profiling.length(comm):.4g} ms.",
            f"Inside [0, {bwd_end:g}]: {profiling.intersection_length(comm, [(0.0, bwd_end)]):.4g} ms; "
            f"fraction = {frac:.4g} (runtime.profiling.overlap_fraction).",
        ],
    )


def _step_events(rng) -> dict:
    """A step's memory events in MB: forward saves three layers' activations, backward adds the logits' gradient,
    frees the activations, adds the gradients, frees the logits' gradient."""
    act = [pick(rng, [40, 60, 80, 120]) for _ in range(3)]  # MB kept by forward, layer by layer
    logits_grad, grads = pick(rng, [30, 50, 100]), pick(rng, [20, 40, 60])
    ops = [("forward: saved activations", a) for a in act]
    ops += [("backward: logits' gradient", logits_grad)]
    ops += [("backward: activations freed", -a) for a in act[::-1]]
    ops += [("backward: gradients", grads), ("backward: logits' gradient freed", -logits_grad)]
    return {"mb": [b for _, b in ops], "ops": ops, "act": act, "logits_grad": logits_grad}


def _peak(p) -> float:
    events = [
        {"name": "[memory]", "ts": float(i), "args": {"Bytes": b * MB, "Device Type": 0}} for i, b in enumerate(p["mb"])
    ]
    return max(b for _, b in profiling.memory_timeline(events))


numeric_family(
    family("profiling.step_peak_from_events", difficulty=2, section=SEC_MEM, reference=REF_MEM),
    draw=_step_events,
    calc=_peak,
    params=("mb",),
    unit="bytes",
    fields=lambda p, result: {
        "events": "; ".join((f"{what} {b:+d} MB" for what, b in p["ops"])),
        "act_mb": sum(p["act"]),
        "result_mb": result / MB,
    },
    text=(
        "The memory events of one step, in order (MB = 1e6 B; negative = freed): {events}. What is the peak "
        "of live bytes, counted from the start of the step?"
    ),
    hints=["Add the events in order and keep the running maximum.", "The peak comes early in backward."],
    solution=[
        "After forward: {act_mb} MB of activations; the logits' gradient adds {logits_grad} MB.",
        "Peak = {result_mb:g} MB (runtime.profiling.memory_timeline), before backward frees anything.",
    ],
    diagnostics=lambda p, peak: [
        (sum(p["act"]) / (sum(p["act"]) + p["logits_grad"]), "the logits' gradient lives beside the activations")
    ],
)

numeric_family(
    family("profiling.optimizer_state_appearance", section=SEC_MEM, reference=REF_MEM),
    draw=lambda rng: picks(rng, n_params=[125e6, 350e6, 1.3e9, 7e9]),
    calc=lambda p: profiling.memory_timeline(
        [{"name": "[memory]", "ts": 0.0, "args": {"Bytes": int(8 * p["n_params"]), "Device Type": 0}}]
    )[-1][1],
    unit="bytes",
    text=(
        "A model of {n_params:.3g} fp32 parameters trained with AdamW. By how many bytes does live memory "
        "jump during the *first* optimizer step of a trace (the step counters aside)?"
    ),
    hints=["AdamW allocates its states lazily, at the first step.", "Two fp32 states per parameter."],
    solution=["exp_avg + exp_avg_sq: 2 × 4 B × {n_params:.4g} = {result:.4g} B; the second step allocates nothing."],
    diagnostics=[(0.5, "Adam keeps two states per parameter (first and second moments)")],
)
