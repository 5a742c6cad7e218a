"""PyTorch's own schedules (``torch.distributed.pipelining``) as a reference for our op orders.

PyTorch's schedule classes build their per-rank action lists (``pipeline_order``) in the
constructor; they only read a few attributes of the stage objects, so light stand-ins let us build
them without a process group. ``torch_order(name, p, m, v)`` returns them in our ``Action`` format
(compute ops only, idle steps and ``REDUCE_GRAD`` dropped), or raises ``KeyError`` if PyTorch has no
such schedule (ZB-H2, bidirectional DualPipe).
"""

from __future__ import annotations

import types

from .schedules import Action, schedule

TORCH_CLASSES = {  # our name -> (class name, stages per rank)
    "gpipe": ("ScheduleGPipe", 1),
    "1f1b": ("Schedule1F1B", 1),
    "interleaved-1f1b": ("ScheduleInterleaved1F1B", None),
    "zb-h1": ("ScheduleInterleavedZeroBubble", 1),  # ZB1P; with one stage per rank it is ZB-H1
    "zbv": ("ScheduleZBVZeroBubble", 2),
    "dualpipev": ("ScheduleDualPipeV", 2),
}


def torch_pipeline_order(name: str, p: int, m: int, v: int | None = None) -> dict:
    """PyTorch's raw ``pipeline_order`` (rank -> list of ``_Action`` or None)."""
    from torch.distributed.pipelining import schedules as ts

    cls_name, local = TORCH_CLASSES[name]
    local = local or v or 2
    cls = getattr(ts, cls_name)
    stages = [
        types.SimpleNamespace(
            num_stages=p * local, group_size=p, group_rank=0, submod=None, stage_index=i, is_first=i == 0, is_last=False
        )
        for i in range(local)
    ]
    sched = cls(stages[0], m) if local == 1 and name in ("gpipe", "1f1b") else cls(stages, m)
    return sched.pipeline_order


def torch_order(name: str, p: int, m: int, v: int | None = None) -> list[list[Action]]:
    """PyTorch's per-rank compute order for our schedule ``name``, as our ``Action`` tuples."""
    ours = schedule(name, p, m, v)
    place = {s: rc for s, rc in enumerate(ours.placement[0])}
    order = torch_pipeline_order(name, p, m, v)

    def conv(a):
        t = a.computation_type.value
        if t == "OVERLAP_F_B":
            fa, ba = (conv(x) for x in a.sub_actions)
            return Action("FB", fa.microbatch, fa.chunk, fa.stage, True, None, (fa, ba))
        kind, full = {"F": ("F", True), "B": ("B", True), "I": ("B", False), "W": ("W", True)}[t]
        return Action(kind, a.microbatch_index, place[a.stage_index][1], a.stage_index, full)

    keep = {"F", "B", "I", "W", "OVERLAP_F_B"}
    return [[conv(a) for a in order[r] if a is not None and a.computation_type.value in keep] for r in range(p)]
