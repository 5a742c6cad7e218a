"""Statistics shared by the tests: a chi-square goodness-of-fit p-value of sampled counts against the
probabilities they should follow (tests/test_speculative.py, tests/test_spec_batch.py)."""

import numpy as np
from scipy.stats import chisquare


def chi2_pvalue(counts, probs, min_expected: float = 5.0) -> float:
    """p-value of Pearson's chi-square test of ``counts`` (one count per outcome) against ``probs`` (one
    probability per outcome, renormalised over the support). A count outside the support (probability 0)
    gives 0; outcomes whose expected count is below ``min_expected`` are merged into one bin (the chi-square
    approximation needs about 5 per bin); at least 3 bins must remain."""
    counts, probs = np.asarray(counts, dtype=float), np.asarray(probs, dtype=float)
    if counts.shape != probs.shape:
        raise ValueError(f"counts and probs: one value per outcome each, got {counts.shape} and {probs.shape}")
    support = probs > 0
    if counts[~support].sum():
        return 0.0
    obs, exp = counts[support], probs[support] / probs[support].sum() * counts.sum()
    small = exp < min_expected
    if small.any():
        obs = np.append(obs[~small], obs[small].sum())
        exp = np.append(exp[~small], exp[small].sum())
    if len(exp) < 3:
        raise ValueError(f"only {len(exp)} bins with expected count >= {min_expected}: pick a smaller support")
    return float(chisquare(obs, exp).pvalue)
