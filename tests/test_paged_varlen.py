"""``paged_decode_attention_varlen``: every decode's context packed as chunks (one chunk mapping per step), one
gather of K and V, one attention call over all chunks, their partial results merged per sequence (a segment
softmax over the chunks' log-sum-exps). Checked against plain softmax attention over each
sequence's contiguous K/V and against ``paged_attention`` (SDPA over gathered blocks), and in the engine
(``attention_backend="varlen"``) against the grouped path; the two key ideas (the per-sequence max shift, the
chunk mapping) are broken once each to show the checks catch it."""

import random

import pytest
import torch

from mlsys_nb.inference import LLM, SamplingParams, paged, paged_kernels
from mlsys_nb.inference.paged import paged_attention, paged_decode_attention_varlen, varlen_decode_chunks

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2}


def random_case(rng: random.Random, dtype, logit_scale=1.0):
    """Random lengths 1..200, block size, GQA ratio; each sequence's contiguous K/V scattered into a pool
    through a shuffled block table. -> (q [b, h, d], pools, tables, lens, contiguous K/V per sequence)."""
    b = rng.randint(1, 9)
    bs = rng.choice([1, 4, 16])
    n_kv, group = rng.choice([(1, 1), (2, 3), (4, 1), (2, 4)])
    h, d = n_kv * group, rng.choice([8, 16, 32])
    lens = [rng.randint(1, 200) for _ in range(b)]
    lens[0] = 1  # the shortest context always occurs
    width = max(-(-n // bs) for n in lens)
    num_blocks = sum(-(-n // bs) for n in lens) + 3
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))).tolist()
    kc = torch.randn(num_blocks, bs, n_kv, d).to(dtype)
    vc = torch.randn(num_blocks, bs, n_kv, d).to(dtype)
    tables, contig = [], []
    for n in lens:
        own = [perm.pop() for _ in range(-(-n // bs))]
        k, v = torch.randn(n, n_kv, d).to(dtype), torch.randn(n, n_kv, d).to(dtype)
        for p in range(n):  # block table entry p // bs holds position p at offset p % bs
            kc[own[p // bs], p % bs], vc[own[p // bs], p % bs] = k[p], v[p]
        tables.append(own + [rng.randrange(num_blocks)] * (width - len(own)))  # padding entries: any block
        contig.append((k, v))
    q = (torch.randn(b, h, d) * logit_scale).to(dtype)
    return q, kc, vc, torch.tensor(tables), torch.tensor(lens), contig


def plain_attention(q, k, v):
    """One query [h, d] over contiguous K/V [n, n_kv, d], in float64: softmax(q k^T / sqrt(d)) v."""
    h, d = q.shape
    g = h // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, dim=1), v.double().repeat_interleave(g, dim=1)  # [n, h, d]
    w = torch.softmax(torch.einsum("hd,nhd->hn", q.double(), kk) / d**0.5, dim=-1)
    return torch.einsum("hn,nhd->hd", w, vv)


def check_case(rng, dtype, logit_scale=1.0):
    q, kc, vc, tables, lens, contig = random_case(rng, dtype, logit_scale)
    out = paged_decode_attention_varlen(q, kc, vc, *varlen_decode_chunks(tables, lens, kc.shape[1]))
    assert out.shape == q.shape and out.dtype == dtype
    ref = torch.stack([plain_attention(q[i], *contig[i]) for i in range(len(lens))])
    tol = TOL[dtype] * (1 + ref.abs().max().item())
    assert torch.isfinite(out).all()
    assert (out.double() - ref).abs().max().item() < tol
    if logit_scale == 1.0:  # SDPA over gathered blocks: a second, independent implementation
        sdpa = paged_attention(q.unsqueeze(2), kc, vc, tables, lens).squeeze(2)
        assert (out.double() - sdpa.double()).abs().max().item() < 2 * tol


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_varlen_equals_plain_attention_and_paged_attention(dtype):
    rng = random.Random(0 if dtype == torch.float32 else 1)
    for _ in range(12):
        check_case(rng, dtype)
    for _ in range(3):  # logits in the thousands: the per-sequence max shift keeps exp finite
        check_case(rng, dtype, logit_scale=300.0)


def test_the_checks_fail_when_the_idea_is_broken(monkeypatch):
    rng_seed = 5
    # 1. a segment softmax without the per-sequence max: exp overflows on large logits
    from mlsys_nb.kernels import attention as kernel_attention  # merge_segments' shift (the engine's varlen merge)

    monkeypatch.setattr(kernel_attention, "segment_max", lambda x, seq, n: torch.zeros((n,) + tuple(x.shape[1:])))
    with pytest.raises(AssertionError):
        check_case(random.Random(rng_seed), torch.float32, logit_scale=300.0)
    monkeypatch.undo()
    check_case(random.Random(rng_seed), torch.float32, logit_scale=300.0)
    # 2. a chunk mapping off by one block: each chunk reads the block before its own
    good = paged.varlen_decode_chunks

    def off_by_one(tables, lens, bs):
        blocks, seq, bias = good(tables, lens, bs)
        return blocks.roll(1), seq, bias

    monkeypatch.setitem(globals(), "varlen_decode_chunks", off_by_one)
    with pytest.raises(AssertionError):
        check_case(random.Random(rng_seed), torch.float32)


def test_the_fused_cpu_kernel_and_the_plain_ops_agree():
    """The chunk attention runs torch's fused CPU kernel on CPU and plain ops elsewhere: both give the same output
    and log-sum-exp (the plain ops checked against torch.softmax / torch.logsumexp in float64)."""
    g = torch.Generator().manual_seed(2)
    q = torch.randn(5, 3, 2, 16, generator=g)
    k, v = torch.randn(5, 3, 24, 16, generator=g), torch.randn(5, 3, 24, 16, generator=g)
    bias = torch.zeros(5, 1, 1, 24).masked_fill_(
        torch.arange(24).view(1, 1, 1, 24) >= torch.tensor([24, 1, 7, 16, 9]).view(5, 1, 1, 1), float("-inf")
    )
    s = (q.double() @ k.double().transpose(-1, -2)) * 0.25 + bias.double()
    ref_out, ref_lse = torch.softmax(s, -1) @ v.double(), torch.logsumexp(s, -1)
    for fused in (True, False):
        out, lse = paged_kernels.attention_with_lse(q, k, v, bias, 0.25, fused=fused)
        assert (out.double() - ref_out).abs().max() < 1e-5 and (lse.double() - ref_lse).abs().max() < 1e-5


def test_bad_head_counts_are_refused():
    q, kc = torch.randn(2, 5, 8), torch.randn(4, 4, 2, 8)
    chunks = varlen_decode_chunks(torch.tensor([[0], [1]]), torch.tensor([2, 3]), 4)
    with pytest.raises(ValueError, match="n_heads=5 must be a multiple of n_kv_heads=2"):
        paged_decode_attention_varlen(q, kc, kc, *chunks)


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_the_engine_with_varlen_decodes_generates_what_the_grouped_path_does(engine_test_model, kv_cache_dtype):
    """Greedy tokens (and nearly the logprobs) of ``attention_backend="varlen"`` equal the grouped decode path's
    on a mixed batch: prefill chunks beside decodes, prefix-cache hits, preemption by recompute; an int8 pool
    reads through the same dequantizing ``read``."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 19, 33, 9)]
    prompts.append(prompts[2][:24] + [7, 8, 9])  # a shared prefix: blocks reused from the cache
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True, logprobs=0)
    opts = dict(block_size=4, num_blocks=22, max_num_batched_tokens=16, max_num_seqs=5, kv_cache_dtype=kv_cache_dtype)
    model = engine_test_model  # conftest: tiny, 300 tokens, weights x5 (no near-ties for argmax)
    ref = LLM(model, **opts)
    a = ref.generate(prompts, sp, use_tqdm=False)
    varlen = LLM(model, attention_backend="varlen", **opts)
    steps = []
    step = varlen.engine.runner.prepare

    def spy(scheduled):
        batch = step(scheduled)
        steps.append((batch.num_decodes, len(batch.prefills), batch.dec_varlen is not None))
        return batch

    varlen.engine.runner.prepare = spy
    b = varlen.generate(prompts, sp, use_tqdm=False)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert abs(x.outputs[0].cumulative_logprob - y.outputs[0].cumulative_logprob) < 1e-3
    assert any(d and p for d, p, _ in steps), "some step should mix decodes with prefill chunks"
    assert b[-1].num_cached_tokens > 0, "the shared prefix should hit the prefix cache"
    assert all(v == (d > 0) for d, _, v in steps), "every step with decodes takes the varlen path"
    for llm in (ref, varlen):
        assert sum(llm.engine.status()["preemptions"].values()) > 0, "the pool should have forced a preemption"
        assert llm.engine.num_blocks_used() == 0
