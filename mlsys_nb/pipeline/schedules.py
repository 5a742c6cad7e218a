"""Pipeline schedules: for every rank, the ordered list of actions it executes in one training step.

``schedule(name, p, m, v=None)`` builds one of ``SCHEDULES`` for ``p`` ranks and ``m`` micro-batches.
The model is cut into ``n_stages`` consecutive *stages* (pieces of layers). A stage lives on one rank
as one of that rank's ``v`` *chunks*:

============================  ===========  ==========================================  ===============
name                          n_stages     placement of stage ``s``                     chunk weight
============================  ===========  ==========================================  ===============
gpipe, 1f1b, zb-h1, zb-h2     p            rank ``s``                                   1
interleaved-1f1b (v chunks)   p·v          rank ``s % p``, chunk ``s // p``             1/v
zbv, dualpipev                2p           V shape: rank ``s`` for s < p, else 2p−1−s   1/2
dualpipe                      p (2 copies) direction 0: rank ``s``; direction 1: p−1−s   1
============================  ===========  ==========================================  ===============

The *chunk weight* is the fraction of ``L/p`` layers (one rank's share in a plain pipeline) a chunk
holds; the simulator scales op costs and activation counts by it so that all schedules compare at
the same model size and rank count. DualPipe keeps two copies of the parameters: micro-batches
``0 … m/2−1`` enter at rank 0 (direction 0, chunk 0), micro-batches ``m/2 … m−1`` at rank p−1
(direction 1, chunk 1).

Compute action kinds: ``"F"`` forward; ``"B"`` backward, either the full backward (``full=True``)
or only its input-gradient part (``full=False``, the weight gradient follows later as ``"W"``);
``"FB"`` an overlapped pair (a forward and a full backward of two different micro-batches, DualPipe).
Communication kinds (in ``Schedule.actions``, the lowered list): ``"SEND_F"``, ``"RECV_F"``,
``"SEND_B"``, ``"RECV_B"`` with ``peer`` the other rank. Sends are asynchronous (``isend``) and a
receive blocks until its data arrived: that is how ``validate`` and the executor treat them.

Op orders follow the papers and reference code (docs/references.md#pipeline-parallelism: Megatron
depth-first interleaving, the zero-bubble paper's ZB-H1/H2,
PyTorch's ``ScheduleZBVZeroBubble`` and ``ScheduleDualPipeV``, DeepSeek's ``dualpipe.py``).
"""

from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import NamedTuple

from ..config import PIPELINE_SCHEDULES as SCHEDULES  # every schedule's name: config holds the one list
from ..config import ArgumentError, check_choice, check_int

COMPUTE_KINDS = ("F", "B", "W", "FB")
COMM_KINDS = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")


class ScheduleError(ArgumentError):
    """An invalid schedule or an invalid (name, p, m, v) combination."""


class Action(NamedTuple):
    """One step of one rank. ``stage`` is the global stage index, ``chunk`` the rank-local chunk."""

    kind: str
    microbatch: int
    chunk: int
    stage: int
    full: bool = True  # for "B": True = whole backward (no separate "W" follows)
    peer: int | None = None  # for send/recv: the other rank
    sub: tuple = ()  # for "FB": (forward Action, backward Action)

    def __str__(self) -> str:
        if self.kind == "FB":
            return f"[{self.sub[0]}+{self.sub[1]}]"
        k = "Bi" if self.kind == "B" and not self.full else self.kind
        if self.peer is not None:
            return f"{k}{self.chunk}.{self.microbatch}@{self.peer}"
        return f"{k}{self.chunk}.{self.microbatch}"


@dataclass
class Schedule:
    """Per-rank compute order plus the placement needed to derive dependencies and messages."""

    name: str
    p: int  # ranks
    m: int  # micro-batches
    v: int  # chunks per rank
    n_stages: int
    chunk_weight: float  # layers of one chunk / (L/p)
    compute: list[list[Action]]  # per rank: F / B / W / FB only
    placement: list[list[tuple[int, int]]]  # [path][stage] -> (rank, chunk)
    mb_path: list[int]  # micro-batch -> path (DualPipe: its direction; else 0)
    split_backward: bool = False
    _actions: list[list[Action]] | None = field(default=None, repr=False)

    def rank_of(self, mb: int, stage: int) -> int:
        return self.placement[self.mb_path[mb]][stage][0]

    @property
    def actions(self) -> list[list[Action]]:
        """Per rank: the compute actions with ``RECV_*`` before and ``SEND_*`` after, as run."""
        if self._actions is None:
            self._actions = [lower_to_comms(self, r) for r in range(self.p)]
        return self._actions

    def format(self, ranks=None, comms: bool = False) -> str:
        """Readable per-rank traces (``F0.3`` = forward of chunk 0, micro-batch 3; ``Bi`` = input-grad B)."""
        rows = self.actions if comms else self.compute
        ranks = range(self.p) if ranks is None else ranks
        return "\n".join(f"r{r}: " + " ".join(map(str, rows[r])) for r in ranks)


