"""The paged KV cache: attention through block tables equals contiguous SDPA; the block manager's
sharing, copy-on-write, prefix hashing and errors keep its invariants and every sequence's contents."""

import copy
import math
import random

import pytest
import torch
import torch.nn.functional as F

from mlsys_nb.inference.paged import (
    BlockManager,
    OutOfBlocksError,
    block_hash,
    fragmentation,
    paged_attention,
    paged_attention_tiled,
)


def contiguous_reference(q, k_full, v_full, lens):
    """Per sequence: torch SDPA of the last q_len queries over that sequence's contiguous K/V."""
    b, h, q_len, _d = q.shape
    outs = []
    for i in range(b):
        n = int(lens[i])
        k = k_full[i, :, :n].repeat_interleave(h // k_full.shape[1], dim=0)[None]
        v = v_full[i, :, :n].repeat_interleave(h // v_full.shape[1], dim=0)[None]
        mask = torch.ones(q_len, n, dtype=torch.bool).tril(diagonal=n - q_len)
        outs.append(F.scaled_dot_product_attention(q[i : i + 1], k, v, attn_mask=mask))
    return torch.cat(outs)


def scatter_into_blocks(k_full, lens, block_size, num_blocks, gen):
    """Write contiguous K [b, n_kv, T, d] into a pool of blocks at random physical ids; return pool, tables."""
    b, n_kv, _, d = k_full.shape
    need = [math.ceil(int(n) / block_size) for n in lens]
    ids = torch.randperm(num_blocks, generator=gen).tolist()
    pool = torch.randn(num_blocks, block_size, n_kv, d, generator=gen)  # garbage where nothing is written
    tables = torch.zeros(b, max(need), dtype=torch.long)
    for i in range(b):
        for j in range(need[i]):
            blk = ids.pop()
            tables[i, j] = blk
            chunk = k_full[i, :, j * block_size : min((j + 1) * block_size, int(lens[i]))].transpose(0, 1)
            pool[blk, : chunk.shape[0]] = chunk
    return pool, tables


def paged_case(seed, block_size, h, n_kv, q_len, batch=4, d=16):
    gen = torch.Generator().manual_seed(seed)
    lens = torch.randint(q_len, 70, (batch,), generator=gen)
    t = int(lens.max())
    q = torch.randn(batch, h, q_len, d, generator=gen)
    k_full, v_full = torch.randn(batch, n_kv, t, d, generator=gen), torch.randn(batch, n_kv, t, d, generator=gen)
    num_blocks = sum(math.ceil(int(n) / block_size) for n in lens) + 3
    g1, g2 = torch.Generator().manual_seed(seed + 1), torch.Generator().manual_seed(seed + 1)
    k_pool, tables = scatter_into_blocks(k_full, lens, block_size, num_blocks, g1)
    v_pool, tables_v = scatter_into_blocks(v_full, lens, block_size, num_blocks, g2)
    assert torch.equal(tables, tables_v)
    return q, k_full, v_full, k_pool, v_pool, tables, lens


@pytest.mark.parametrize("attend", [paged_attention, paged_attention_tiled], ids=["gather", "tiled"])
@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("heads", [(4, 4), (8, 2), (4, 1)], ids=["MHA", "GQA", "MQA"])
def test_paged_attention_equals_contiguous_sdpa(seed, heads, attend):
    rng = random.Random(seed)
    block_size, q_len = rng.choice([1, 3, 8, 16]), rng.choice([1, 1, 5])
    q, k_full, v_full, k_pool, v_pool, tables, lens = paged_case(seed, block_size, *heads, q_len)
    out = attend(q, k_pool, v_pool, tables, lens)
    ref = contiguous_reference(q, k_full, v_full, lens)
    # the tiled path sums in another order (block by block, rescaled): fp32 round-off of a few 1e-6
    assert (out - ref).abs().max() < (1e-6 if attend is paged_attention else 1e-5)


def test_tiled_paged_attention_check_fails_without_the_online_rescale(monkeypatch):
    """Block-by-block partials added without the online softmax's rescaling (each block normalised alone)
    no longer equal the contiguous reference: the tiled path's equality rests on the merge."""
    import mlsys_nb.kernels.attention as ka

    q, k_full, v_full, k_pool, v_pool, tables, lens = paged_case(1, 4, 8, 2, 3)
    ref = contiguous_reference(q, k_full, v_full, lens)
    assert (paged_attention_tiled(q, k_pool, v_pool, tables, lens) - ref).abs().max() < 1e-5
    monkeypatch.setattr(ka, "merge_partials", lambda o, lse, ob, lb: (o + ob, torch.logaddexp(lse, lb)))
    assert (paged_attention_tiled(q, k_pool, v_pool, tables, lens) - ref).abs().max() > 1e-2


def test_paged_attention_check_fails_with_a_wrong_block_table():
    q, k_full, v_full, k_pool, v_pool, tables, lens = paged_case(0, 4, 8, 2, 1)
    ref = contiguous_reference(q, k_full, v_full, lens)
    swapped = tables.clone()
    swapped[0, 0] = tables[1, 0]  # sequence 0 reads sequence 1's first block...
    assert (paged_attention(q, k_pool, v_pool, swapped, lens) - ref).abs().max() > 1e-3
    # ...and one extra token past a sequence's end (the masking rule broken) is caught too
    assert (paged_attention(q, k_pool, v_pool, tables, lens + 1) - ref).abs().max() > 1e-3


# ---- block manager -------------------------------------------------------------------------------


class Shadow:
    """An independent model of what the K/V pool holds: each slot stores the token id written there.

    Every sequence must read its own tokens back through its block table; a block shared without
    copy-on-write, or a prefix hit on the wrong block, shows up as a foreign token."""

    def __init__(self, m: BlockManager):
        self.m, self.slots = m, [[None] * m.block_size for _ in range(m.num_blocks)]

    def write_new(self, sid, start):
        s, bs = self.m.seqs[sid], self.m.block_size
        for p in range(start, len(s.tokens)):
            self.slots[s.table[p // bs]][p % bs] = s.tokens[p]

    def copy(self, cp):
        if cp is not None:
            self.slots[cp[1]] = list(self.slots[cp[0]])

    def check(self):
        bs = self.m.block_size
        for sid, s in self.m.seqs.items():
            got = [self.slots[s.table[p // bs]][p % bs] for p in range(len(s.tokens))]
            assert got == s.tokens, f"seq {sid} reads {got} through its table, holds {s.tokens}"


def snapshot(m):
    return copy.deepcopy((m.ref_count, m.hash_of, m.cached, list(m.free), {k: vars(s) for k, s in m.seqs.items()}))


def random_ops(m: BlockManager, rng: random.Random, steps: int, vocab: int):
    shadow, next_id = Shadow(m), 0
    prefixes = [[rng.randrange(vocab) for _ in range(rng.randrange(1, 40))] for _ in range(3)]
    for _ in range(steps):
        op = rng.choice(["alloc", "alloc", "append", "append", "append", "fork", "free"])
        live = list(m.seqs)
        before = snapshot(m)
        try:
            if op == "alloc":
                toks = rng.choice(prefixes)[: rng.randrange(1, 40)] + [
                    rng.randrange(vocab) for _ in range(rng.randrange(0, 20))
                ]
                cached = m.allocate(next_id, toks)
                assert cached % m.block_size == 0 and cached < len(toks)
                shadow.write_new(next_id, cached)
                m.mark_computed(next_id, len(toks))  # the forward wrote them: their full blocks become hits
                next_id += 1
            elif op == "append" and live:
                sid = rng.choice(live)
                n = m.num_tokens(sid)
                shadow.copy(m.append_token(sid, rng.randrange(vocab)))
                shadow.write_new(sid, n)
                m.mark_computed(sid, n + 1)
            elif op == "fork" and live:
                m.fork(rng.choice(live), next_id)
                next_id += 1
            elif op == "free" and live:
                m.free_seq(rng.choice(live))
        except (OutOfBlocksError, ValueError):
            assert snapshot(m) == before, f"a failing {op} changed the manager's state"
        m.check_invariants()
        shadow.check()
    return shadow


@pytest.mark.parametrize("seed", range(8))
def test_block_manager_random_workload_keeps_invariants_and_contents(seed):
    rng = random.Random(seed)
    m = BlockManager(rng.choice([6, 12, 30]), rng.choice([1, 2, 4, 8]), max_seq_len=64)
    random_ops(m, rng, 250, vocab=rng.choice([3, 50]))


def test_shadow_check_catches_appending_into_a_shared_block_without_copy(monkeypatch):
    """Break copy-on-write (a shared last block is written in place): the contents check must fail."""
    m = BlockManager(8, 4)
    shadow = Shadow(m)
    m.allocate("a", [1, 2, 3, 4, 5, 6])
    shadow.write_new("a", 0)
    m.fork("a", "b")
    original, last = list(m.ref_count), m.seqs["a"].table[-1]
    for sid, tok in (("a", 7), ("b", 8)):
        m.ref_count[last] = 1  # hide the sharing: the manager writes into the shared block in place
        m.append_token(sid, tok)
        shadow.write_new(sid, 6)
    m.ref_count = original
    with pytest.raises(AssertionError, match="seq a reads"):
        shadow.check()


def test_check_invariants_catches_broken_counts():
    m = BlockManager(8, 4)
    m.allocate(0, range(9))
    m.check_invariants()
    m.ref_count[m.seqs[0].table[0]] += 1
    with pytest.raises(AssertionError, match="ref_count=2 but 1 block-table references"):
        m.check_invariants()
    m.ref_count[m.seqs[0].table[0]] -= 1
    m.free[m.seqs[0].table[1]] = None
    with pytest.raises(AssertionError, match="free with 1 references"):
        m.check_invariants()


def test_copy_on_write_after_fork():
    m = BlockManager(8, 4)
    shadow = Shadow(m)
    m.allocate("p", [10, 11, 12, 13, 14, 15])  # 2 blocks, the last half full
    shadow.write_new("p", 0)
    m.fork("p", "c")
    assert m.block_table("p") == m.block_table("c") and all(m.ref_count[b] == 2 for b in m.block_table("p"))
    cp = m.append_token("c", 99)
    assert cp is not None and cp[0] == m.block_table("p")[-1] and cp[1] == m.block_table("c")[-1]
    shadow.copy(cp)
    shadow.write_new("c", 6)
    assert m.append_token("p", 42) is None  # p's last block is its own again: no copy
    shadow.write_new("p", 6)
    assert m.block_table("p")[0] == m.block_table("c")[0] and m.ref_count[m.block_table("p")[0]] == 2
    m.check_invariants()
    shadow.check()


def test_prefix_caching_shares_exactly_the_full_blocks_of_the_common_prefix():
    bs = 4
    rng = random.Random(0)
    for _ in range(30):
        m = BlockManager(64, bs)
        common = [rng.randrange(5) for _ in range(rng.randrange(0, 30))]
        a = common + [100] + [rng.randrange(5) for _ in range(rng.randrange(0, 10))]
        b = common + [200] + [rng.randrange(5) for _ in range(rng.randrange(0, 10))]
        m.allocate("a", a)
        m.mark_computed("a", len(a))
        got = m.allocate("b", b)
        lcp = len(common)  # independent count: full blocks inside the common prefix, never the last token
        assert got == min(lcp, len(b) - 1) // bs * bs
        assert m.block_table("a")[: got // bs] == m.block_table("b")[: got // bs]
        assert not set(m.block_table("a")[got // bs :]) & set(m.block_table("b")[got // bs :])
        m.check_invariants()


def test_prefix_hash_is_chained_on_the_parent():
    m = BlockManager(16, 2)
    m.allocate("a", [1, 2, 3, 4, 5])
    m.mark_computed("a", 5)
    assert m.allocate("b", [9, 9, 3, 4, 5]) == 0  # block [3, 4] after another prefix is not shared
    assert block_hash([3, 4], block_hash([1, 2])) != block_hash([3, 4], block_hash([9, 9]))


def test_freed_cached_blocks_are_revived_then_forgotten_when_reused():
    m = BlockManager(4, 4)
    m.allocate("a", range(9))  # 3 blocks, 2 full and cached once computed
    m.mark_computed("a", 9)
    blocks = m.block_table("a")
    m.free_seq("a")
    assert m.num_free_blocks() == 4
    assert m.allocate("b", range(10)) == 8 and m.block_table("b")[:2] == blocks[:2]
    m.free_seq("b")
    m.allocate("c", [7] * 16)  # needs all 4 blocks: the old cached ones are overwritten
    m.mark_computed("c", 16)
    m.free_seq("c")
    assert m.allocate("d", range(9)) == 0
    m.check_invariants()


def test_decode_filled_blocks_become_cached():
    m = BlockManager(8, 4)
    m.allocate("a", [1, 2, 3])
    for t in [4, 5, 6, 7, 8]:
        m.append_token("a", t)
    assert m.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 0  # appended, but no K/V computed yet
    m.free_seq("b")
    m.mark_computed("a", 8)
    assert m.allocate("b", [1, 2, 3, 4, 5, 6, 7, 8, 0]) == 8
    m.check_invariants()


def test_only_computed_blocks_are_prefix_hits_and_forget_prefixes_empties_the_cache():
    """The block manager is the one truth of which blocks hold computed K/V: a block becomes a hit at
    ``mark_computed``, in order, never at ``allocate``; ``forget_prefixes`` (new weights) drops them all."""
    rng = random.Random(4)
    for _ in range(20):
        bs = rng.choice([1, 2, 4])
        m = BlockManager(160, bs)
        prompt = [rng.randrange(3) for _ in range(rng.randrange(2, 30))]
        m.allocate("a", prompt)
        assert m.allocate("b", prompt) == 0  # allocated, nothing computed: no hit
        done = rng.randrange(0, len(prompt) + 1)
        m.mark_computed("a", done)
        got = m.allocate("c", prompt)
        assert got == min(done, len(prompt) - 1) // bs * bs  # whole computed blocks, never the last token
        m.check_invariants()
        m.forget_prefixes()
        assert m.allocate("d", prompt) == 0 and not m.cached
        m.mark_computed("a", len(prompt))  # the chain was cut: a's later blocks are not registered either
        assert m.allocate("e", prompt) == 0
        m.check_invariants()
    with pytest.raises(ValueError, match=r"num_computed_tokens of seq_id='a' must be an int in \[0, 5\], got 6"):
        m = BlockManager(8, 2)
        m.allocate("a", range(5))
        m.mark_computed("a", 6)


# ---- bad input -----------------------------------------------------------------------------------


def test_bad_input_names_value_and_limit_and_changes_nothing():
    m = BlockManager(6, 4, max_seq_len=20)
    m.allocate("a", range(10))
    m.fork("a", "b")
    before = snapshot(m)
    cases = [
        (lambda: m.allocate("x", range(21)), ValueError, r"prompt of 21 tokens exceeds the context max_seq_len=20"),
        (
            lambda: BlockManager(3, 4, max_seq_len=64).allocate("x", range(13)),
            ValueError,
            r"needs 4 blocks of 4 tokens but the block budget is num_blocks=3",
        ),
        (lambda: m.free_block(m.block_table("a")[0]), ValueError, r"still referenced: ref_count=2 .*\['a', 'b'\]"),
        (lambda: m.free_block(m.free and next(iter(m.free))), ValueError, "already free"),
        (lambda: m.free_block(6), ValueError, r"block_id \(num_blocks=6\) must be an int in \[0, 5\], got 6"),
        (lambda: m.allocate("x", [50] * 16), OutOfBlocksError, r"needs 4 free blocks, 3 of num_blocks=6"),
        (lambda: m.allocate("a", [1]), ValueError, "already allocated"),
        (lambda: m.allocate("x", []), ValueError, "empty"),
        (lambda: m.free_seq("nope"), KeyError, "not allocated"),
    ]
    for fn, exc, pattern in cases:
        with pytest.raises(exc, match=pattern):
            fn()
        m.check_invariants()
        assert snapshot(m) == before
    for _ in range(10):
        m.append_token("a", 1)
    with pytest.raises(ValueError, match="sequence of 21 tokens exceeds the context max_seq_len=20"):
        m.append_token("a", 1)
    m.check_invariants()


@pytest.mark.parametrize(
    "args", [{"num_blocks": 0}, {"block_size": 0}, {"max_seq_len": 0}, {"num_blocks": 2.5}, {"block_size": True}]
)
def test_constructor_rejects_bad_sizes(args):
    kw = {"num_blocks": 4, "block_size": 4} | args
    name = next(iter(args))
    with pytest.raises(ValueError, match=name):
        BlockManager(kw.pop("num_blocks"), **kw)


# ---- fragmentation -------------------------------------------------------------------------------


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
def test_fragmentation_waste_per_sequence_is_below_a_block(block_size):
    rng = random.Random(block_size)
    lengths = [rng.randrange(1, 2048) for _ in range(200)]
    r = fragmentation(lengths, block_size=block_size, max_seq_len=2048)
    assert r["waste_per_seq"] == [-n % block_size for n in lengths]  # independent count
    assert max(r["waste_per_seq"]) <= block_size - 1
    assert r["contiguous_slots"] - r["tokens"] == sum(2048 - n for n in lengths)
    assert r["paged_slots"] - r["tokens"] == sum(r["waste_per_seq"])


# ---- PagedKVCache: the object the model calls ------------------------------------------------------


def test_paged_kv_cache_attend_equals_full_causal_attention_over_prefill_fork_and_decode():
    """Drive the protocol (plan, begin, attend, commit) as a 2-layer model would, with random q/k/v per
    token; compare every step with SDPA over each sequence's whole history, including a forked
    sequence that copies its shared last block."""
    from mlsys_nb.config import ModelConfig
    from mlsys_nb.inference.paged import PagedKVCache

    cfg = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=64, seq_len=64)
    cache = PagedKVCache(cfg, num_blocks=24, block_size=4)
    gen = torch.Generator().manual_seed(0)
    hist = {}  # seq -> per layer (k, v) [n_kv, t, d]

    def step(seq_ids, n_new):
        cache.plan(seq_ids)
        pos = cache.begin(len(seq_ids), n_new)
        assert pos.tolist() == [list(range(cache.computed[s], cache.computed[s] + n_new)) for s in seq_ids]
        for layer in range(cfg.n_layers):
            q = torch.randn(len(seq_ids), 4, n_new, 8, generator=gen)
            k = torch.randn(len(seq_ids), 2, n_new, 8, generator=gen)
            v = torch.randn(len(seq_ids), 2, n_new, 8, generator=gen)
            out = cache.attend(layer, q, k, v)
            for i, s in enumerate(seq_ids):
                hk, hv = hist[s][layer]
                hist[s][layer] = (torch.cat([hk, k[i]], 1), torch.cat([hv, v[i]], 1))
                kk, vv = hist[s][layer]
                ref = contiguous_reference(q[i : i + 1], kk[None], vv[None], torch.tensor([kk.shape[1]]))
                assert (out[i : i + 1] - ref).abs().max() < 1e-6
        cache.commit()

    for s, first in (("a", 100), ("b", 200)):
        assert cache.add_sequence(s, list(range(first, first + 7))) == 0
        hist[s] = [(torch.zeros(2, 0, 8), torch.zeros(2, 0, 8)) for _ in range(cfg.n_layers)]
    step(["a", "b"], 7)
    cache.fork("a", "c")
    hist["c"] = list(hist["a"])
    for t in range(6):  # the fork shares a half-full block: the first append of each copies it
        cache.append_tokens({"a": t, "b": t, "c": 50 + t})
        step(["a", "b", "c"], 1)
        cache.manager.check_invariants()
    cache.free("b")
    cache.manager.check_invariants()


def tiny_model(n_heads=4, n_kv=2, seed=0, seq_len=64):
    from mlsys_nb.config import tiny_config
    from mlsys_nb.models import Transformer

    torch.manual_seed(seed)
    cfg = tiny_config(
        hidden=8 * n_heads, n_heads=n_heads, n_kv_heads=n_kv, ffn_hidden=None, vocab_size=61, seq_len=seq_len
    )
    return Transformer(cfg).eval()


@pytest.mark.parametrize(
    "heads,block_size,seed", [((4, 4), 3, 0), ((4, 2), 16, 1), ((4, 1), 1, 2)], ids=["MHA", "GQA", "MQA"]
)
@torch.no_grad()
def test_paged_decode_equals_contiguous_cache_and_full_recompute(heads, block_size, seed):
    """The package's Transformer: prefill + greedy-free decode of a batch through PagedKVCache gives the
    logits of the contiguous KVCache and of recomputing each whole sequence (fp32, 1e-5)."""
    from mlsys_nb.inference import KVCache
    from mlsys_nb.inference.paged import PagedKVCache

    g = torch.Generator().manual_seed(seed)
    m = tiny_model(*heads, seed=seed)
    b, prompt, total = 3, int(torch.randint(2, 20, (1,), generator=g)), 30
    x = torch.randint(0, 61, (b, total), generator=g)
    bs = block_size
    paged = PagedKVCache(m, num_blocks=b * (-(-total // bs)), block_size=bs)
    contiguous = KVCache(m, b, total)
    for i in range(b):
        paged.add_sequence(i, x[i, :prompt].tolist())
    out_p, out_c = [m(x[:, :prompt], cache=paged)], [m(x[:, :prompt], cache=contiguous)]
    for t in range(prompt, total):
        paged.append_tokens({i: int(x[i, t]) for i in range(b)})
        out_p.append(m(x[:, t : t + 1], cache=paged))
        out_c.append(m(x[:, t : t + 1], cache=contiguous))
    out_p, out_c = torch.cat(out_p, 1), torch.cat(out_c, 1)
    torch.testing.assert_close(out_p, out_c, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out_p, m(x), rtol=1e-5, atol=1e-5)
    paged.manager.check_invariants()
    assert paged.lengths == dict.fromkeys(range(b), total)


@torch.no_grad()
def test_prefix_cache_hits_fork_and_ragged_chunked_prefill_through_the_model():
    """Requests sharing a prefix compute only their suffix; a fork decodes different continuations
    (copy-on-write); one ragged step mixes a prefill chunk with decodes. All equal a full recompute."""
    from mlsys_nb.inference.paged import PagedKVCache

    m = tiny_model(4, 2, seed=3)
    g = torch.Generator().manual_seed(3)
    cache = PagedKVCache(m, num_blocks=40, block_size=4)
    system = torch.randint(0, 61, (13,), generator=g).tolist()
    seqs = {"r0": system + [1, 2, 3], "r1": system + [4, 5]}
    logits = {}
    for sid, p in seqs.items():
        n_cached = cache.add_sequence(sid, p)
        assert n_cached == (0 if sid == "r0" else 12)  # the 3 whole blocks inside the 13 shared tokens
        cache.plan([sid])
        logits[sid] = m(torch.tensor([p[n_cached:]]), cache=cache)[0, -1]
        torch.testing.assert_close(logits[sid], m(torch.tensor([p]))[0, -1], rtol=1e-5, atol=1e-5)
    cache.fork("r1", "r1b")  # parallel sampling: two continuations of r1 share its 15 tokens
    seqs["r1b"] = list(seqs["r1"])
    cache.add_sequence("r2", system + [9] * 10)  # a long prompt, prefilled in chunks beside decodes
    seqs["r2"] = system + [9] * 10
    for step in range(4):
        nxt = {"r0": 7 + step, "r1": 20 + step, "r1b": 40 + step}
        cache.append_tokens(nxt)
        for sid, tok in nxt.items():
            seqs[sid].append(tok)
        ids = ["r0", "r1", "r1b"] + (["r2"] if cache.pending("r2") else [])
        n_new = [1, 1, 1] + ([min(3, cache.pending("r2"))] if "r2" in ids else [])
        start_r2 = cache.computed["r2"]
        rows = [[seqs[s][-1]] + [0] * (max(n_new) - 1) for s in ids[:3]]
        if "r2" in ids:
            rows.append(seqs["r2"][start_r2 : start_r2 + n_new[3]] + [0] * (max(n_new) - n_new[3]))
        cache.plan(ids, n_new)
        out = m(torch.tensor(rows), cache=cache)
        for i, sid in enumerate(ids):
            upto = cache.computed[sid]
            ref = m(torch.tensor([seqs[sid][:upto]]))[0, upto - n_new[i] : upto]
            torch.testing.assert_close(out[i, : n_new[i]], ref, rtol=1e-5, atol=1e-5)
        cache.manager.check_invariants()
    assert cache.computed["r2"] == len(seqs["r2"])


@torch.no_grad()
def test_paged_protocol_bad_input_leaves_the_cache_usable():
    from mlsys_nb.inference.paged import PagedKVCache

    m = tiny_model(seq_len=32)
    cache = PagedKVCache(m, num_blocks=4, block_size=8)
    with pytest.raises(ValueError, match="prompt of 40 tokens exceeds the context max_seq_len=32"):
        cache.add_sequence(0, range(40))
    with pytest.raises(ValueError, match=r"max_seq_len \(cfg.seq_len=32\) must be an int in \[1, 32\], got 64"):
        PagedKVCache(m, num_blocks=4, max_seq_len=64)
    cache.add_sequence(0, range(10))
    with pytest.raises(ValueError, match="the batch has 2 rows but the plan has 1 sequences"):
        m(torch.zeros(2, 10, dtype=torch.long), cache=cache)
    cache.plan([0], [11])
    with pytest.raises(
        ValueError, match=r"n_new of seq_id=0 \(min\(s=11, uncomputed tokens=10\)\) must be an int in \[1, 10\], got 11"
    ):
        m(torch.zeros(1, 11, dtype=torch.long), cache=cache)
    with pytest.raises(OutOfBlocksError, match="needs 3 free blocks, 2 of num_blocks=4"):
        cache.add_sequence(1, [50] * 20)
    cache.manager.check_invariants()
    out = m(torch.arange(10)[None], cache=cache)  # still works after the failures
    torch.testing.assert_close(out, m(torch.arange(10)[None]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("chained", [True, False], ids=["chained", "unchained-hash-is-caught"])
@torch.no_grad()
def test_prefix_keys_must_chain_on_the_parent(monkeypatch, chained):
    """Without the parent in the key, a block of the same tokens after another prefix is reused and its
    K/V (computed after that other prefix) are wrong: the model's logits then differ from a recompute."""
    from mlsys_nb.inference import block_manager, paged

    if not chained:  # the key the block manager computes (block_manager.block_hash) forgets the parent
        monkeypatch.setattr(block_manager, "block_hash", lambda token_ids, parent=-1: hash(tuple(token_ids)))
    m = tiny_model(4, 2, seed=5)
    cache = paged.PagedKVCache(m, num_blocks=20, block_size=4)
    P, Q, X = [1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]
    for sid, prompt in (("A", P + X + [13]), ("E", Q + X + [14])):
        n = cache.add_sequence(sid, prompt)
        cache.plan([sid])
        m(torch.tensor([prompt[n:]]), cache=cache)
    f = Q + X + [15, 16]
    n = cache.add_sequence("F", f)
    assert n == 8  # F finds Q and X in the prefix cache either way
    cache.plan(["F"])
    got = m(torch.tensor([f[n:]]), cache=cache)[0, -1]
    err = (got - m(torch.tensor([f]))[0, -1]).abs().max().item()
    assert (err < 1e-5) if chained else (err > 1e-3), err


def test_paged_cache_dtype_names_and_size():
    from mlsys_nb.inference import kv_cache_bytes
    from mlsys_nb.inference.paged import PagedKVCache

    m = tiny_model()
    cache = PagedKVCache(m.cfg, num_blocks=5, block_size=4, dtype="bf16")
    assert cache.k.dtype == torch.bfloat16
    assert cache.nbytes == kv_cache_bytes(m.cfg, 5 * 4, "bf16")  # the pool holds num_blocks * block_size tokens
    assert PagedKVCache(m, num_blocks=1, block_size=1, dtype=torch.float16).k.dtype == torch.float16
    with pytest.raises(ValueError, match="dtype='int3'"):
        PagedKVCache(m, num_blocks=1, dtype="int3")


def test_block_manager_imports_no_torch():
    """The block manager is bookkeeping: a scheduler reads it without torch. Fails if block_manager.py (or
    anything it imports) imports torch, e.g. if the manager went back into paged.py."""
    import subprocess
    import sys

    code = (
        "import sys; from mlsys_nb.inference.block_manager import BlockManager; "
        "m = BlockManager(4, 2); m.allocate('a', [1, 2, 3]); m.mark_computed('a', 3); m.check_invariants(); "
        "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_block_manager_events_say_what_happened_to_blocks_in_order():
    """A quantized pool learns of computed and freed blocks by reading ``take_events`` (no callback into it):
    ("computed", the full blocks among the computed tokens) after ``mark_computed``, ("freed", (b,)) per block
    back on the free list, oldest first, drained by the read. Off by default (nothing accumulates)."""
    m = BlockManager(6, 2, record_events=True)
    m.allocate("a", [1, 2, 3])
    m.mark_computed("a", 3)
    a = m.block_table("a")
    m.free_seq("a")
    assert m.take_events() == [("computed", (a[0],)), ("freed", (a[1],)), ("freed", (a[0],))]
    assert m.take_events() == []
    quiet = BlockManager(6, 2)
    quiet.allocate("a", [1, 2, 3])
    quiet.mark_computed("a", 3)
    quiet.free_seq("a")
    assert quiet.take_events() == [] and quiet.events is None


def test_quantized_pool_without_auto_sync_keeps_a_freed_blocks_residual_until_sync():
    """An engine that frees a sequence before copying it out (swap) turns ``auto_sync`` off: the freed block's
    exact K stays readable until it calls ``sync()``, which then gives the residual slot back."""
    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference.paged import PagedKVCache

    cfg = load_model_preset("tiny")
    kv = PagedKVCache(cfg, num_blocks=4, block_size=4, dtype="int8", residual_blocks=2)
    kv.add_sequence("a", [1, 2, 3])  # one partly filled block: its K goes to the residual
    (b,) = kv.manager.block_table("a")
    k = torch.randn(3, cfg.n_kv_heads, cfg.head_dim)
    for layer in range(cfg.n_layers):
        kv.write(layer, torch.arange(b * 4, b * 4 + 3), k, k)
    kv.auto_sync = False
    kv.free("a")
    assert list(kv.res_of) == [b] and torch.equal(kv.get_residual(b)[0, :3], k)
    kv.sync()
    assert kv.res_of == {} and kv.get_residual(b) is None and len(kv.res_free) == 2
