"""The cost of communication: closed-form bytes, α-β time models, algbw/busbw and fits.

Conventions (sources: docs/references.md#nccl-tests, #thakur2005, #patarasuk2009):

- ``nbytes`` (``S``) is the size nccl-tests uses: the tensor for all_reduce/broadcast/reduce, the
  **full** array for all_gather (output) and reduce_scatter (input), one rank's send buffer for
  all_to_all.
- α-β model (Thakur, Rabenseifner & Gropp 2005): ``T = k_alpha(n) * alpha + k_beta(n) * S / beta`` with ``alpha`` the
  per-message latency (seconds) and ``beta`` the per-direction link bandwidth (bytes/s);
  :func:`cost_coefficients` gives ``(k_alpha, k_beta)`` per op and algorithm.
- ``algbw = S / t``, ``busbw = algbw * busbw_factor(op, n)`` (nccl-tests ``doc/PERFORMANCE.md``); busbw approaches the
  link
  rate whatever the op and world size.

Pure functions (no processes): :func:`busbw_factor`, :func:`algbw`, :func:`busbw`,
:func:`ring_bytes_sent`, :func:`tree_bytes_sent`, :func:`recursive_doubling_bytes_sent`,
:func:`bytes_sent_per_rank`, :func:`gloo_bytes_sent`, :func:`cost_coefficients`, :func:`collective_time`,
:func:`fit_alpha_beta`, :func:`crossover_bytes`, :class:`AlphaBeta`.
What they are fitted to and checked against is measured in ``comm/measure.py`` (``memcpy_bandwidth`` in this
process, ``sweep`` on real ranks); this module imports no timer and starts no process.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from ..config import check_choice, check_int, check_number


OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce")
ALGORITHMS = {
    "all_reduce": ("ring", "tree", "binomial_tree", "recursive_doubling", "rabenseifner"),
    "all_gather": ("ring", "recursive_doubling"),
    "reduce_scatter": ("ring", "recursive_halving"),
    "all_to_all": ("pairwise",),
    "broadcast": ("binomial_tree", "pipelined_chain"),
    "reduce": ("binomial_tree", "pipelined_chain"),
}


def _check_n(n) -> int:
    return check_int("n (world size)", n, 1)


def _check_op(op: str) -> str:
    return check_choice("op", op, OPS)


def _log2ceil(n: int) -> int:
    return (n - 1).bit_length()  # ceil(log2 n) for n >= 1


# ----------------------------------------------------------------------------- busbw (nccl-tests)
def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' bus-bandwidth factor: ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for all_gather,
    reduce_scatter and all_to_all, ``1`` for broadcast and reduce."""
    _check_op(op)
    n = _check_n(n)
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw(nbytes: float, seconds: float) -> float:
    """Algorithm bandwidth ``S / t`` in bytes/s (S as in nccl-tests: see the module docstring)."""
    check_number("seconds", seconds, 0, lo_open=True)
    return nbytes / seconds


