"""Pipeline parallelism: schedules, an event simulator, a real executor on ranks, timeline plots.

- ``schedule(name, p, m, v=None)`` -> ``Schedule`` with ``.actions[rank]`` (with send/recv) and
  ``.compute[rank]`` (F/B/W/FB only); names in ``SCHEDULES``; ``validate(schedule)``; ``check_args(name, p,
  m, v)`` raises ``ScheduleError`` naming the parameter for a combination a schedule does not allow.
- ``simulate(schedule, F=1.0, B=1.0, W=None, comm=0.0, a2a=0.0)`` -> ``SimResult`` (makespan,
  bubble_fraction, bubble_ratio, peak_activations, timeline).
- ``closed_form(name, p, m, v, ...)``: the closed-form values the simulator is tested against;
  ``peak_in_flight(name, p, m, v)``: micro-batches in flight per rank (used by ``mlsys_nb.memory``);
  ``boundary_bytes(mbs, seq_len, hidden)``: one micro-batch's activations across a stage boundary, mbs·seq·h·bytes
  each way; ``pp_bytes_per_step(p, m, mbs, seq_len, hidden, v)``: the bytes each rank sends per step.
- ``run_schedules(names, world_size, ...)`` (``executor``): the same schedules on real ranks,
  gradients compared with the unpipelined model, measured timelines. ``executor.run_step`` is one rank's
  step: each action goes to the small function its kind names in ``executor.ACTIONS``; ``executor.ModelSpec``
  is the toy model and batch (MLP or transformer blocks, micro-batch shape).
- ``compare.compare_schedules(p, m, ...)``: every schedule at one setting, side by side (bubble, memory, messages).
- ``plot_timeline(result)``, ``plot_sim_vs_real`` (``plots``): Gantt charts per rank.
- ``reference.torch_order(name, p, m, v)``: PyTorch's own op order for the same schedule.
"""

from .schedules import (
    COMM_KINDS,
    COMPUTE_KINDS,
    SCHEDULES,
    Action,
    Schedule,
    ScheduleError,
    check_args,
    schedule,
    validate,
)
from .closed_forms import boundary_bytes, closed_form, peak_in_flight, pp_bytes_per_step
from .simulate import SimResult, simulate

__all__ = [
    "SCHEDULES",
    "COMPUTE_KINDS",
    "COMM_KINDS",
    "Action",
    "Schedule",
    "ScheduleError",
    "check_args",
    "schedule",
    "validate",
    "simulate",
    "SimResult",
    "closed_form",
    "peak_in_flight",
    "boundary_bytes",
    "pp_bytes_per_step",
    "run_schedules",
    "plot_timeline",
]


def __getattr__(name):  # heavier parts load on first use (torch, matplotlib)
    if name == "run_schedules":
        from .executor import run_schedules

        return run_schedules
    if name == "plot_timeline":
        from .plots import plot_timeline

        return plot_timeline
    raise AttributeError(f"module 'mlsys_nb.pipeline' has no attribute {name!r}")
