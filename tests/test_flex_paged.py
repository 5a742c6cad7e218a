"""``attention_backend="flex"``: FlexAttention over the paged pool read in place, through a block mask built from the
block tables (``flex_paged.py``). Checked against float64 softmax attention over each sequence's contiguous K/V and
against ``paged_attention`` (the gather backend) on random block tables, lengths, query lengths (decodes and prefill
chunks) and GQA ratios; a page table off by one block fails the check; the engine with ``attention_backend="flex"``
generates the default backend's greedy tokens. Eager FlexAttention (PyTorch's unfused reference) for the random cases,
one compiled decode shape (inductor, one compile for this module) for the engine's compiled path."""

import random

import pytest
import torch

from mlsys_nb.inference import LLM, SamplingParams
from mlsys_nb.inference.flex_paged import FlexPagedAttention, decode_bucket, flex_block_mask, paged_attention_flex
from mlsys_nb.inference.paged import paged_attention

TOL = 2e-5  # fp32 attention vs the float64 reference, times (1 + max |reference|); measured 2.5e-7 (and 6e-7 vs gather)


def random_case(rng: random.Random, q_len=None):
    """Random batch 1..6, block size, GQA ratio, context lengths 1..70 and query length (1: decodes; else a chunk of
    each sequence's last q_len tokens); each sequence's contiguous K/V scattered into a pool through a shuffled block
    table padded with random blocks. -> (q [b, h, q_len, d], pools, tables, lens, contiguous K/V per sequence)."""
    b, bs = rng.randint(1, 6), rng.choice([2, 4, 8])
    n_kv, group = rng.choice([(1, 1), (2, 3), (4, 1), (2, 4), (1, 4)])
    h, d = n_kv * group, rng.choice([8, 16])
    q_len = rng.choice([1, 1, 3, 9]) if q_len is None else q_len
    lens = [rng.randint(q_len, 70) for _ in range(b)]
    width = max(-(-n // bs) for n in lens)
    num_blocks = sum(-(-n // bs) for n in lens) + 3
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(rng.randrange(1 << 30))).tolist()
    kc, vc = torch.randn(num_blocks, bs, n_kv, d), torch.randn(num_blocks, bs, n_kv, d)
    tables, contig = [], []
    for n in lens:
        own = [perm.pop() for _ in range(-(-n // bs))]
        k, v = torch.randn(n, n_kv, d), torch.randn(n, n_kv, d)
        for p in range(n):  # block table entry p // bs holds position p at offset p % bs
            kc[own[p // bs], p % bs], vc[own[p // bs], p % bs] = k[p], v[p]
        tables.append(own + [rng.randrange(num_blocks)] * (width - len(own)))
        contig.append((k, v))
    return torch.randn(b, h, q_len, d), kc, vc, torch.tensor(tables), torch.tensor(lens), contig


def reference(q, k, v):
    """float64 causal attention of q [h, q_len, d] (the last q_len positions) over contiguous K/V [n, n_kv, d]."""
    h, q_len, d = q.shape
    n, g = k.shape[0], h // k.shape[1]
    kk, vv = k.double().repeat_interleave(g, dim=1), v.double().repeat_interleave(g, dim=1)  # [n, h, d]
    s = torch.einsum("hqd,nhd->hqn", q.double(), kk) / d**0.5
    q_pos = torch.arange(n - q_len, n).view(q_len, 1)
    s = s.masked_fill(torch.arange(n).view(1, n) > q_pos, float("-inf"))
    return torch.einsum("hqn,nhd->hqd", torch.softmax(s, dim=-1), vv)


def check_case(case, tables=None, attend=paged_attention_flex):
    q, kc, vc, good_tables, lens, contig = case
    out = attend(q, kc, vc, good_tables if tables is None else tables, lens)
    assert out.shape == q.shape and out.dtype == q.dtype and torch.isfinite(out).all()
    ref = torch.stack([reference(q[i], *contig[i]) for i in range(len(lens))])
    assert (out.double() - ref).abs().max().item() < TOL * (1 + ref.abs().max().item())
    gather = paged_attention(q, kc, vc, good_tables, lens)  # the default backend, an independent implementation
    assert (out - gather).abs().max().item() < TOL * (1 + ref.abs().max().item())


def test_flex_equals_float64_attention_and_the_gather_backend():
    rng = random.Random(0)
    for _ in range(16):
        check_case(random_case(rng))


def test_a_page_table_off_by_one_block_fails():
    """Every sequence reads the physical block after its own for its first logical block: the check catches it."""
    rng = random.Random(1)
    for _ in range(4):
        case = random_case(rng, q_len=1)
        q, kc, vc, tables, lens, contig = case
        check_case(case)
        bad = tables.clone()
        bad[:, 0] = (bad[:, 0] + 1) % kc.shape[0]
        with pytest.raises(AssertionError):
            check_case(case, tables=bad)


def test_the_block_mask_lists_each_sequences_blocks_in_table_order():
    """Blocks wholly before the query are "full" (no mask_mod), the rest (the last, partly filled one) partial."""
    tables, lens = torch.tensor([[5, 2, 0], [3, 9, 4]]), torch.tensor([5, 9])  # 2 and 3 blocks of 4 tokens
    mask = flex_block_mask(tables, lens, q_len=1, num_blocks=10, block_size=4)
    assert mask.full_kv_num_blocks.view(-1).tolist() == [1, 2] and mask.kv_num_blocks.view(-1).tolist() == [1, 1]
    assert mask.full_kv_indices[0, 0, 0, :1].tolist() == [5] and mask.full_kv_indices[1, 0, 0, :2].tolist() == [3, 9]
    assert mask.kv_indices[0, 0, 0, :1].tolist() == [2] and mask.kv_indices[1, 0, 0, :1].tolist() == [4]


def test_bad_head_counts_are_refused():
    q, kc = torch.randn(1, 5, 1, 8), torch.randn(4, 4, 2, 8)
    with pytest.raises(ValueError, match="n_heads=5 must be a multiple of n_kv_heads=2"):
        paged_attention_flex(q, kc, kc, torch.tensor([[0]]), torch.tensor([3]))


def test_the_compiled_kernel_gives_the_same_attention_on_one_graph_per_bucket():
    """``FlexPagedAttention(compiled=True)`` (the engine's ``compile=True`` path) runs the fused kernel inductor builds
    on decode calls padded to ``decode_bucket`` rows: 3 and 4 running sequences share one compiled graph (one compile,
    several seconds on CPU) and both equal float64 attention and the gather backend; prefill chunks go to gather."""
    from torch._dynamo.utils import counters

    assert [decode_bucket(b) for b in (1, 2, 3, 4, 5, 8, 9, 64)] == [1, 2, 4, 4, 8, 8, 16, 64]
    rng = random.Random(7)
    q, kc, vc, tables, lens, contig = random_case(rng, q_len=1)
    while len(lens) < 4:
        q, kc, vc, tables, lens, contig = random_case(rng, q_len=1)
    graphs = None
    for b in (4, 3):  # the same pool, 4 rows then 3 (padded to 4)
        case = (q[:b], kc, vc, tables[:b], lens[:b], contig[:b])
        attend = FlexPagedAttention(compiled=True)
        check_case(case, attend=attend)
        graphs = counters["stats"]["unique_graphs"] if graphs is None else graphs
    assert counters["stats"]["unique_graphs"] == graphs, "3 rows padded to 4 reuse the graph of 4"
    chunk = random_case(rng, q_len=3)
    check_case(chunk, attend=FlexPagedAttention(compiled=True))  # chunks: the gather backend


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "int8"])
def test_the_engine_with_flex_generates_what_the_gather_backend_does(engine_test_model, kv_cache_dtype):
    """Greedy tokens (and nearly the logprobs) of ``attention_backend="flex"`` equal the default backend's on a mixed
    batch: prefill chunks beside decodes (all decodes in one call), prefix-cache hits, preemption by recompute; an
    int8 pool reads through the same dequantizing ``read``."""
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 19, 33, 9)]
    prompts.append(prompts[2][:24] + [7, 8, 9])  # a shared prefix: blocks reused from the cache
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    opts = dict(block_size=4, num_blocks=22, max_num_batched_tokens=16, max_num_seqs=5, kv_cache_dtype=kv_cache_dtype)
    a = LLM(engine_test_model, **opts).generate(prompts, sp, use_tqdm=False)
    flex = LLM(engine_test_model, attention_backend="flex", **opts)
    decode_calls = []
    prepare = flex.engine.runner.prepare

    def spy(scheduled):
        batch = prepare(scheduled)
        decode_calls.append(len(getattr(batch, "dec_groups", [])) if batch.num_decodes else 0)
        return batch

    flex.engine.runner.prepare = spy
    b = flex.generate(prompts, sp, use_tqdm=False)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert abs(x.outputs[0].cumulative_logprob - y.outputs[0].cumulative_logprob) < 1e-3
    assert set(decode_calls) - {0} == {1}, "all decodes of a step in one flex call"
    assert b[-1].num_cached_tokens > 0, "the shared prefix should hit the prefix cache"
    assert flex.engine.num_blocks_used() == 0
