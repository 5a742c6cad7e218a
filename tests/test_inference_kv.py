"""The decoding path and the contiguous KV cache: cached logits equal recomputing the whole sequence
without a cache (fp32, 1e-5) for MHA, GQA and MQA, chunked prefill, ragged batches mixing prefill
chunks with decodes; bad input; the checks fail when the cache's causal rule is broken."""

import pytest
import torch

from mlsys_nb.config import ModelConfig
from mlsys_nb.inference import KVCache
from mlsys_nb.models import Transformer

TOL = {"rtol": 1e-5, "atol": 1e-5}


def model(n_heads=4, n_kv=2, hidden=32, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = ModelConfig(n_layers=2, hidden=hidden, n_heads=n_heads, n_kv_heads=n_kv, vocab_size=61, seq_len=48, **kw)
    return Transformer(cfg).eval()


def decode_all(m, x, prompt, cache=None):
    """Prefill x[:, :prompt], then decode one token at a time; logits of every position."""
    cache = cache or KVCache(m, x.shape[0], x.shape[1])
    out = [m(x[:, :prompt], cache=cache)]
    for t in range(prompt, x.shape[1]):
        out.append(m(x[:, t : t + 1], cache=cache))
    return torch.cat(out, 1), cache


@pytest.mark.parametrize("n_heads,n_kv", [(4, 4), (4, 2), (4, 1), (6, 3)], ids=["MHA", "GQA", "MQA", "GQA6/3"])
@pytest.mark.parametrize("seed", [0, 1])
@torch.no_grad()
def test_cached_decode_equals_full_recompute(n_heads, n_kv, seed):
    g = torch.Generator().manual_seed(100 + seed)
    m = model(n_heads, n_kv, hidden=8 * n_heads, seed=seed)
    b, s = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(6, 30, (1,), generator=g))
    prompt = int(torch.randint(1, s, (1,), generator=g))
    x = torch.randint(0, 61, (b, s), generator=g)
    got, cache = decode_all(m, x, prompt)
    torch.testing.assert_close(got, m(x), **TOL)
    assert cache.lengths.tolist() == [s] * b


@torch.no_grad()
def test_chunked_prefill_and_bias_and_layernorm():
    m = model(4, 2, bias=True, norm="layernorm", activation="gelu", seed=3)
    x = torch.randint(0, 61, (2, 23))
    cache = KVCache(m, 2, 23)
    got = torch.cat([m(x[:, a : a + 5], cache=cache) for a in range(0, 20, 5)] + [m(x[:, 20:], cache=cache)], 1)
    torch.testing.assert_close(got, m(x), **TOL)


