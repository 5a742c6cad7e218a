"""Families of the topic ``data_parallel``: DDP and ZeRO traffic per step, the gradient all-reduce,
bucketing.

Answer keys: ``zero_bytes_per_step`` (from ``comm.bytes_sent_per_rank``) and ``comm.collective_time``.
"""

from __future__ import annotations

from ... import comm
from ..core import family
from ._util import MB, gbps, pick, ratio_family, us
from .comm import REF_COMM, link

REF_ZERO = "docs/references.md#zero (Rajbhandari et al. 2020, arXiv:1910.02054, §7), #pytorch-ddp"
SEC_ZERO = "notebooks/06_zero_and_fsdp.ipynb, §5 ZeRO-3 (FSDP): shard the parameters too"


def zero_bytes_per_step(n_params: float, n: int, zero: int, dtype_bytes: float = 2) -> float:
    """Bytes one rank sends per step (ring algorithms) from ``comm.bytes_sent_per_rank``: DDP and
    ZeRO-1/2 = one all-reduce (or reduce-scatter + all-gather) of the gradients; ZeRO-3 adds a second
    all-gather of the parameters (forward and backward)."""
    s = n_params * dtype_bytes
    rs = comm.bytes_sent_per_rank("reduce_scatter", s, n)
    ag = comm.bytes_sent_per_rank("all_gather", s, n)
    if zero == 0:
        return comm.bytes_sent_per_rank("all_reduce", s, n)
    if zero in (1, 2):
        return rs + ag
    return rs + 2 * ag


@family(
    "data_parallel.ddp_bytes_per_step",
    "data_parallel",
    section="notebooks/05_data_parallelism.ipynb, §2 Naive DDP: one all-reduce per parameter",
    reference=REF_ZERO,
)
def _ddp_bytes(rng):
    n_params = pick(rng, [125e6, 350e6, 1.3e9, 7e9])
    n = pick(rng, [2, 4, 8, 16, 64])
    b = zero_bytes_per_step(n_params, n, 0)
    return dict(
        text=f"DDP over {n} ranks, {n_params:.3g} parameters, bf16 gradients, ring all-reduce: bytes each "
        f"rank sends per step?",
        params={"n_params": n_params, "n": n},
        answer=b,
        unit="bytes",
        hints=["Gradient bytes S = 2·N.", "Ring all-reduce sends 2(n−1)/n·S per rank."],
        solution=[
            f"S = 2 × {n_params:.4g} = {2 * n_params:.4g} B.",
            f"2(n−1)/n·S = {b:.4g} B (comm.bytes_sent_per_rank).",
        ],
        diagnostics=[
            (0.5, "did you count only the reduce-scatter half of the all-reduce?"),
            (2.0, "gradients are bf16 (2 B), not fp32"),
        ],
    )


@family("data_parallel.zero_bytes_per_step", "data_parallel", difficulty=2, section=SEC_ZERO, reference=REF_ZERO)
def _zero_bytes(rng):
    n_params = pick(rng, [1.3e9, 7e9, 13e9, 70e9])
    n = pick(rng, [8, 16, 64, 256])
    z = pick(rng, [1, 2, 3])
    b = zero_bytes_per_step(n_params, n, z)
    return dict(
        text=f"ZeRO stage {z} over {n} ranks, {n_params:.3g} bf16 parameters and gradients, ring collectives: "
        f"bytes each rank sends per training step?",
        params={"n_params": n_params, "n": n, "zero": z},
        answer=b,
        unit="bytes",
        hints=[
            "Stages 1-2: reduce-scatter the gradients, all-gather the updated parameters.",
            "Stage 3 gathers the parameters twice (forward and backward): 3 × (n−1)/n × 2N.",
        ],
        solution=[
            f"Each collective sends (n−1)/n × 2N = {comm.bytes_sent_per_rank('all_gather', 2 * n_params, n):.4g} B.",
            f"Stage {z}: {2 if z < 3 else 3} collectives = {b:.4g} B.",
        ],
        diagnostics=[
            (
                zero_bytes_per_step(n_params, n, 3) / b if z < 3 else 2 / 3,
                "ZeRO-1/2 move the same bytes as DDP; only stage 3 adds a parameter all-gather"
                if z < 3
                else "stage 3 adds the backward all-gather: 3 collectives",
            )
        ],
    )


