"""Speculative decoding inside continuous batching (``spec_batch.BatchSpeculator`` in ``LLMEngine``):
greedy outputs equal the target alone for a mixed batch, every block returns to both pools, the prefix
cache never registers a rejected draft, and sampled tokens follow the target's filtered distribution
(chi-square); the broken ideas (no rejection rule, no rollback) fail the same checks."""

import copy
import dataclasses

import httpx
import numpy as np
import pytest
import torch
from _stats import chi2_pvalue

from mlsys_nb.config import load_model_preset
from mlsys_nb.inference import LLM, SamplingParams
from mlsys_nb.inference import speculative as spec
from mlsys_nb.inference.paged import NO_HASH, BlockManager
from mlsys_nb.inference.sampler import filter_probs
from mlsys_nb.models.transformer import Transformer

PROMPTS = [
    "the cat sat on the mat; the cat ",
    "abcabcabc",
    "x",
    "hello world hello world hello world, hello",
    "0123456789" * 4,
    "to be or not to be",
    "aaaa",
    "spec decoding in a batch: ",
]


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    target = Transformer(load_model_preset("tiny")).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(20)
    near = copy.deepcopy(target)  # a draft that agrees often
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in near.parameters():
            prm.mul_(1 + 0.1 * torch.randn(prm.shape, generator=g))
    torch.manual_seed(5)
    other = Transformer(load_model_preset("tiny")).eval()  # an unrelated draft: q far from p
    with torch.no_grad():
        other.lm_head.weight.mul_(20)
    return target, near, other


def _all_back(llm):
    eng = llm.engine
    eng.kv.manager.check_invariants()
    assert eng.num_blocks_used() == 0
    sp = eng.speculator
    if not sp.ngram:
        sp.kv.manager.check_invariants()
        assert sp.kv.manager.num_free_blocks() == sp.kv.manager.num_blocks and not sp.views


def test_greedy_mixed_batch_equals_the_target_alone_and_every_block_returns(models):
    torch.set_num_threads(1)
    target, near, _ = models
    plain = LLM(target, max_num_seqs=4)  # 8 requests, 4 at a time: requests join mid-run
    free = plain.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    cases = []
    for i, o in enumerate(free):
        c = o.outputs[0]
        kw = dict(temperature=0, max_tokens=8 + 2 * i, ignore_eos=i % 2 == 0)
        if i % 4 == 1:
            kw["stop"] = [c.text[4:6]]  # a stop string the output contains
        if i % 4 == 2:
            kw["stop_token_ids"] = [c.token_ids[5]]
        if i % 4 == 3:
            kw["logprobs"] = 2
        cases.append(SamplingParams(**kw))
    ref = plain.generate(PROMPTS, cases, use_tqdm=False)
    assert {o.outputs[0].finish_reason for o in ref} == {"stop", "length"}
    for draft in (near, "ngram"):
        llm = LLM(target, speculative_model=draft, num_speculative_tokens=3, max_num_seqs=4)
        got = llm.generate(PROMPTS, cases, use_tqdm=False)
        for r, o in zip(ref, got):
            a, b = r.outputs[0], o.outputs[0]
            assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == (
                a.text,
                a.token_ids,
                a.finish_reason,
                a.stop_reason,
            )
            if a.logprobs is not None:
                for la, lb in zip(a.logprobs, b.logprobs, strict=True):
                    assert la.keys() == lb.keys()
                    assert all(abs(la[t].logprob - lb[t].logprob) < 1e-4 and la[t].rank == lb[t].rank for t in la)
        stats = llm.spec_stats
        assert len(stats) == len(PROMPTS) and sum(s.accepted for s in stats) > 0
        assert sum(s.target_forwards for s in stats) < sum(len(o.outputs[0].token_ids) for o in got)
        _all_back(llm)
    # n > 1 and top-k in the batch: seeded samples reproduce, differ from each other; top_k=1 is greedy
    llm = LLM(target, speculative_model=near, num_speculative_tokens=3)
    two = SamplingParams(temperature=1.0, max_tokens=16, n=2, seed=7, ignore_eos=True)
    o1, o2 = (llm.generate(PROMPTS[:3], two, use_tqdm=False) for _ in range(2))
    assert [[c.token_ids for c in o.outputs] for o in o1] == [[c.token_ids for c in o.outputs] for o in o2]
    assert all(o.outputs[0].token_ids != o.outputs[1].token_ids for o in o1)
    top1 = SamplingParams(temperature=1.0, top_k=1, max_tokens=24, ignore_eos=True)
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    assert [o.outputs[0].token_ids for o in llm.generate(PROMPTS, top1, use_tqdm=False)] == [
        o.outputs[0].token_ids for o in plain.generate(PROMPTS, greedy, use_tqdm=False)
    ]
    _all_back(llm)


