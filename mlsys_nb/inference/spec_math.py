"""Speculative decoding's closed forms (models; Leviathan et al., 2023, arXiv:2211.17192): with a per-token
acceptance probability α and k drafted tokens, a target forward yields ``expected_tokens_per_step`` =
(1 − α^(k+1)) / (1 − α) tokens (their Eq. 1); with a draft forward costing ``c`` target forwards the wall-clock
speed-up is that over k·c + 1 (``expected_speedup``, their Theorem 3.8); ``best_k`` maximises it. No torch:
a calculator (``speculative.py`` re-exports these; ``benchmarks/speculative.py`` measures them).
"""

from __future__ import annotations

from ..config import check_int, check_number, check_probability

__all__ = ["best_k", "expected_speedup", "expected_tokens_per_step"]


# ---- closed forms (models, Leviathan et al., 2023) ---------------------------------------------
def _check_alpha_k(alpha, k):
    check_probability("alpha", alpha)
    check_int("k", k, 0)


def expected_tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens per target forward, (1 − α^(k+1)) / (1 − α) (k + 1 when α = 1)."""
    _check_alpha_k(alpha, k)
    if alpha == 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def expected_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Wall-clock speed-up over the target alone: tokens per step / (k · c + 1), c = draft forward
    time / target forward time (a model: verification of k+1 tokens assumed to cost one forward)."""
    check_number("cost_ratio", cost_ratio, 0)
    return expected_tokens_per_step(alpha, k) / (k * cost_ratio + 1.0)


def best_k(alpha: float, cost_ratio: float, k_max: int = 16) -> int:
    """The k in 0..k_max maximising ``expected_speedup`` (0 = do not speculate)."""
    _check_alpha_k(alpha, k_max)
    return max(range(k_max + 1), key=lambda k: expected_speedup(alpha, k, cost_ratio))
