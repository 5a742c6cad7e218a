"""Small helpers shared by the family modules (number pickers and formatting for question text)."""

from __future__ import annotations

from ..units import fmt

GB = 1e9
MB = 1e6


def pick(rng, seq):
    return seq[rng.randrange(len(seq))]


def gb(x: float) -> str:
    return f"{x / GB:.4g} GB"


def sizes_mb(rng):
    return pick(rng, [1, 4, 16, 64, 100, 256, 512, 1000]) * MB


def us(x: float) -> str:
    return f"{x * 1e6:.3g} us"


def gbps(x: float) -> str:
    return f"{x / GB:.4g} GB/s"


def tflops(x: float) -> str:
    return f"{x / 1e12:.4g} TFLOP/s"


__all__ = ["GB", "MB", "pick", "gb", "sizes_mb", "us", "gbps", "tflops", "fmt"]
