"""The radix-tree prefix cache: hit counts equal an analytical count and a brute-force longest-common-
prefix search; LRU eviction removes the least recently used unlocked leaves and never a locked path."""

import random

import pytest

from mlsys_nb.inference.radix import RadixCache, multi_turn_workload


def serve(cache, workload):
    """What a server does per request: match, pin, (prefill the rest, generate), insert, unpin."""
    hits = []
    for _, prompt, reply in workload:
        n, node, _ = cache.match_prefix(prompt)
        cache.lock(node)
        hits.append(n)
        cache.insert(prompt + reply)
        cache.unlock(node)
        cache.check_invariants()
    return hits


def brute_force_hits(workload):
    """Independent reference: longest common prefix of each prompt with any earlier prompt + reply."""
    seen, hits = [], []
    for _, prompt, reply in workload:
        best = 0
        for s in seen:
            n = 0
            while n < min(len(s), len(prompt)) and s[n] == prompt[n]:
                n += 1
            best = max(best, n)
        hits.append(best)
        seen.append(prompt + reply)
    return hits


@pytest.mark.parametrize("shape", [(2, 3, 3, 64, 16, 24), (3, 1, 4, 10, 5, 7), (1, 5, 2, 100, 1, 1)])
def test_multi_turn_hit_rate_equals_the_analytical_count(shape):
    S, C, T, Ls, Lu, La = shape
    wl = multi_turn_workload(n_systems=S, conversations=C, turns=T, system_len=Ls, user_len=Lu, reply_len=La)
    cache = RadixCache()
    hits = serve(cache, wl)
    # Analytical: the first conversation of each system misses its system prompt once; every later
    # turn t >= 1 finds the whole history: system + t (user + reply).
    expected_hits = S * (C - 1) * Ls + S * C * sum(Ls + t * (Lu + La) for t in range(1, T))
    expected_query = S * C * sum(Ls + t * (Lu + La) + Lu for t in range(T))
    assert sum(hits) == expected_hits
    assert cache.stats["query_tokens"] == expected_query
    assert cache.hit_rate == pytest.approx(expected_hits / expected_query)
    assert hits == brute_force_hits(wl)


@pytest.mark.parametrize("seed", range(5))
def test_random_prefixes_match_brute_force_longest_common_prefix(seed):
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 8])  # a tiny vocabulary makes partial edge matches and splits common
    wl = [
        (
            None,
            [rng.randrange(vocab) for _ in range(rng.randrange(1, 20))],
            [rng.randrange(vocab) for _ in range(rng.randrange(0, 5))],
        )
        for _ in range(60)
    ]
    cache = RadixCache()
    assert serve(cache, wl) == brute_force_hits(wl)
    stored = {tuple(p + r) for _, p, r in wl}
    # every stored root-to-leaf path is an inserted sequence and every inserted one is a prefix of one
    assert set(cache.sequences()) <= stored
    assert all(any(s[: len(x)] == x for s in cache.sequences()) for x in stored)
    assert cache.size == len({tuple(x[:i]) for x in stored for i in range(1, len(x) + 1)})


def test_brute_force_reference_is_not_trivially_equal():
    """The equality above can fail: a cache that forgets replies (inserts prompts only) misses turns."""
    wl = multi_turn_workload(n_systems=1, conversations=2, turns=2, system_len=8, user_len=2, reply_len=3)
    cache = RadixCache()
    hits = []
    for _, prompt, _reply in wl:
        hits.append(cache.match_prefix(prompt)[0])
        cache.insert(prompt)
    assert hits != brute_force_hits(wl)


def test_values_follow_their_tokens_through_splits():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4], values=["a", "b", "c", "d"])
    cache.insert([1, 2, 9], values=["x", "y", "z"])  # splits the first edge after [1, 2]
    assert cache.match_prefix([1, 2, 3, 7])[::2] == (3, ["a", "b", "c"])
    assert cache.match_prefix([1, 2, 9, 9])[::2] == (3, ["a", "b", "z"])
    cache.check_invariants()


