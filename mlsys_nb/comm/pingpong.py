"""Fit α, β from point-to-point ping-pong, then predict collectives from their step counts.

The honest test of an α-β model: fit it on one kind of measurement and predict another. Here the
fit sees only **ping-pong** between two ranks (rank 0 sends S bytes, rank 1 sends them back; the
one-way time is half the round trip, ``T = α + S/β``) at small sizes, plus a **local reduction**
cost γ (seconds per byte of ``a += b``, timed inside a rank). The prediction is for collectives
the fit never saw, at sizes 4-16x larger than any fitted size, from the algorithm's coefficients
(``mlsys_nb.comm.cost.cost_coefficients``, Thakur et al. 2005):

    all_reduce (ring):  2(n-1)·α + 2(n-1)/n·S/β + (n-1)/n·S·γ   (the reduce-scatter half reduces)
    all_gather (ring):  (n-1)·α + (n-1)/n·S/β + S·δ               (δ: gloo's flat-buffer copy, below)

PyTorch's gloo backend gathers into a newly allocated flat buffer of S bytes and then copies it into
the output tensor (``ProcessGroupGloo``'s all-gather): local work no step count sees. ``δ`` is its
measured cost per byte of output: a fresh S-byte buffer written, then copied out (``copy_s`` below).

``measure`` is the rank function (two or more ranks; ping-pong between ranks 0 and 1); ``predict``
and ``fit_ping_pong`` are pure functions over its numbers.
"""

from __future__ import annotations

import numpy as np

from ..config import check_int, check_multiple, check_number
from ..runtime.timing import ATTEMPTS, Timer, lower_quartile
from .cost import cost_coefficients, fit_alpha_beta


REDUCES = {"all_reduce": True, "all_gather": False, "reduce_scatter": True}