# --------------------------------------------------------------------------------------------
# Generators, one per schedule. Each returns per-rank lists of (kind, chunk, mb[, full]) items.
# --------------------------------------------------------------------------------------------
def _gpipe(p, m, r):
    return [("F", 0, j) for j in range(m)] + [("B", 0, j) for j in range(m)]


def _one_f_one_b(p, m, r, warmup=None):
    """1F1B: ``warmup`` forwards, then (F, B) pairs, then the remaining backwards."""
    w = min(p - r - 1 if warmup is None else warmup, m)
    ops = [("F", 0, j) for j in range(w)]
    for i in range(m - w):
        ops += [("F", 0, w + i), ("B", 0, i)]
    return ops + [("B", 0, j) for j in range(m - w, m)]


def _interleaved(p, m, v, r):
    """Megatron depth-first interleaving: groups of p micro-batches cycle through the v chunks."""
    total = m * v
    fwd = [("F", (k // p) % v, (k // (p * v)) * p + k % p) for k in range(total)]
    bwd = [("B", v - 1 - (k // p) % v, (k // (p * v)) * p + k % p) for k in range(total)]
    w = min(2 * (p - r - 1) + (v - 1) * p, total)
    steady = [op for i in range(total - w) for op in (fwd[w + i], bwd[i])]
    return fwd[:w] + steady + bwd[total - w :]


def _zero_bubble(p, m, r, warmup, lag):
    """ZB-H1 (warmup p−r−1, lag r) and ZB-H2 (warmup 2(p−1−r), lag 2r): 1F1B order with the
    backward split; W(j) runs right after B(j + lag); leftover Ws at the end."""
    ops, next_w = [], 0
    for kind, c, j in _one_f_one_b(p, m, r, warmup):
        if kind == "F":
            ops.append(("F", c, j))
            continue
        ops.append(("B", c, j, False))
        if j - lag >= 0:
            ops.append(("W", c, j - lag))
            next_w = j - lag + 1
    return ops + [("W", 0, j) for j in range(next_w, m)]


def _zbv(n, m, r):
    """PyTorch ``ScheduleZBVZeroBubble``: chunk 0 = stage r, chunk 1 = stage 2n−1−r."""
    mm = max(2 * n - 1, m)
    ops, cnt = [], {"F0": 0, "F1": 0, "B0": 0, "B1": 0, "W0": 0, "W1": 0}

    def add(kind, c):
        key = f"{kind}{c}"
        ops.append((kind, c, cnt[key]) if kind != "B" else ("B", c, cnt[key], False))
        cnt[key] += 1

    for _ in range(2 * (n - r) - 1):
        add("F", 0)
    for _ in range(r):
        add("F", 1), add("F", 0)
    for _ in range(n - r):
        add("F", 1), add("B", 1), add("W", 1)
    while cnt["F1"] < cnt["F0"] or cnt["F0"] < mm:
        if cnt["F0"] < mm:
            add("F", 0)
        add("B", 0), add("W", 0), add("F", 1), add("B", 1), add("W", 1)
    for _ in range(r):
        add("B", 0), add("B", 1)
    for _ in range(n - r):
        add("B", 0), add("W", 0)
    while cnt["W1"] < cnt["B1"]:
        add("W", 1)
    while cnt["W0"] < cnt["B0"]:
        add("W", 0)
    return [op for op in ops if op[2] < m]  # drop the padding micro-batches


def _dualpipe_rank(n, r, N):
    """DeepSeek's DualPipe op order for half-rank index ``r`` of ``n`` (DualPipeV rank r of n).

    Items use *phases*: 0 = the direction entering on this rank's half, 1 = the other one.
    Returns (kind, phase, index_in_phase, full) and ("FB", (f_item, b_item))."""
    ops, nxt, wq = [], {("F", 0): 0, ("F", 1): 0, ("B", 0): 0, ("B", 1): 0}, []

    def f(ph):
        j = nxt[("F", ph)]
        nxt[("F", ph)] += 1
        return ("F", ph, j, True)

    def b(ph, full):
        j = nxt[("B", ph)]
        nxt[("B", ph)] += 1
        if not full:
            wq.append((ph, j))
        return ("B", ph, j, full)

    def w():
        if wq:
            ph, j = wq.pop(0)
            ops.append(("W", ph, j, True))

    for _ in range(2 * (n - r - 1)):
        ops.append(f(0))
    for _ in range(r + 1):
        ops += [f(0), f(1)]
    for _ in range(n - r - 1):
        ops.append(b(1, False))
        w()
        ops.append(f(1))
    for i in range(N - 2 * n + r + 1):
        if i == 0 and r == n - 1:  # the turn-around rank runs its first pair unoverlapped
            ops += [f(0), b(1, True)]
        else:
            ops.append(("FB", (f(0), b(1, True))))
        ops.append(("FB", (f(1), b(0, True))))
    for _ in range(n - r - 1):
        ops.append(b(1, True))
        ops.append(("FB", (f(1), b(0, True))))
    zb = False
    for i in range(r + 1):
        if i == (r + 1) // 2 and r % 2 == 1:
            zb = True
        ops.append(b(1, not zb))
        if i == (r + 1) // 2 and r % 2 == 0:
            zb = True
        ops.append(b(0, not zb))
    for _ in range(n - r - 1):
        w()
        ops.append(b(0, not zb))
    for _ in range(r + 1):
        w()
    return ops


# --------------------------------------------------------------------------------------------
@contextlib.contextmanager
def paused_gc():
    """Pause Python's cyclic garbage collector while building or simulating hundreds of thousands
    of small acyclic tuples (it would rescan them over and over: about 30% of the time)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def check_args(name: str, p: int, m: int, v: int | None = None) -> int:
    """Raise ``ScheduleError`` naming the parameter if (name, p, m, v) is not allowed; return v."""
    check_choice("schedule", name, SCHEDULES, error=ScheduleError)
    check_int("p", p, 1, error=ScheduleError)
    check_int("m", m, 1, error=ScheduleError)
    if name == "interleaved-1f1b":
        v = 2 if v is None else v
        check_int("v", v, 2, error=ScheduleError)
        if m % p:
            raise ScheduleError(f"interleaved-1f1b needs m to be a multiple of p (m % p == 0), got m={m}, p={p}")
    elif name in ("zbv", "dualpipe", "dualpipev"):
        if v not in (None, 2):
            raise ScheduleError(f"{name} places exactly 2 chunks per rank: v must be 2, got v={v}")
        v = 2
        if name == "dualpipe":
            if p % 2:
                raise ScheduleError(f"dualpipe needs an even number of ranks p, got p={p}")
            if m % 2 or m < 2 * p:
                raise ScheduleError(f"dualpipe needs m even and m >= 2p (= {2 * p}), got m={m}")
        if name == "dualpipev" and m < 2 * p:
            raise ScheduleError(f"dualpipev needs m >= 2p (= {2 * p} stages), got m={m}")
    else:
        if v not in (None, 1):
            raise ScheduleError(f"{name} has one chunk per rank: v must be 1, got v={v}")
        v = 1
    return v


def schedule(name: str, p: int, m: int, v: int | None = None) -> Schedule:
    """Build schedule ``name`` for ``p`` ranks and ``m`` micro-batches (``v`` chunks per rank).

    ``v=None`` means the schedule's own value (1; 2 for interleaved-1f1b, zbv, dualpipe(v)).
    Raises ``ScheduleError`` for a combination the schedule does not support.
    """
    v = check_args(name, p, m, v)
    with paused_gc():
        return _build(name, p, m, v)


def _build(name, p, m, v) -> Schedule:
    mb_path = [0] * m
    if name in ("gpipe", "1f1b", "zb-h1", "zb-h2"):
        n_stages, weight = p, 1.0
        placement = [[(s, 0) for s in range(p)]]
        gen = {
            "gpipe": lambda r: _gpipe(p, m, r),
            "1f1b": lambda r: _one_f_one_b(p, m, r),
            "zb-h1": lambda r: _zero_bubble(p, m, r, p - r - 1, r),
            "zb-h2": lambda r: _zero_bubble(p, m, r, 2 * (p - 1 - r), 2 * r),
        }[name]
        items = [gen(r) for r in range(p)]
    elif name == "interleaved-1f1b":
        n_stages, weight = p * v, 1.0 / v
        placement = [[(s % p, s // p) for s in range(n_stages)]]
        items = [_interleaved(p, m, v, r) for r in range(p)]
    elif name == "zbv":
        n_stages, weight = 2 * p, 0.5
        placement = [[(s, 0) if s < p else (2 * p - 1 - s, 1) for s in range(n_stages)]]
        items = [_zbv(p, m, r) for r in range(p)]
    elif name == "dualpipev":
        n_stages, weight = 2 * p, 0.5
        placement = [[(s, 0) if s < p else (2 * p - 1 - s, 1) for s in range(n_stages)]]
        items = [_phase_items(_dualpipe_rank(p, r, m), lambda ph, j: (ph, j)) for r in range(p)]
    else:  # dualpipe
        n_stages, weight, half = p, 1.0, m // 2
        placement = [[(s, 0) for s in range(p)], [(p - 1 - s, 1) for s in range(p)]]
        mb_path = [0] * half + [1] * half
        items = []
        for r in range(p):
            hr, lower = min(r, p - 1 - r), r < p // 2

            def to_dir(ph, j, lower=lower):  # phase -> (direction = chunk, global micro-batch)
                d = ph if lower else 1 - ph
                return d, j + d * half

            items.append(_phase_items(_dualpipe_rank(p // 2, hr, half), to_dir))

    stage_lookup = {}  # (path, rank, chunk) -> stage, avoids a scan per action
    for path, pl in enumerate(placement):
        for s, (rr, cc) in enumerate(pl):
            stage_lookup[(path, rr, cc)] = s
    make = tuple.__new__  # Action(...) without the keyword-handling frame: this loop sees every op
    compute = []
    for r in range(p):
        row = []
        one_path = len(placement) == 1
        by_chunk = {c: st for (path, rr, c), st in stage_lookup.items() if rr == r and path == 0}
        for it in items[r]:
            if it[0] == "FB":
                (_, fc, fj, _), (_, bc, bj, bfull) = it[1]
                fs = by_chunk[fc] if one_path else stage_lookup[(mb_path[fj], r, fc)]
                bs = by_chunk[bc] if one_path else stage_lookup[(mb_path[bj], r, bc)]
                fa = make(Action, ("F", fj, fc, fs, True, None, ()))
                ba = make(Action, ("B", bj, bc, bs, bfull, None, ()))
                row.append(make(Action, ("FB", fj, fc, fs, True, None, (fa, ba))))
            else:
                c, j = it[1], it[2]
                st = by_chunk[c] if one_path else stage_lookup[(mb_path[j], r, c)]
                row.append(make(Action, (it[0], j, c, st, it[3] if len(it) > 3 else True, None, ())))
        compute.append(row)
    split = any(a.kind == "W" for row in compute for a in row)
    return Schedule(name, p, m, v, n_stages, weight, compute, placement, mb_path, split)


def _phase_items(items, to_chunk_mb):
    """Map DualPipe phase items (kind, phase, j, full) to (kind, chunk, microbatch, full)."""
    out = []
    for it in items:
        if it[0] == "FB":
            (fk, fph, fj, ff), (bk, bph, bj, bf) = it[1]
            out.append(("FB", ((fk, *to_chunk_mb(fph, fj), ff), (bk, *to_chunk_mb(bph, bj), bf))))
        else:
            out.append((it[0], *to_chunk_mb(it[1], it[2]), it[3]))
    return out


# --------------------------------------------------------------------------------------------
# Dependencies, lowering to send/recv, validation
# --------------------------------------------------------------------------------------------
def dependency(sched: Schedule, kind: str, mb: int, stage: int):
    """The (kind, mb, stage) an op waits for, or None: F <- F of the previous stage; B <- B of the
    next stage (the last stage's B <- its own F, the loss); W <- its own B."""
    if kind == "F":
        return ("F", mb, stage - 1) if stage > 0 else None
    if kind == "B":
        return ("B", mb, stage + 1) if stage < sched.n_stages - 1 else ("F", mb, stage)
    return ("B", mb, stage)


def lower_to_comms(sched: Schedule, r: int) -> list[Action]:
    """Rank r's actions with a RECV before every op whose input comes from another rank and a
    SEND after every op whose output another rank needs."""
    out = []
    S = sched.n_stages
    for a in sched.compute[r]:
        parts = a.sub if a.kind == "FB" else (a,)
        for x in parts:
            dep = dependency(sched, x.kind, x.microbatch, x.stage) if x.kind in ("F", "B") else None
            if dep is not None and dep[0] == x.kind:
                src = sched.rank_of(x.microbatch, dep[2])
                if src != r:
                    out.append(Action("RECV_" + x.kind, x.microbatch, x.chunk, x.stage, True, src))
        out.append(a)
        for x in parts:
            nxt = x.stage + 1 if x.kind == "F" else x.stage - 1
            if x.kind in ("F", "B") and 0 <= nxt < S:
                dst = sched.rank_of(x.microbatch, nxt)
                if dst != r:
                    out.append(Action("SEND_" + x.kind, x.microbatch, x.chunk, x.stage, True, dst))
    return out


def validate(sched: Schedule) -> None:
    """Raise ``ScheduleError`` unless the schedule is complete, locally ordered and deadlock-free.

    Checks: every (micro-batch, stage) has one F and one B on the rank that holds the stage, and a W
    exactly when its B is input-gradient only; on every rank F before B before W; and running the
    lowered action lists with asynchronous sends and blocking receives finishes (no deadlock)."""
    seen = {}
    for r in range(sched.p):
        for pos, a in enumerate(sched.compute[r]):
            for x in a.sub if a.kind == "FB" else (a,):
                key = (x.kind, x.microbatch, x.stage)
                if key in seen:
                    raise ScheduleError(f"{sched.name}: {x} appears twice (rank {r})")
                if sched.rank_of(x.microbatch, x.stage) != r:
                    raise ScheduleError(f"{sched.name}: {x} runs on rank {r}, but stage {x.stage} lives elsewhere")
                seen[key] = (r, pos, x.full)
    for j in range(sched.m):
        for s in range(sched.n_stages):
            f, b = seen.get(("F", j, s)), seen.get(("B", j, s))
            if f is None or b is None:
                raise ScheduleError(f"{sched.name}: micro-batch {j} misses its F or B on stage {s}")
            w = seen.get(("W", j, s))
            if (w is None) != b[2]:
                raise ScheduleError(f"{sched.name}: micro-batch {j}, stage {s}: W present iff B is split")
            if not f[1] <= b[1] or (w is not None and not b[1] < w[1]):
                raise ScheduleError(f"{sched.name}: micro-batch {j}, stage {s}: order must be F, B, W")
    _check_no_deadlock(sched)


def _check_no_deadlock(sched: Schedule) -> None:
    """Run the lowered per-rank lists: SEND posts a message and continues, RECV waits for it, a
    compute op needs its same-rank dependency done. Fails if every rank is stuck."""
    acts = sched.actions
    ptr = [0] * sched.p
    posted, done = set(), set()
    remaining = sum(len(a) for a in acts)
    while remaining:
        progressed = False
        for r in range(sched.p):
            row = acts[r]
            while ptr[r] < len(row):
                a = row[ptr[r]]
                if a.kind.startswith("RECV"):
                    msg = (a.kind[-1], a.microbatch, a.stage, a.peer, r)
                    if msg not in posted:
                        break
                elif a.kind.startswith("SEND"):
                    nxt = a.stage + 1 if a.kind == "SEND_F" else a.stage - 1
                    posted.add((a.kind[-1], a.microbatch, nxt, r, a.peer))
                else:
                    parts = a.sub if a.kind == "FB" else (a,)
                    for x in parts:
                        dep = dependency(sched, x.kind, x.microbatch, x.stage)
                        if dep is not None and sched.rank_of(dep[1], dep[2]) == r and dep not in done:
                            raise ScheduleError(f"{sched.name}: rank {r} runs {x} before {dep} on the same rank")
                        done.add((x.kind, x.microbatch, x.stage))
                ptr[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(acts[r][ptr[r]]) for r in range(sched.p) if ptr[r] < len(acts[r])}
            raise ScheduleError(f"{sched.name}: deadlock, every rank waits: {stuck}")


def pair_orders_match(sched: Schedule) -> bool:
    """True if, for every ordered pair of ranks, the sender issues its messages in the order the
    receiver posts the matching receives. Needed by transports that match point-to-point messages
    in order (NCCL); gloo matches by tag, which the executor uses, so it runs every schedule."""
    for src in range(sched.p):
        for dst in range(sched.p):
            sent = [
                (a.kind[-1], a.microbatch, a.stage + (1 if a.kind == "SEND_F" else -1))
                for a in sched.actions[src]
                if a.kind.startswith("SEND") and a.peer == dst
            ]
            got = [
                (a.kind[-1], a.microbatch, a.stage)
                for a in sched.actions[dst]
                if a.kind.startswith("RECV") and a.peer == src
            ]
            if sent != got:
                return False
    return True