def _registered_tokens_are_real(llm, prompts, params):
    """Step the engine; after every step each running sequence's block-manager tokens are a prefix of
    its real tokens, and every block in the prefix cache holds real tokens (never a rejected draft);
    False at the first step that breaks this."""
    eng = llm.engine
    for i, p in enumerate(prompts):
        eng.add_request(f"r{i}", p, params)
    while eng.has_unfinished_requests():
        eng.step()
        m = eng.kv.manager
        for seq in eng.scheduler.running:
            toks = m.seqs[seq.seq_id].tokens
            if toks != seq.token_ids[: len(toks)]:
                return False
            for i, b in enumerate(m.seqs[seq.seq_id].table):
                if (
                    m.hash_of[b] != NO_HASH
                    and list(m.tokens_of[b]) != seq.token_ids[i * m.block_size :][: m.block_size]
                ):
                    return False
    return True


def test_rollback_keeps_rejected_drafts_out_of_the_prefix_cache(models, monkeypatch):
    torch.set_num_threads(1)
    target, _, other = models  # an unrelated draft: most drafts are rejected
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    llm = LLM(target, speculative_model=other, num_speculative_tokens=4, block_size=4)
    assert _registered_tokens_are_real(llm, PROMPTS, params)
    _all_back(llm)
    # broken: a rollback that keeps the rejected drafts' slots (no truncate) registers them
    monkeypatch.setattr(BlockManager, "truncate", lambda self, seq_id, n: None)
    llm = LLM(target, speculative_model=other, num_speculative_tokens=4, block_size=4)
    assert not _registered_tokens_are_real(llm, PROMPTS, params)


def _second_tokens(target, draft, params, n):
    """The token produced by the first speculative step (the 2nd token: the 1st comes from the prefill)."""
    llm = LLM(target, speculative_model=draft, num_speculative_tokens=2)
    outs = llm.generate([[1, 2, 3]] * n, [dataclasses.replace(params, seed=s) for s in range(n)], use_tqdm=False)
    assert all(len(s.accepted_per_step) >= 1 for s in llm.spec_stats)  # the 2nd token was speculated
    return np.bincount([o.outputs[0].token_ids[1] for o in outs], minlength=target.cfg.vocab_size)


def _marginal(target, params):
    """P(2nd token) = sum over t1 of P(t1) P(t2 | t1), both the target's filtered distributions."""
    with torch.no_grad():
        p1 = filter_probs(
            target(torch.tensor([[1, 2, 3]]))[0, -1].float(), params.temperature, params.top_k, params.top_p
        )
        t1 = torch.nonzero(p1).flatten()
        x = torch.cat([torch.tensor([[1, 2, 3]]).expand(len(t1), 3), t1[:, None]], 1)
        rows = target(x)[:, -1].float()
    p2 = torch.stack([filter_probs(r, params.temperature, params.top_k, params.top_p) for r in rows])
    return (p1[t1, None] * p2).sum(0).double().numpy()


def _passes(counts, p):
    """Nothing outside the support, and chi-square p > 1e-3 (bins with expected count < 5 merged)."""
    return chi2_pvalue(counts, p) > 1e-3


def test_sampled_tokens_follow_the_filtered_target_and_no_rejection_rule_fails(models, monkeypatch):
    torch.set_num_threads(1)
    target, _, other = models
    n = 300
    for params in (
        SamplingParams(temperature=8.0, top_k=4, max_tokens=4, ignore_eos=True),
        SamplingParams(temperature=1.0, top_p=0.6, max_tokens=4, ignore_eos=True),  # 9 tokens in the support
    ):
        p = _marginal(target, params)
        assert _passes(_second_tokens(target, other, params, n), p)
    # broken: every draft accepted (no min(1, p/q) coin): the 2nd token follows the draft
    monkeypatch.setattr(spec, "accept_prob", lambda pt, qt: torch.ones_like(pt))
    params = SamplingParams(temperature=8.0, top_k=4, max_tokens=4, ignore_eos=True)
    assert not _passes(_second_tokens(target, other, params, n), _marginal(target, params))


# ---- /metrics: vLLM's spec_decode_* counters against a recount from the draft log ------------------------
SPEC_K = 3


