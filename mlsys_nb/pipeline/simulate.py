"""Event simulator for pipeline schedules (a simulation: checked against closed forms and real runs).

Every rank runs its ops in the schedule's order; an op starts at
``max(rank is free, each dependency finished + comm latency if it ran on another rank)``
(the dependency model of every schedule paper, e.g. Qi et al. 2024, arXiv:2401.10241). Costs are the
times of one micro-batch through one rank's share of the model
(L/p layers); an op on a chunk costs ``cost × schedule.chunk_weight × imbalance[rank]``.

Metrics (both bubble conventions are exposed, named):

- ``bubble_fraction`` = idle / total rank time = Σ_r (makespan − busy_r) / (p · makespan);
  (p−1)/(m+p−1) for 1F1B at equal costs (the zero-bubble README, arXiv:2401.10241).
- ``bubble_ratio`` = idle / busy = Σ_r (makespan − busy_r) / Σ_r busy_r ("bubble over ideal");
  (p−1)/m for 1F1B (Narayanan et al. 2021, arXiv:2104.04473; the Playbook). The two are related by ``x/(1+x)``.
- ``bubble_time`` = makespan − mean busy time of a rank.
- ``peak_activations[r]`` = max over time of (#F done − #B done) on rank r, in units of one
  micro-batch's activations over L/p layers (a chunk counts ``chunk_weight``); ``peak_chunks``
  is the raw count. Input-gradient B frees the activations (Qi et al. 2024).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..config import check_number
from .schedules import Schedule, ScheduleError, paused_gc


@dataclass
class SimResult:
    schedule: Schedule
    costs: dict
    makespan: float
    busy: list[float]  # per rank, time units
    first_start: list[float]
    last_end: list[float]
    peak_chunks: list[int]
    _starts: list = field(repr=False, default_factory=list)  # per rank, start time of each op
    _durs: list = field(repr=False, default_factory=list)  # per rank, duration of each op
    _frame: object = field(repr=False, default=None)

    @property
    def p(self) -> int:
        return self.schedule.p

    @property
    def idle(self) -> list[float]:
        return [self.makespan - b for b in self.busy]

    @property
    def bubble_fraction(self) -> float:
        """Idle / total rank time, (p−1)/(m+p−1) for 1F1B at equal costs."""
        return sum(self.idle) / (self.p * self.makespan)

    @property
    def bubble_ratio(self) -> float:
        """Idle / busy ("bubble over ideal"), (p−1)/m for 1F1B."""
        return sum(self.idle) / sum(self.busy)

    @property
    def bubble_time(self) -> float:
        return self.makespan - sum(self.busy) / self.p

    @property
    def internal_idle(self) -> list[float]:
        """Per rank: idle time between its first op's start and its last op's end."""
        return [e - s - b for s, e, b in zip(self.first_start, self.last_end, self.busy)]

    @property
    def peak_activations(self) -> list[float]:
        """Per rank, in micro-batch × (L/p layers) units."""
        return [c * self.schedule.chunk_weight for c in self.peak_chunks]

    @property
    def timeline(self):
        """pandas DataFrame, one row per op (an overlapped FB pair gives an F row then a B row
        with ``overlap=True``): rank, kind, microbatch, chunk, stage, full, overlap, start, end."""
        if self._frame is None:
            import pandas as pd

            cols = ["rank", "kind", "microbatch", "chunk", "stage", "full", "overlap", "start", "end"]
            self._frame = pd.DataFrame(self.rows(), columns=cols)
        return self._frame

    def rows(self):
        """The timeline as a list of tuples (same columns as ``timeline``), without pandas."""
        out = []
        for r, a, s, e in (
            (rank, a, s, s + d)
            for rank in range(self.p)
            for a, s, d in zip(self.schedule.compute[rank], self._starts[rank], self._durs[rank])
        ):
            if a.kind == "FB":
                fa, ba = a.sub
                cut = s + (e - s) * self.costs["_f_share"][r]
                out.append((r, "F", fa.microbatch, fa.chunk, fa.stage, True, True, s, cut))
                out.append((r, "B", ba.microbatch, ba.chunk, ba.stage, ba.full, True, cut, e))
            else:
                out.append((r, a.kind, a.microbatch, a.chunk, a.stage, a.full, False, s, e))
        return out

    def summary(self) -> dict:
        return {
            "schedule": self.schedule.name,
            "p": self.p,
            "m": self.schedule.m,
            "v": self.schedule.v,
            "makespan": self.makespan,
            "bubble_fraction": self.bubble_fraction,
            "bubble_ratio": self.bubble_ratio,
            "peak_activations_max": max(self.peak_activations),
            "peak_activations_rank0": self.peak_activations[0],
        }


def _pos(name, x, allow_zero=True):
    if x is None:
        return
    check_number(name, x, 0, lo_open=not allow_zero)


def simulate(
    schedule: Schedule,
    F: float = 1.0,
    B: float = 1.0,
    W: float | None = None,
    comm: float = 0.0,
    *,
    FB: float | None = None,
    imbalance=None,
    a2a: float = 0.0,
) -> SimResult:
    """Simulate one step of ``schedule``.

    F, B, W: time of a forward, backward and weight-gradient op for one micro-batch over L/p layers.
    ``W=None``: the backward is not split and ``B`` is the whole backward (a schedule that splits it
    then raises). With ``W`` given, ``B`` is the input-gradient part and a full backward costs B + W.
    ``comm``: latency added to every dependency that crosses ranks. ``FB``: duration of an overlapped
    forward+backward pair (DualPipe; default F + full backward). ``imbalance``: per-rank multipliers.
    ``a2a``: expert-parallel all-to-all time (dispatch + combine) inside every F and every B (input
    gradient) op, on the critical path: F costs F + a2a, B costs B + a2a (W has none). In an
    overlapped FB pair each half's all-to-all hides behind the other half's compute (DualPipe,
    DeepSeek-V3 Sec. 3.2.1): the pair costs ``max(F, a2a) + max(B_full, a2a)`` (default FB only).
    """
    with paused_gc():
        return _simulate(schedule, F, B, W, comm, FB, imbalance, a2a)


def _simulate(sched, F, B, W, comm, FB, imbalance, a2a=0.0) -> SimResult:
    _pos("F", F, False), _pos("B", B, False), _pos("W", W), _pos("comm", comm), _pos("FB", FB), _pos("a2a", a2a)
    if W is None and sched.split_backward:
        raise ScheduleError(f"{sched.name} splits the backward into B (input grad) and W (weight grad): pass W")
    imb = [1.0] * sched.p if imbalance is None else [float(x) for x in imbalance]
    if len(imb) != sched.p or min(imb) <= 0:
        raise ValueError(f"imbalance must hold {sched.p} positive multipliers (one per rank), got {imbalance!r}")
    wgt = sched.chunk_weight
    b_full = B + (W or 0.0)
    fb = F + b_full if FB is None else FB
    if a2a and FB is None:
        fb = max(F, a2a) + max(b_full, a2a)

    plan = _plan(sched)
    dur_of = {
        ("F", True): F + a2a,
        ("B", True): b_full + a2a,
        ("B", False): B + a2a,
        ("W", True): W or 0.0,
        ("FB", True): fb,
    }
    end = [-1.0] * (3 * sched.n_stages * sched.m)
    waiting: list = [None] * len(end)  # key -> ranks blocked on it
    ptr, free = [0] * sched.p, [0.0] * sched.p
    starts: list[list[float]] = [[] for _ in range(sched.p)]
    busy, durations, rows = [], [], []
    for r in range(sched.p):
        scale = wgt * imb[r]
        durs = [dur_of[(a.kind, a.full)] * scale for a in sched.compute[r]]
        busy.append(sum(durs))
        durations.append(durs)
        rows.append(list(zip(durs, *plan[r])))
    ready = list(range(sched.p))
    while ready:
        r = ready.pop()
        ops, i, t, st_r = rows[r], ptr[r], free[r], starts[r]
        n = len(ops)
        while i < n:
            dur, key, dep, lat, key2, dep2, lat2 = ops[i]
            st = t
            for d, cross in ((dep, lat), (dep2, lat2)):  # the op's dependencies (-1: none)
                if d >= 0:
                    e = end[d]
                    if e < 0:  # not finished yet: rank r waits for it
                        if waiting[d] is None:
                            waiting[d] = []
                        waiting[d].append(r)
                        break
                    e += cross * comm
                    if e > st:
                        st = e
            else:  # all dependencies finished: the op runs (an FB pair ends two ops: key, key2), its waiters wake
                t = st + dur
                st_r.append(st)
                for k in (key, key2):
                    if k >= 0:
                        end[k] = t
                        w = waiting[k]
                        if w is not None:
                            ready.extend(w)
                            waiting[k] = None
                i += 1
                continue
            break
        ptr[r], free[r] = i, t
    stuck = {r: str(sched.compute[r][ptr[r]]) for r in range(sched.p) if ptr[r] < len(rows[r])}
    if stuck:
        raise ScheduleError(f"{sched.name}: deadlock in simulation, ranks wait at {stuck}")
    peaks = _peak_chunks(sched)
    costs = {
        "F": F,
        "B": B,
        "W": W,
        "comm": comm,
        "FB": FB,
        "imbalance": imb,
        "a2a": a2a,
        "_f_share": [(max(F, a2a) if a2a and FB is None else F) / fb if fb else 0.5] * sched.p,
    }
    first = [st[0] if st else 0.0 for st in starts]
    return SimResult(sched, costs, max(free), busy, first, free, peaks, starts, durations)


def _plan(sched: Schedule):
    """Per rank, columns (key, dep, cross, key2, dep2, cross2) of integer op keys
    ``(kind·n_stages + stage)·m + mb`` (kind F=0, B=1, W=2; -1 = none) and 0/1 "crosses ranks"
    flags. Cached on the schedule: it does not depend on costs."""
    if getattr(sched, "_plan_cache", None) is not None:
        return sched._plan_cache
    S, m = sched.n_stages, sched.m
    route = [[pl[s][0] for s in range(S)] for pl in sched.placement]
    path = sched.mb_path

    def one(x, r):
        j, s = x.microbatch, x.stage
        if x.kind == "F":
            if s == 0:
                return s * m + j, -1, 0
            return s * m + j, (s - 1) * m + j, int(route[path[j]][s - 1] != r)
        if x.kind == "B":
            if s == S - 1:
                return (S + s) * m + j, s * m + j, 0
            return (S + s) * m + j, (S + s + 1) * m + j, int(route[path[j]][s + 1] != r)
        return (2 * S + s) * m + j, (S + s) * m + j, 0

    plan = []
    for r in range(sched.p):
        cols = [
            one(a.sub[0], r) + one(a.sub[1], r) if a.kind == "FB" else one(a, r) + (-1, -1, 0) for a in sched.compute[r]
        ]
        plan.append(list(zip(*cols)) if cols else [[] for _ in range(6)])
    sched._plan_cache = plan
    return plan


def _peak_chunks(sched: Schedule) -> list[int]:
    """Per rank: max over its op order of (#F done − #B done), in chunks."""
    peaks = []
    for row in sched.compute:
        live = peak = 0
        for a in row:
            if a.kind == "F" or a.kind == "FB":
                live += 1
                peak = max(peak, live)
            if a.kind == "B" or a.kind == "FB":
                live -= 1
        peaks.append(peak)
    return peaks