def measure(
    fit_sizes,
    predict_sizes,
    ops=("all_reduce", "all_gather"),
    repeats: int = 7,
    warmup: int = 2,
    pool_bytes: int = 32 << 20,
) -> dict:
    """Rank function. Lower quartile of ``repeats`` (seconds) of: one-way ping-pong time and two-way exchange
    time per ``fit_sizes`` (ranks 0-1), ``a += b`` per ``predict_sizes`` and each op per
    ``predict_sizes`` (the slowest rank's time per call), and the flat-buffer copy the gloo all-gather
    does (a fresh buffer of S bytes written, then copied into the output) per ``predict_sizes``.
    Sizes in bytes (multiples of 4 x world size).
    Rounds are interleaved, so load from other processes hits fit and prediction alike.

    Point-to-point messages are sent from (and received into) the next slice of a ``pool_bytes`` pool
    (default 32 MiB, larger than a core's L2 cache), never the same buffer twice in a row: a
    collective of several MiB streams its data from memory, and a fit on one hot buffer would measure
    the cache instead (about 25 % optimistic on this machine's 4 MiB L2). ``pool_bytes=0`` re-sends
    one buffer per size."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    for s in list(fit_sizes) + list(predict_sizes):
        check_multiple("size (bytes) in fit_sizes/predict_sizes", s, 4 * n, "4 x world_size")
    bufs = {s: torch.ones(s // 4) for s in set(fit_sizes) | set(predict_sizes)}
    outs = {s: torch.empty(s // 4) for s in predict_sizes}
    chunks = {s: torch.ones(s // 4 // n) for s in predict_sizes}
    other = {s: torch.ones(s // 4) for s in predict_sizes}
    inbox = {s: torch.empty(s // 4) for s in fit_sizes}
    pool = torch.ones(max(pool_bytes, 0) // 4)
    pool_in = torch.zeros(max(pool_bytes, 0) // 4)  # written now: no page faults inside the timed receives
    cursor = [0]

    def fresh(s):  # next s bytes of the pool: a buffer not touched recently (cold caches, like a big collective)
        if not len(pool) or s // 4 > len(pool):
            return bufs[s], inbox.get(s)
        if cursor[0] + s // 4 > len(pool):
            cursor[0] = 0
        i = cursor[0]
        cursor[0] += s // 4
        return pool[i : i + s // 4], pool_in[i : i + s // 4]

    def ping(s):
        b = fresh(s)[0]
        if rank == 0:
            dist.send(b, 1)
            dist.recv(b, 1)
        elif rank == 1:
            dist.recv(b, 0)
            dist.send(b, 0)

    def exchange(s):  # one ring step at n = 2: both ranks send and receive at once
        if rank > 1:
            return
        peer = 1 - rank
        out, inn = fresh(s)
        works = [dist.isend(out, peer), dist.irecv(inn, peer)]
        for w in works:
            w.wait()

    def collective(op, s):
        if op == "all_reduce":
            dist.all_reduce(bufs[s])
        elif op == "all_gather":
            dist.all_gather_into_tensor(outs[s], chunks[s])
        else:
            dist.reduce_scatter_tensor(chunks[s], bufs[s])

    def flat_copy(s):  # what gloo's all-gather adds: a new flat S-byte buffer written, then copied out
        outs[s].copy_(torch.empty(s // 4).fill_(1.0))

    def timed(fn, *args) -> float:
        dist.barrier()
        with Timer() as t:
            fn(*args)
        dt = torch.tensor([t.seconds], dtype=torch.float64)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)  # the slowest rank's time
        return float(dt.item())

    cases = (
        [("ping", s) for s in fit_sizes]
        + [("exchange", s) for s in fit_sizes]
        + [("reduce", s) for s in predict_sizes]
        + [("copy", s) for s in predict_sizes]
        + [(op, s) for op in ops for s in predict_sizes]
    )
    times: dict = {c: [] for c in cases}
    for r in range(warmup + repeats):
        for kind, s in cases:
            if kind == "ping":
                t = timed(ping, s) / 2  # one way
            elif kind == "exchange":
                t = timed(exchange, s)
            elif kind == "reduce":
                t = timed(bufs[s].add_, other[s])
            elif kind == "copy":
                t = timed(flat_copy, s)
            else:
                t = timed(collective, kind, s)
            if r >= warmup:
                times[(kind, s)].append(t)
    # the lower quartile of the repeats, for the fit and the prediction alike: other load only adds
    # time, so the low end is the machine's own cost, and a quartile does not hang on one lucky repeat
    # (the fastest small exchange is a scheduling of both ranks a long collective never gets)
    med = {c: lower_quartile(v) for c, v in times.items()}
    return dict(
        n=n,
        fit_sizes=list(fit_sizes),
        predict_sizes=list(predict_sizes),
        ops=list(ops),
        one_way_s=[med[("ping", s)] for s in fit_sizes],
        exchange_s=[med[("exchange", s)] for s in fit_sizes],
        reduce_s=[med[("reduce", s)] for s in predict_sizes],
        copy_s=[med[("copy", s)] for s in predict_sizes],
        collective_s={op: [med[(op, s)] for s in predict_sizes] for op in ops},
    )


def fit_ping_pong(sizes, one_way_s):
    """α (s), β (B/s) of ``T = α + S/β`` fitted to one-way times (relative least squares)."""
    return fit_alpha_beta(sizes, one_way_s, "broadcast", 2, "pipelined_chain")  # coefficients (1, 1) at n = 2


def gamma_per_byte(sizes, reduce_s) -> float:
    """Seconds per byte of a local operation timed inside a rank: the median of ``t / S``. Notebook 04
    uses it for γ (``a += b``, per byte of the reduced tensor, ``reduce_s``) and for δ (the all-gather's
    flat-buffer copy, per byte of output, ``copy_s``)."""
    return float(np.median(np.asarray(reduce_s) / np.asarray(sizes, dtype=float)))


def predict(
    op: str,
    nbytes,
    n: int,
    alpha_s: float,
    beta_bytes_per_s: float,
    gamma_s_per_byte: float,
    algorithm: str = "ring",
    copy_s_per_byte: float = 0.0,
):
    """Seconds of ``op`` on ``n`` ranks from the algorithm's coefficients: ``k_α·α + k_β·S/β`` plus,
    for reducing ops, the local reductions: the ring reduce-scatter (alone or inside all_reduce)
    adds ``(n-1)/n`` of S, tree-like all_reduce algorithms ``k_β / 2`` of S (half their traffic is the
    reduce phase). For all_gather, ``copy_s_per_byte`` (δ, seconds per byte of output) adds the
    backend's copy out of its flat buffer, ``S·δ`` (0: the pure α-β model)."""
    check_number("copy_s_per_byte", copy_s_per_byte, 0, unit="seconds per byte")
    ka, kb = cost_coefficients(op, algorithm, n)
    s = np.asarray(nbytes, dtype=float)
    kg = 0.0
    if REDUCES.get(op):
        kg = (n - 1) / n if algorithm in ("ring", "rabenseifner") or op == "reduce_scatter" else kb / 2
    kc = 1.0 if op == "all_gather" else 0.0
    return ka * alpha_s + kb * s / beta_bytes_per_s + kg * s * gamma_s_per_byte + kc * s * copy_s_per_byte


