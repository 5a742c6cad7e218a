"""Pipeline parallelism: schedules, an event simulator, a real executor on ranks, timeline plots.

- ``schedule(name, p, m, v=None)`` -> ``Schedule`` with ``.actions[rank]`` (with send/recv) and
  ``.compute[rank]`` (F/B/W/FB only); names in ``SCHEDULES``; ``validate(schedule)``.
- ``simulate(schedule, F=1.0, B=1.0, W=None, comm=0.0)`` -> ``SimResult`` (makespan,
  bubble_fraction, bubble_ratio, peak_activations, timeline).
- ``closed_form(name, p, m, v, ...)``: the formulas.md §4 values the simulator is tested against.
- ``run_schedules(names, world_size, ...)`` (``executor``): the same schedules on real ranks.
- ``plot_timeline(result)`` (``plots``): a Gantt chart per rank.
"""
from .schedules import (COMM_KINDS, COMPUTE_KINDS, SCHEDULES, Action, Schedule, ScheduleError,
                        check_args, schedule, validate)
from .simulate import SimResult, simulate

__all__ = ["SCHEDULES", "COMPUTE_KINDS", "COMM_KINDS", "Action", "Schedule", "ScheduleError",
           "check_args", "schedule", "validate", "simulate", "SimResult"]