def test_lru_eviction_takes_the_least_recently_used_leaf_first():
    cache = RadixCache()
    for first in (1, 2, 3):
        cache.insert([first] * 5)
    cache.match_prefix([1] * 5)  # touch sequence 1: now sequence 2 is the least recently used
    assert cache.evict(1) == 5
    assert sorted(cache.sequences()) == [(1,) * 5, (3,) * 5]
    assert cache.evict(1) == 5 and cache.sequences() == [(1,) * 5]
    cache.match_prefix([1, 1])  # only the first two tokens were used: the edge splits, the tail is older
    assert cache.evict(1) == 3 and cache.sequences() == [(1, 1)]
    cache.check_invariants()


def test_lru_check_fails_if_eviction_ignores_recency(monkeypatch):
    from mlsys_nb.inference import radix

    monkeypatch.setattr(radix.heapq, "heapify", lambda h: h.sort(key=lambda e: -e[0]))  # newest first
    cache = RadixCache()
    for first in (1, 2, 3):
        cache.insert([first] * 5)
    cache.match_prefix([1] * 5)
    cache.evict(1)
    assert sorted(cache.sequences()) != [(1,) * 5, (3,) * 5]


def test_locked_paths_survive_eviction_and_parents_become_leaves():
    cache = RadixCache()
    cache.insert([1, 2, 3, 4])
    cache.insert([1, 2, 5, 6])
    cache.insert([7, 8])
    _n, node, _ = cache.match_prefix([1, 2, 3, 4])
    cache.lock(node)
    assert cache.evict(100) == 4  # [5, 6] and [7, 8]; [1, 2] is a locked ancestor
    assert cache.sequences() == [(1, 2, 3, 4)]
    cache.unlock(node)
    assert cache.evict(100) == 4 and cache.size == 0
    cache.check_invariants()


def test_capacity_bounds_size_with_lru_eviction():
    rng = random.Random(0)
    cache = RadixCache(capacity_tokens=50)
    for _ in range(100):
        seq = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        n, _node, _ = cache.match_prefix(seq)
        assert n <= len(seq)
        cache.insert(seq)
        cache.check_invariants()
        assert cache.size <= 50
    assert cache.stats["evicted_tokens"] > 0


def test_bad_input():
    with pytest.raises(ValueError, match="capacity_tokens must be an int >= 1, got 0"):
        RadixCache(capacity_tokens=0)
    cache = RadixCache()
    cache.insert([1, 2, 3])
    with pytest.raises(ValueError, match="values has 2 entries for 3 tokens"):
        cache.insert([4, 5, 6], values=[0, 1])
    _, node, _ = cache.match_prefix([1, 2, 3])
    with pytest.raises(ValueError, match="not locked"):
        cache.unlock(node)
    cache.check_invariants()
    assert cache.sequences() == [(1, 2, 3)]


def test_check_invariants_catches_a_wrong_size():
    cache = RadixCache()
    cache.insert([1, 2, 3])
    cache.size += 1
    with pytest.raises(AssertionError, match="size=4 but the edges hold 3 tokens"):
        cache.check_invariants()


@pytest.mark.parametrize("seed", range(3))
def test_radix_hits_equal_token_level_block_hashing(seed):
    """Two independent designs agree: hash-chained blocks of ONE token (a trie keyed by chained hashes)
    find the radix tree's match, capped so the last prompt token is computed."""
    from mlsys_nb.inference.paged import BlockManager

    rng = random.Random(seed)
    wl = [
        (
            None,
            [rng.randrange(3) for _ in range(rng.randrange(2, 15))],
            [rng.randrange(3) for _ in range(rng.randrange(0, 5))],
        )
        for _ in range(40)
    ]
    wl += multi_turn_workload(n_systems=2, conversations=2, turns=3, system_len=9, user_len=3, reply_len=4, first_id=10)
    radix, blocks = RadixCache(), BlockManager(num_blocks=2000, block_size=1)
    for i, (_, prompt, reply) in enumerate(wl):
        n, node, _ = radix.match_prefix(prompt)
        assert blocks.allocate(i, prompt) == min(n, len(prompt) - 1)
        blocks.mark_computed(i, len(prompt))
        for t in reply:
            blocks.append_token(i, t)
        blocks.mark_computed(i, len(prompt) + len(reply))
        radix.insert(prompt + reply)
        blocks.free_seq(i)
    blocks.check_invariants()
