"""Removing duplicates from a corpus: exact copies by hash, near copies by MinHash and LSH, from scratch.

- **Exact**: hash each document's tokens; keep the first document of each hash (``exact_duplicates``).
- **Near**: two documents are near-duplicates when the Jaccard similarity of their sets of shingles
  (``shingle`` consecutive tokens) is at least a threshold. Comparing every pair costs n²/2 set
  intersections; MinHash (Broder 1997) summarises a set by ``k`` numbers, the minimum of each of ``k``
  random hash functions over its shingles, and ``P[min h(A) = min h(B)] = J(A, B)`` for each function, so
  the fraction of equal entries estimates J. LSH cuts the ``k`` numbers into ``bands`` bands of
  ``rows = k / bands``; documents that agree on every row of at least one band become candidates, with
  probability ``1 - (1 - J^rows)^bands`` (``lsh_probability``, an S-curve that rises near
  ``(1 / bands)^(1 / rows)``). Only candidates are compared (estimated J from the signatures), and each
  group of near-duplicates keeps its first document (``near_duplicates``). Lee et al. 2021 deduplicate
  training corpora this way (and with exact substrings) and find less memorisation and cleaner evaluation.

Hash functions: ``h_i(x) = (a_i · x + b_i) mod p`` with p = 2^31 - 1 (a Mersenne prime) on each shingle's
integer hash (``x < p``), ``a_i, b_i`` drawn from a seeded generator. Pure numpy.
"""

from __future__ import annotations

import numpy as np

from ..config import check_int, check_number

PRIME = (1 << 31) - 1

__all__ = [
    "PRIME",
    "exact_duplicates",
    "jaccard",
    "lsh_candidates",
    "lsh_probability",
    "minhash_signatures",
    "near_duplicates",
    "shingles",
]


def shingles(doc, k: int = 5) -> set[int]:
    """The set of ``k``-token shingles of ``doc`` (a sequence of int tokens), each as an integer in [0, PRIME)."""
    check_int("k (shingle length)", k, 1)
    toks = [int(t) for t in doc]
    out = set()
    for i in range(max(1, len(toks) - k + 1)):
        h = 0
        for t in toks[i : i + k]:
            h = (h * 1_000_003 + t + 1) % PRIME
        out.add(h)
    return out


def jaccard(a: set, b: set) -> float:
    """|A ∩ B| / |A ∪ B| (1.0 for two empty sets)."""
    return len(a & b) / len(a | b) if a or b else 1.0


def exact_duplicates(docs) -> list[int]:
    """Indices of the documents whose tokens equal an earlier document's (the first copy is kept)."""
    seen, dup = set(), []
    for i, d in enumerate(docs):
        key = hash(tuple(int(t) for t in d))
        if key in seen:
            dup.append(i)
        seen.add(key)
    return dup


def minhash_signatures(sets, num_hashes: int = 64, *, seed: int = 0) -> np.ndarray:
    """MinHash signatures, int64 [len(sets), num_hashes]: entry (d, i) is ``min over x in sets[d] of h_i(x)``."""
    check_int("num_hashes", num_hashes, 1)
    rng = np.random.default_rng(seed)
    a = rng.integers(1, PRIME, size=num_hashes, dtype=np.int64)
    b = rng.integers(0, PRIME, size=num_hashes, dtype=np.int64)
    sig = np.empty((len(sets), num_hashes), dtype=np.int64)
    for d, s in enumerate(sets):
        x = np.fromiter(s, dtype=np.int64, count=len(s))[:, None]  # [shingles, 1], each < 2^31
        sig[d] = ((a[None, :] * x + b[None, :]) % PRIME).min(axis=0)  # a·x < 2^62: no overflow
    return sig


def lsh_probability(j, rows: int, bands: int):
    """Probability that two documents of Jaccard similarity ``j`` share at least one of ``bands`` bands of
    ``rows`` MinHash rows: ``1 - (1 - j^rows)^bands``."""
    j = np.asarray(j, dtype=float)
    return 1 - (1 - j**rows) ** bands


def lsh_candidates(sig: np.ndarray, bands: int) -> set[tuple[int, int]]:
    """Pairs (i < j) of documents whose signatures agree on every row of at least one band."""
    n, k = sig.shape
    check_int(f"bands (a divisor of num_hashes={k})", bands, 1, k)
    if k % bands:
        raise ValueError(f"bands={bands} must divide num_hashes={k}")
    rows = k // bands
    pairs = set()
    for band in range(bands):
        buckets: dict[bytes, list[int]] = {}
        for d in range(n):
            buckets.setdefault(sig[d, band * rows : (band + 1) * rows].tobytes(), []).append(d)
        for members in buckets.values():
            pairs.update((members[x], members[y]) for x in range(len(members)) for y in range(x + 1, len(members)))
    return pairs


def near_duplicates(
    docs, *, threshold: float = 0.5, shingle: int = 5, num_hashes: int = 64, bands: int = 16, seed: int = 0
):
    """Near-duplicate removal: shingles -> MinHash -> LSH candidates -> estimated Jaccard >= ``threshold``.

    Returns ``(remove, pairs)``: the sorted indices to drop (every document of a group of near-duplicates
    but the first) and ``{(i, j): estimated J}`` for each candidate pair that passed."""
    check_number("threshold", threshold, 0, 1, lo_open=True)
    sig = minhash_signatures([shingles(d, shingle) for d in docs], num_hashes, seed=seed)
    found = {}
    for i, j in sorted(lsh_candidates(sig, bands)):
        est = float((sig[i] == sig[j]).mean())
        if est >= threshold:
            found[(i, j)] = est
    parent = list(range(len(docs)))  # union-find: a group is represented by its first document

    def root(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, j in found:
        ri, rj = root(i), root(j)
        parent[max(ri, rj)] = min(ri, rj)
    return sorted(i for i in range(len(docs)) if root(i) != i), found