# ----------------------------------------------------------------------------- what 2 ranks can tell apart
ALL_REDUCE_MODELS = ("ring", "recursive_doubling", "rabenseifner", "binomial_tree", "tree")


def prediction_rows(pp: dict) -> list[dict]:
    """Every model's prediction of ``measure``'s collectives (``pp``) from its own exchange fit, γ and δ.

    One row per (op, model, size): ``op``, ``model`` (an all-reduce algorithm of ``ALL_REDUCE_MODELS``;
    for all_gather ``"ring"``, the pure α-β model, or ``"ring + copy"``, with δ), ``k_beta`` (the
    bandwidth coefficient at ``pp["n"]`` ranks), ``bytes``, ``measured_s``, ``predicted_s`` and
    ``signed_error`` ((predicted - measured) / measured: negative = the model is too fast)."""
    n = pp["n"]
    fit = fit_ping_pong(pp["fit_sizes"], pp["exchange_s"])
    gamma = gamma_per_byte(pp["predict_sizes"], pp["reduce_s"])
    delta = gamma_per_byte(pp["predict_sizes"], pp["copy_s"])
    models = [("all_reduce", alg, alg, 0.0) for alg in ALL_REDUCE_MODELS]
    models += [("all_gather", "ring", "ring", 0.0), ("all_gather", "ring", "ring + copy", delta)]
    rows = []
    for op, alg, name, d in models:
        if op not in pp["collective_s"]:
            continue
        pred = predict(op, pp["predict_sizes"], n, fit.alpha_s, fit.beta_bytes_per_s, gamma, alg, d)
        for s, m, p in zip(pp["predict_sizes"], pp["collective_s"][op], pred):
            rows.append(
                dict(
                    op=op,
                    model=name,
                    k_beta=cost_coefficients(op, alg, n)[1],
                    bytes=int(s),
                    measured_s=float(m),
                    predicted_s=float(p),
                    signed_error=float((p - m) / m),
                )
            )
    return rows


def median_errors(rows) -> dict:
    """``{(op, model): median |relative error|}`` over the sizes of :func:`prediction_rows`, and
    ``{(op, model, "signed"): median signed error}``."""
    out: dict = {}
    keys = sorted({(r["op"], r["model"]) for r in rows})
    for k in keys:
        e = [r["signed_error"] for r in rows if (r["op"], r["model"]) == k]
        out[k] = float(np.median(np.abs(e)))
        out[k + ("signed",)] = float(np.median(e))
    return out


def check_all_reduce_class(rows, bound: float) -> tuple[float, float]:
    """The all-reduce check of notebook 04 at 2 ranks: the ring's prediction (a model that moves ``S``
    per rank, k_β = 1; Rabenseifner's is the same at n = 2, recursive doubling's one α less) is within
    ``bound`` (median relative error), and every model that moves ``2S`` (binomial tree, pipelined
    tree) misses it. Raises ``AssertionError`` otherwise; returns (ring's error, the best 2S model's
    error). It tells the bandwidth class apart, not the algorithms inside one class."""
    err = median_errors(rows)
    ar = {r["model"]: r["k_beta"] for r in rows if r["op"] == "all_reduce"}
    two = [m for m, kb in ar.items() if kb > ar["ring"]]
    if not two:
        raise ValueError("no model moves more bytes than the ring at this world size: nothing to tell apart")
    ring = err[("all_reduce", "ring")]
    assert ring <= bound, f"the ring all-reduce prediction misses by {ring:.0%} (> {bound:.0%})"
    best_two = min(err[("all_reduce", m)] for m in two)
    assert best_two > bound, (
        f"a model that moves {ar[min(two, key=lambda m: err[('all_reduce', m)])]:.0f}·S per rank is within "
        f"{best_two:.0%}: the check cannot tell the bandwidth classes apart"
    )
    return ring, best_two