ratio_family(
    "data_parallel.zero3_vs_ddp_traffic",
    "data_parallel",
    section=SEC_ZERO,
    reference=REF_ZERO,
    draw=lambda rng: {"n": pick(rng, [4, 8, 16, 64, 512]), "n_params": pick(rng, [1e9, 7e9, 70e9])},
    calc=lambda p, zero: zero_bytes_per_step(p["n_params"], p["n"], zero),
    over=dict(zero=3),
    under=dict(zero=0),
    text=lambda p: (
        f"By what factor does ZeRO-3 multiply the bytes per rank per step compared with DDP "
        f"(n = {p['n']} ranks, ring collectives)?"
    ),
    hints=["DDP: reduce-scatter + all-gather of the gradients.", "ZeRO-3: one more all-gather."],
    solution=lambda p, z3, ddp, r: ["DDP: 2 × (n−1)/n × S; ZeRO-3: 3 × (n−1)/n × S.", f"Ratio = {r:.3g}."],
    diagnostics=[(2.0, "3× is the common misconception: DDP's all-reduce is already two phases")],
)


@family(
    "data_parallel.grad_allreduce_time",
    "data_parallel",
    section="notebooks/05_data_parallelism.ipynb, §2 Naive DDP: one all-reduce per parameter",
    reference=REF_ZERO + ", " + REF_COMM,
)
def _ddp_time(rng):
    n_params = pick(rng, [125e6, 1.3e9, 7e9, 13e9])
    n = pick(rng, [8, 16, 64, 256])
    alpha, beta = link(rng)
    t = comm.collective_time("all_reduce", 2 * n_params, n, alpha, beta, "ring")
    return dict(
        text=f"DDP over {n} ranks: one ring all-reduce of the bf16 gradients of {n_params:.3g} parameters, "
        f"α = {us(alpha)}, β = {gbps(beta)}. Seconds (nothing overlapped)?",
        params={"n_params": n_params, "n": n, "alpha": alpha, "beta": beta},
        answer=t,
        unit="seconds",
        hints=["S = 2N bytes.", "T = 2(n−1)α + 2(n−1)/n·S/β."],
        solution=[f"S = {2 * n_params:.4g} B; T = {t:.4g} s (comm.collective_time)."],
        diagnostics=[(0.5, "a ring all-reduce moves 2(n−1)/n·S, not (n−1)/n·S")],
    )


def _bucket_case(rng):
    return {
        "tensors": pick(rng, [100, 300, 1000]),
        "bytes": pick(rng, [100, 500, 1000]) * MB,
        "bucket": pick(rng, [25, 50]) * MB,
        "n": pick(rng, [8, 32, 128]),
        "alpha": pick(rng, [10e-6, 20e-6, 50e-6]),
        "beta": pick(rng, [12.5e9, 25e9, 50e9]),
    }


def _all_reduce_in_pieces(p, pieces: int) -> float:
    """Seconds of ``pieces`` ring all-reduces of S / pieces bytes each (``comm.collective_time``)."""
    return pieces * comm.collective_time("all_reduce", p["bytes"] / pieces, p["n"], p["alpha"], p["beta"])


def _n_buckets(p) -> int:
    return -(-int(p["bytes"]) // int(p["bucket"]))


ratio_family(
    "data_parallel.bucketing_speedup",
    "data_parallel",
    difficulty=2,
    section="notebooks/05_data_parallelism.ipynb, §3 Bucketing: fewer, larger messages",
    reference=REF_ZERO,
    draw=_bucket_case,
    calc=_all_reduce_in_pieces,
    over=lambda p: dict(pieces=p["tensors"]),
    under=lambda p: dict(pieces=_n_buckets(p)),
    text=lambda p: (
        f"{p['bytes'] / MB:g} MB of gradients in {p['tensors']} equal tensors, {p['n']} ranks, "
        f"α = {us(p['alpha'])}, β = {gbps(p['beta'])}: how many times faster is all-reducing them in "
        f"⌈S/{p['bucket'] / MB:g} MB⌉ equal buckets than one ring all-reduce per tensor?"
    ),
    hints=[
        "The bandwidth term is the same: only the number of messages changes.",
        "Each all-reduce costs 2(n−1)α in latency.",
    ],
    solution=lambda p, naive, bucketed, r: [
        f"per tensor: {p['tensors']} × ... = {naive * 1e3:.4g} ms; {_n_buckets(p)} buckets: "
        f"{bucketed * 1e3:.4g} ms (comm.collective_time).",
        f"Speed-up {r:.4g}×.",
    ],
)