@torch.no_grad()
def test_ragged_batch_mixes_prefill_chunks_and_decodes():
    """One step carries a 7-token prompt chunk for one sequence and single decode tokens for others,
    in arbitrary cache rows: each sequence's logits equal its own full recompute."""
    m = model(8, 2, hidden=64, seed=4)
    g = torch.Generator().manual_seed(7)
    lens = [19, 11, 26, 4]
    seqs = [torch.randint(0, 61, (n,), generator=g) for n in lens]
    ref = [m(x[None])[0] for x in seqs]
    cache = KVCache(m, 6, 32)
    slot = {0: 5, 1: 0, 2: 3, 3: 1}  # sequence -> cache row
    done = [0] * 4
    got = [[] for _ in range(4)]
    step = 0
    while any(d < n for d, n in zip(done, lens)):
        step += 1
        active = [i for i in range(4) if done[i] < lens[i]]
        # prefill in chunks of up to 7 (a different chunk size per step), decode one token once
        # a sequence is past its "prompt" (the first half)
        n_new = [min(lens[i] - done[i], (1 + (step + i) % 7) if done[i] < lens[i] // 2 else 1) for i in active]
        s = max(n_new)
        tokens = torch.zeros(len(active), s, dtype=torch.long)
        for r, (i, n) in enumerate(zip(active, n_new)):
            tokens[r, :n] = seqs[i][done[i] : done[i] + n]
        cache.plan([slot[i] for i in active], n_new)
        logits = m(tokens, cache=cache)
        assert torch.isfinite(logits).all()
        for r, (i, n) in enumerate(zip(active, n_new)):
            got[i].append(logits[r, :n])
            done[i] += n
    for i in range(4):
        torch.testing.assert_close(torch.cat(got[i]), ref[i], **TOL)
        assert int(cache.lengths[slot[i]]) == lens[i]
    assert cache.lengths[[2, 4]].tolist() == [0, 0]


@torch.no_grad()
def test_positions_argument_matches_default_and_shifts_rope():
    m = model(seed=5)
    x = torch.randint(0, 61, (2, 9))
    torch.testing.assert_close(m(x, positions=torch.arange(9)), m(x))
    # RoPE encodes relative positions: a uniform shift changes nothing, stretching them does
    torch.testing.assert_close(m(x, positions=torch.arange(9) + 3), m(x), rtol=1e-4, atol=1e-5)
    assert not torch.allclose(m(x, positions=2 * torch.arange(9)), m(x), rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="seq_len=48"):
        m(x, positions=torch.arange(9) + 45)


@torch.no_grad()
def test_bad_input_leaves_cache_unchanged():
    m = model(seed=6)
    cache = KVCache(m, 2, 10)
    m(torch.randint(0, 61, (2, 8)), cache=cache)
    before = cache.lengths.clone()
    with pytest.raises(ValueError, match="max_len=10"):
        m(torch.randint(0, 61, (2, 3)), cache=cache)
    with pytest.raises(ValueError, match="n_new"):
        cache.plan([0, 1], [0, 1])
        m(torch.randint(0, 61, (2, 1)), cache=cache)
    with pytest.raises(ValueError, match="n_seqs=2"):
        cache.plan([0, 2], [1, 1])
    with pytest.raises(ValueError, match="seq_len=48"):
        KVCache(m, 1, 49)
    assert torch.equal(cache.lengths, before)
    # the failed calls left no pending step: the next one starts clean
    out = m(torch.randint(0, 61, (2, 2)), cache=cache)
    assert out.shape == (2, 2, 61) and cache.lengths.tolist() == [10, 10]


def test_check_fails_when_the_causal_rule_is_broken(monkeypatch):
    """The equality test catches a cache that lets a query see one token too few."""
    m = model(seed=7)
    x = torch.randint(0, 61, (2, 12))
    orig = torch.nn.functional.scaled_dot_product_attention  # what KVCache.attend calls

    def off_by_one(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            attn_mask = attn_mask.clone()
            idx = attn_mask.sum(-1, keepdim=True) - 1  # hide each query's own (newest) key
            keep = attn_mask.sum(-1, keepdim=True) > 1
            attn_mask.scatter_(-1, idx, ~keep)
        return orig(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", off_by_one)
    with torch.no_grad():
        got, _ = decode_all(m, x, 4)
        assert not torch.allclose(got, m(x), **TOL)


def test_cache_tensors_match_kv_cache_bytes():
    from mlsys_nb.inference import kv_cache_bytes

    for n_kv in (1, 2, 4):
        m = model(4, n_kv)
        for dtype in (torch.float32, torch.bfloat16):
            cache = KVCache(m, 3, 17, dtype=dtype)
            assert cache.nbytes == kv_cache_bytes(m, 3 * 17, dtype)
            assert cache.nbytes == kv_cache_bytes(m.cfg, 3 * 17, "bf16" if dtype == torch.bfloat16 else "fp32")


def test_norm_eps_reaches_the_norms_and_is_validated():
    m = model(seed=8, norm_eps=1e-6)
    assert all(n.eps == 1e-6 for n in m.modules() if isinstance(n, torch.nn.RMSNorm))
    assert ModelConfig(n_layers=1, hidden=8, n_heads=2, vocab_size=10).norm_eps == 1e-5  # default unchanged
    for bad in (0.0, -1e-5, 1.5, True):
        with pytest.raises(ValueError, match="norm_eps"):
            ModelConfig(n_layers=1, hidden=8, n_heads=2, vocab_size=10, norm_eps=bad)