def busbw(op: str, nbytes: float, seconds: float, n: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw * busbw_factor(op, n)``."""
    return algbw(nbytes, seconds) * busbw_factor(op, n)


# ----------------------------------------------------------------------------- bytes per rank
def _chunk_sizes(numel: int, n: int) -> list[int]:
    base, extra = divmod(int(numel), n)
    return [base + (1 if i < extra else 0) for i in range(n)]


def ring_bytes_sent(op: str, numel: int, n: int, rank: int, element_size: int = 4) -> int:
    """Exact bytes rank ``rank`` sends in the ring algorithms of ``mlsys_nb.comm.collectives`` for a
    tensor of ``numel`` elements (chunks cut like ``torch.tensor_split``).

    all_reduce: every chunk but its own in the reduce-scatter phase and every chunk but chunk
    ``rank+1`` in the all-gather phase: ``(numel - c_r) + (numel - c_{r+1})`` elements, which is
    ``2(n-1)/n * numel`` when ``n`` divides ``numel``. reduce_scatter (``numel`` = full input):
    ``numel - c_r``. all_gather (``numel`` = full output): every chunk but chunk ``rank+1``,
    ``numel - c_{r+1}``. Both are ``(n-1)/n * numel`` when ``n`` divides ``numel``.
    """
    n = _check_n(n)
    check_int("rank", rank, 0, n - 1)
    c = _chunk_sizes(numel, n)
    if n == 1:
        return 0
    if op == "all_reduce":
        return (2 * numel - c[rank] - c[(rank + 1) % n]) * element_size
    if op == "reduce_scatter":
        return (numel - c[rank]) * element_size
    if op == "all_gather":
        return (numel - c[(rank + 1) % n]) * element_size
    raise ValueError(f"op={op!r}: the ring is defined here for all_reduce, reduce_scatter, all_gather")


def _tree_children(vr: int, n: int) -> int:
    low = vr & -vr if vr else 1 << _log2ceil(n)
    return sum(1 for k in range(_log2ceil(n) + 1) if (1 << k) < low and vr + (1 << k) < n)


def tree_bytes_sent(nbytes: int, n: int, rank: int, root: int = 0, phase: str = "all_reduce") -> int:
    """Exact bytes ``rank`` sends in the binomial tree: the whole tensor once to its parent in the
    reduce (not the root), and once to each child in the broadcast. ``phase``: ``"reduce"``,
    ``"broadcast"`` or ``"all_reduce"`` (both). Summed over ranks each phase moves ``(n-1) S``."""
    n = _check_n(n)
    vr = (rank - root) % n
    up = nbytes if vr != 0 else 0
    down = nbytes * _tree_children(vr, n)
    return {"reduce": up, "broadcast": down, "all_reduce": up + down}[phase]


def recursive_doubling_bytes_sent(nbytes: int, n: int, rank: int) -> int:
    """Exact bytes ``rank`` sends in recursive doubling: ``log2(p)·S`` for the ``p`` (largest power
    of two <= n) active ranks; with ``rem = n - p``, even ranks below ``2·rem`` send ``S`` once
    (fold) and odd ones send ``S`` once more (unfold)."""
    n = _check_n(n)
    p = 1 << (n.bit_length() - 1)
    rem = n - p
    steps = p.bit_length() - 1
    if rank < 2 * rem:
        return nbytes if rank % 2 == 0 else (steps + 1) * nbytes
    return steps * nbytes


def bytes_sent_per_rank(op: str, nbytes: float, n: int, algorithm: str = "ring") -> float:
    """The textbook per-rank volume (Patarasuk & Yuan 2009; Thakur et al. 2005): ring all_reduce ``2(n-1)/n·S``; ring
    all_gather / reduce_scatter and pairwise all_to_all ``(n-1)/n·S``; recursive doubling
    all_reduce ``log2(n)·S`` (n a power of two); broadcast/reduce ≈ ``S`` (pipelined chain)."""
    _check_op(op)
    n = _check_n(n)
    if op == "all_reduce" and algorithm in ("ring", "rabenseifner"):
        return 2 * (n - 1) / n * nbytes
    if op == "all_reduce" and algorithm == "recursive_doubling":
        return math.log2(n) * nbytes
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n * nbytes
    if op in ("broadcast", "reduce") and algorithm == "pipelined_chain":
        return float(nbytes)
    raise ValueError(
        f"no single per-rank volume for op={op!r}, algorithm={algorithm!r} "
        "(the tree's differs per rank: use tree_bytes_sent)"
    )


def _gloo_broadcast_children(vr: int, n: int) -> int:
    # gloo's binomial broadcast: virtual rank vr sends to vr + 2^k for every 2^k > vr with vr + 2^k < n
    return sum(1 for k in range(max(n - 1, 1).bit_length()) if (1 << k) > vr and vr + (1 << k) < n)


def gloo_bytes_sent(op: str, nbytes: float, n: int, rank: int, root: int = 0) -> float:
    """Bytes rank ``rank`` sends in gloo's CPU algorithms (``nbytes`` = S as in :func:`busbw_factor`).

    Measured on the wire with ``mlsys_nb.comm.wire`` (tests pin every line): all_reduce is the ring,
    ``2(n-1)/n·S``; **reduce_scatter is an all_reduce followed by a local slice**, ``2(n-1)/n·S`` (twice
    the ring's ``(n-1)/n·S``); all_gather the ring, ``(n-1)/n·S``; all_to_all pairwise, ``(n-1)/n·S``;
    broadcast a binomial tree in which virtual rank ``v`` sends S to ``v + 2^k`` for every ``2^k > v``
    (the root ``⌈log2 n⌉·S``, leaves nothing); reduce a ring reduce-scatter then a gather of the
    chunks to the root: ``(n-1)/n·S`` on the root, ``S`` on every other rank.
    """
    _check_op(op)
    n = _check_n(n)
    check_int("rank", rank, 0, n - 1)
    if n == 1:
        return 0.0
    ring = (n - 1) / n * nbytes
    if op in ("all_reduce", "reduce_scatter"):
        return 2 * ring
    if op in ("all_gather", "all_to_all"):
        return ring
    vr = (rank - root) % n
    if op == "broadcast":
        return float(nbytes * _gloo_broadcast_children(vr, n))
    return ring if vr == 0 else float(nbytes)  # reduce


# ----------------------------------------------------------------------------- α-β model (Thakur 2005)
def cost_coefficients(op: str, algorithm: str, n: int) -> tuple[float, float]:
    """``(k_alpha, k_beta)`` with ``T = k_alpha·α + k_beta·S/β``.

    all_reduce: ring ``(2(n-1), 2(n-1)/n)``; tree (pipelined, NCCL-like) ``(2⌈log2 n⌉, 2)``;
    binomial_tree (unpipelined reduce + broadcast) ``(2⌈log2 n⌉, 2⌈log2 n⌉)``;
    recursive_doubling ``(L, L)`` with ``L = log2 p + 2·[n != p]`` (``p`` = largest power of two
    <= n: fold and unfold cost one extra step each); rabenseifner (recursive halving + doubling)
    ``(2⌈log2 n⌉, 2(n-1)/n)``. all_gather / reduce_scatter: ring ``(n-1, (n-1)/n)``, recursive
    doubling / halving ``(⌈log2 n⌉, (n-1)/n)``. all_to_all pairwise ``(n-1, (n-1)/n)``.
    broadcast / reduce: binomial_tree ``(⌈log2 n⌉, ⌈log2 n⌉)``, pipelined_chain (many pieces)
    ``(n-1, 1)``.
    """
    _check_op(op)
    n = _check_n(n)
    if algorithm not in ALGORITHMS[op]:
        raise ValueError(f"algorithm={algorithm!r} is not modelled for {op}: choose one of {list(ALGORITHMS[op])}")
    lg = _log2ceil(n)
    ring = (n - 1) / n
    if op == "all_reduce":
        if algorithm == "ring":
            return 2.0 * (n - 1), 2 * ring
        if algorithm == "tree":
            return 2.0 * lg, 2.0
        if algorithm == "binomial_tree":
            return 2.0 * lg, 2.0 * lg
        if algorithm == "recursive_doubling":
            p = 1 << (n.bit_length() - 1)
            steps = (p.bit_length() - 1) + (2 if p != n else 0)
            return float(steps), float(steps)
        return 2.0 * lg, 2 * ring  # rabenseifner
    if op in ("all_gather", "reduce_scatter"):
        return (float(n - 1), ring) if algorithm == "ring" else (float(lg), ring)
    if op == "all_to_all":
        return float(n - 1), ring
    return (float(lg), float(lg)) if algorithm == "binomial_tree" else (float(n - 1), 1.0)


def collective_time(op: str, nbytes: float, n: int, alpha: float, beta: float, algorithm: str = "ring") -> float:
    """Predicted seconds for one collective: ``k_alpha·alpha + k_beta·nbytes/beta``.
    ``alpha`` in seconds per message, ``beta`` in bytes/s per direction."""
    check_number("alpha", alpha, 0, unit="seconds")
    check_number("beta", beta, 0, lo_open=True, unit="bytes/s")
    check_number("nbytes", nbytes, 0)
    ka, kb = cost_coefficients(op, algorithm, n)
    return ka * alpha + kb * nbytes / beta


@dataclass(frozen=True)
class AlphaBeta:
    """A link in the α-β model: ``alpha_s`` (seconds per message), ``beta_bytes_per_s``."""

    alpha_s: float
    beta_bytes_per_s: float

    @classmethod
    def from_link(cls, name: str) -> AlphaBeta:
        """From ``data/hardware.yaml``: its latency and per-direction bandwidth."""
        from ..hardware import link

        ln = link(name)
        return cls(ln.latency_s, ln.per_direction_bytes_per_s)

    def time(self, op: str, nbytes, n: int, algorithm: str = "ring"):
        """Seconds (array-friendly in ``nbytes``)."""
        ka, kb = cost_coefficients(op, algorithm, n)
        return ka * self.alpha_s + kb * np.asarray(nbytes, dtype=float) / self.beta_bytes_per_s


def crossover_bytes(
    n: int, alpha: float, beta: float, op: str = "all_reduce", a: str = "ring", b: str = "tree"
) -> float | None:
    """Message size (bytes) where algorithms ``a`` and ``b`` take equal time, or ``None`` if one is
    faster (or equal) at every size. Ring vs pipelined tree all-reduce: ``S* = n(n-1-⌈log2 n⌉)αβ``;
    the tree wins below ``S*``, the ring above."""
    ka_a, kb_a = cost_coefficients(op, a, n)
    ka_b, kb_b = cost_coefficients(op, b, n)
    if kb_a == kb_b:
        return None
    s = (ka_a - ka_b) * alpha * beta / (kb_b - kb_a)
    return s if s > 0 else None


@dataclass(frozen=True)
class AlphaBetaFit:
    """Result of :func:`fit_alpha_beta`; ``model`` predicts seconds for any size."""

    alpha_s: float
    beta_bytes_per_s: float
    op: str
    algorithm: str
    n: int
    max_rel_error: float  # on the points it was fitted to
    median_rel_error: float

    @property
    def model(self) -> AlphaBeta:
        return AlphaBeta(self.alpha_s, self.beta_bytes_per_s)

    def predict(self, nbytes):
        return self.model.time(self.op, nbytes, self.n, self.algorithm)

    def rel_error(self, nbytes, seconds) -> np.ndarray:
        """``|predicted - measured| / measured`` per point."""
        seconds = np.asarray(seconds, dtype=float)
        return np.abs(self.predict(nbytes) - seconds) / seconds

    def to_dict(self) -> dict:
        return asdict(self)


def fit_alpha_beta(nbytes, seconds, op: str = "all_reduce", n: int = 2, algorithm: str = "ring") -> AlphaBetaFit:
    """Fit α (s) and β (B/s) of ``T = k_alpha·α + k_beta·S/β`` to measured ``(nbytes, seconds)``.

    Minimises the squared *relative* error (sizes span decades, so absolute least squares would
    ignore the small messages) with α >= 0 and 1/β >= 0 (non-negative least squares).
    Needs at least two distinct sizes."""
    from scipy.optimize import nnls

    s = np.asarray(nbytes, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if s.shape != t.shape or s.ndim != 1 or len(np.unique(s)) < 2:
        raise ValueError("nbytes and seconds must be 1-D, the same length, with >= 2 distinct sizes")
    if np.any(t <= 0):
        raise ValueError("seconds must all be > 0")
    ka, kb = cost_coefficients(op, algorithm, n)
    design = np.stack([np.full_like(s, ka), kb * s], axis=1) / t[:, None]
    (alpha, inv_beta), _ = nnls(design, np.ones_like(t))
    beta = 1.0 / inv_beta if inv_beta > 0 else math.inf
    fit = AlphaBetaFit(float(alpha), float(beta), op, algorithm, int(n), 0.0, 0.0)
    err = fit.rel_error(s, t)
    return AlphaBetaFit(float(alpha), float(beta), op, algorithm, int(n), float(err.max()), float(np.median(err)))