def _log_drafts(engine):
    """Wrap the engine's proposer: every draft as (prompt ids, output position of its first token, tokens)."""
    log, propose = [], engine.speculator.propose

    def logged(*a, **kw):
        drafts = propose(*a, **kw)
        log.extend(
            (tuple(d.seq.prompt_token_ids), len(d.seq.output_token_ids), list(d.tokens)) for d in drafts.values()
        )
        return drafts

    engine.speculator.propose = logged
    return log


def _greedy_reference(target, prompts, max_tokens):
    """The target alone's greedy output token ids (a plain engine, no speculation) per prompt (token ids)."""
    prompts = sorted(prompts)
    greedy = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
    outs = LLM(target).generate([list(p) for p in prompts], greedy, use_tqdm=False)
    return {p: o.outputs[0].token_ids for p, o in zip(prompts, outs)}


def _recount(log, ref):
    """The counters recomputed without the engine's acceptance code: at temperature 0 a draft's first n
    tokens are accepted when they equal the target alone's greedy tokens (``ref``) at those output
    positions. (drafts, draft tokens, accepted tokens, accepted per draft position)."""
    per_pos = [0] * SPEC_K
    accepted = 0
    for p, start, toks in log:
        n = 0
        while n < len(toks) and toks[n] == ref[p][start + n]:
            n += 1
        accepted += n
        for i in range(n):
            per_pos[i] += 1
    return len(log), sum(len(t) for _, _, t in log), accepted, per_pos


def _metrics_counters(url):
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics", timeout=10).text
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith("mlsys_nb_spec_decode_"):
                key = s.name.removeprefix("mlsys_nb_spec_decode_").removesuffix("_total")
                out[(key, s.labels.get("position"))] = s.value
    return out


def test_metrics_spec_decode_counters_equal_a_recount_from_the_draft_log(models, monkeypatch):
    """The server's /metrics (read by prometheus_client's parser) carries vLLM's spec_decode counters;
    after concurrent greedy requests they equal the recount from the draft log against the target alone,
    per draft position too, and 0 < acceptance rate < 1 (the near draft is often, not always, right).
    A counter that counts every drafted token as accepted fails the same comparison."""
    import concurrent.futures as cf
    import threading

    import uvicorn
    from serve_helpers import free_port, wait_health

    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.serve import build_app

    torch.set_num_threads(1)
    target, near, _ = models
    max_tokens = 16
    engine = LLMEngine(target, speculative_model=near, num_speculative_tokens=SPEC_K, max_num_seqs=4)
    log = _log_drafts(engine)
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(build_app(engine, "tiny"), host="127.0.0.1", port=port, log_level="warning"))
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    try:
        url = f"http://127.0.0.1:{port}"
        wait_health(url, timeout=60)
        body = {"max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}

        def post(p):
            r = httpx.post(url + "/v1/completions", json={"prompt": p, **body}, timeout=120)
            assert r.status_code == 200, r.text
            return r.json()["usage"]["completion_tokens"]

        with cf.ThreadPoolExecutor(6) as pool:  # 6 requests on 4 slots: drafts inside a changing batch
            assert list(pool.map(post, PROMPTS[:6], timeout=300)) == [max_tokens] * 6
        m = _metrics_counters(url)
    finally:
        srv.should_exit = True
        th.join(timeout=30)
    ref = _greedy_reference(target, {p for p, _, _ in log}, max_tokens)
    drafts, draft_tokens, accepted, per_pos = _recount(log, ref)
    assert (m[("num_drafts", None)], m[("num_draft_tokens", None)], m[("num_accepted_tokens", None)]) == (
        drafts,
        draft_tokens,
        accepted,
    )
    assert [m[("num_accepted_tokens_per_pos", str(i))] for i in range(SPEC_K)] == per_pos
    assert 0 < accepted / draft_tokens < 1 and per_pos == sorted(per_pos, reverse=True)
    # broken: every drafted token counted as accepted
    orig = spec.SpecDecodingCounters.observe
    monkeypatch.setattr(spec.SpecDecodingCounters, "observe", lambda self, nd, na: orig(self, nd, nd))
    llm = LLM(target, speculative_model=near, num_speculative_tokens=SPEC_K, max_num_seqs=4)
    log = _log_drafts(llm.engine)
    llm.generate(PROMPTS[:6], SamplingParams(**body), use_tqdm=False)
    assert {p for p, _, _ in log} <= set(ref)  # the same prompts as through the server
    c, (drafts, draft_tokens, accepted, _) = llm.engine.spec_counters, _recount(log, ref)
    assert (c.num_drafts, c.num_draft_tokens) == (drafts, draft_tokens) and c.num_accepted_tokens != accepted