def copy_share_of_gap(rows) -> float:
    """The share of the pure α-β model's all-gather shortfall that the flat-buffer copy δ accounts for:
    the median over sizes of ``S·δ / (measured - pure prediction)`` (1: δ explains all of it, 0: none;
    negative or above 1 when the pure model is not too fast)."""
    pure = {r["bytes"]: r for r in rows if (r["op"], r["model"]) == ("all_gather", "ring")}
    copy = {r["bytes"]: r for r in rows if (r["op"], r["model"]) == ("all_gather", "ring + copy")}
    shares = [
        (copy[s]["predicted_s"] - pure[s]["predicted_s"]) / (pure[s]["measured_s"] - pure[s]["predicted_s"])
        for s in sorted(pure)
    ]
    return float(np.median(shares))


def check_all_gather(rows, shortfall: float, min_share: float) -> tuple[float, float]:
    """The all-gather claims of notebook 04, each one the data can refute. Raises ``AssertionError``
    unless (1) the pure α-β model (the ring's step count) is too fast by more than ``shortfall`` (median
    signed error below ``-shortfall``): gloo's all-gather does work no step count sees; and (2) the
    separately measured flat-buffer copy δ accounts for at least ``min_share`` of that gap without
    overshooting it (the model with δ is closer than the one without). Returns (the pure model's median
    signed error, δ's share of the gap)."""
    err = median_errors(rows)
    pure, with_copy = err[("all_gather", "ring", "signed")], err[("all_gather", "ring + copy", "signed")]
    assert pure < -shortfall, (
        f"the pure α-β model predicts gloo's all-gather within {pure:+.0%} (not too fast by more than "
        f"{shortfall:.0%}): no missing local work to explain"
    )
    share = copy_share_of_gap(rows)
    assert min_share <= share and abs(with_copy) < abs(pure), (
        f"the flat-buffer copy δ accounts for {share:.0%} of the all-gather's shortfall (at least {min_share:.0%} "
        f"claimed; with δ the error is {with_copy:+.0%}, without {pure:+.0%})"
    )
    return pure, share


def check_claims(rows, stated_error: float, min_copy_share: float) -> dict:
    """Notebook 04's three claims on one measurement (:func:`check_all_reduce_class`, then
    :func:`check_all_gather` with the all-reduce's bound as the shortfall): ``{"ring", "two_s",
    "all_gather_pure", "copy_share"}``, or ``AssertionError`` naming the first claim that fails."""
    ring, two = check_all_reduce_class(rows, stated_error)
    pure, share = check_all_gather(rows, stated_error, min_copy_share)
    return dict(ring=ring, two_s=two, all_gather_pure=pure, copy_share=share)


def measure_and_check(run, check, attempts: int = ATTEMPTS, first=None):
    """Re-measure on a shared machine: ``check(run())`` up to ``attempts`` times, stopping at the first
    measurement that passes (``first``, if given, is a measurement already made: the first attempt).
    Returns ``(measurement, check's result, failures)``, ``failures`` being the messages of the attempts
    that failed. If none passes, raises ``AssertionError`` naming every attempt's failure and the load
    average. A claim that is wrong fails every attempt (``tests/test_pingpong.py``); one disturbed by a
    neighbour's load usually passes the next."""
    import os

    check_int("attempts", attempts, 1, 10)
    failures = []
    for k in range(attempts):
        m = first if (k == 0 and first is not None) else run()
        try:
            return m, check(m), failures
        except AssertionError as e:
            failures.append(str(e))
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    raise AssertionError(
        f"all {attempts} attempts failed (load average {load:.1f}): "
        + "; ".join(f"[{i + 1}] {f}" for i, f in enumerate(failures))
    )
