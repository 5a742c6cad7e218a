"""Second routes of the topic ``data_parallel``: DDP and ZeRO bytes and times by hand."""

from __future__ import annotations

import math

from .registry import register_route


@register_route("data_parallel.ddp_bytes_per_step")
def _(p):
    return 2 * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@register_route("data_parallel.zero_bytes_per_step")
def _(p):
    return (3 if p["zero"] == 3 else 2) * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@register_route("data_parallel.zero3_vs_ddp_traffic")
def _(p):
    n = p["n"]
    return (3 * (n - 1) / n) / (2 * (n - 1) / n)  # RS + 2 AG vs RS + AG


@register_route("data_parallel.grad_allreduce_time")
def _(p):
    n = p["n"]
    return 2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * 2 * p["n_params"] / p["beta"]


@register_route("data_parallel.bucketing_speedup")
def _(p):
    n, S, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
    k = math.ceil(S / p["bucket"])
    lat, bw = 2 * (n - 1) * a, 2 * (n - 1) / n * S / b
    return (p["tensors"] * lat + bw) / (k * lat + bw)


def _torch_sampler(p):
    """PyTorch's own ``DistributedSampler`` for rank 0 (its length is computed on construction; no process
    group is needed when ``num_replicas`` and ``rank`` are given)."""
    from torch.utils.data import DistributedSampler

    return DistributedSampler(range(p["n"]), num_replicas=p["world"], rank=0, shuffle=False, drop_last=p["drop_last"])


@register_route("data_parallel.samples_per_rank")
def _(p):
    return len(_torch_sampler(p))


@register_route("data_parallel.sampler_padding")
def _(p):
    """Padding: the indices torch's sampler draws beyond N; dropped: the samples it never reaches."""
    return abs(_torch_sampler(p).total_size - p["n"])


@register_route("data_parallel.accumulation_steps")
def _(p):
    sequences, per_micro_step = p["tokens"] / p["seq_len"], p["dp"] * p["micro_batch"]
    return sequences / per_micro_step


@register_route("data_parallel.tokens_per_step")
def _(p):
    return p["dp"] * p["accumulation"] * p["micro_batch"] * p["seq_len"]


@register_route("data_parallel.critical_batch_cost")
def _(p):
    """Solve the paper's trade-off curve (S/S_min − 1)(E/E_min − 1) = 1 with E = B·S and E_min = B_noise·S_min
    for s = S/S_min: (s − 1)(k·s − 1) = 1 with k = B/B_noise, i.e. k·s² − (k + 1)·s = 0, by bisection on
    s > 1 (never the closed form the key uses)."""
    k = p["batch"] / p["noise_scale"]
    lo, hi = 1.0, 2.0
    while (hi - 1) * (k * hi - 1) < 1:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if (mid - 1) * (k * mid - 1) < 1 else (lo, mid)
    s = (lo + hi) / 2
    return s if p["ask"] == "steps" else k * s  # E/E_min = B·S / (B_noise·S_min)
