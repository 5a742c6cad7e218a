"""Speculative decoding: exactness (greedy token for token; sampled distribution by chi-square),
the broken rules caught by the same test, tokens per forward against the closed form."""

import copy

import numpy as np
import pytest
import torch
from _stats import chi2_pvalue

from mlsys_nb.config import ModelConfig
from mlsys_nb.inference import speculative as spec
from mlsys_nb.models.transformer import Transformer

V, K, N = 8, 3, 200_000


def _dists(seed):
    g = np.random.default_rng(seed)
    p = g.dirichlet(np.ones(V), size=K + 1) * 0.9 + 0.1 / V  # every target probability >= 1/80
    q = g.dirichlet(np.ones(V), size=K) * 0.9 + 0.1 / V
    return torch.tensor(p, dtype=torch.float32), torch.tensor(q, dtype=torch.float32)


def _trials(seed=0, drop_bonus=False):
    """N independent speculative steps with fixed per-position target p and draft q (vocabulary V):
    p-values of (first emitted token ~ p_1) and (tokens per step ~ the acceptance model)."""
    p, q = _dists(seed)
    g = torch.Generator().manual_seed(seed)
    P, Q = p.expand(N, K + 1, V), q.expand(N, K, V)
    draft = spec.sample_inverse_cdf(Q, torch.rand(N, K, generator=g))
    n_acc, nxt = spec.verify(P, Q, draft, torch.rand(N, K, generator=g), torch.rand(N, generator=g))
    first = torch.where(n_acc > 0, draft[:, 0], nxt)
    emitted = n_acc + (n_acc < K).long() if drop_bonus else n_acc + 1
    p_first = chi2_pvalue(np.bincount(first.numpy(), minlength=V), p[0].double().numpy())
    alpha = torch.minimum(p[:K], q).sum(-1).double().numpy()  # per-position acceptance probability
    reach = np.concatenate([[1.0], np.cumprod(alpha)])  # P(at least j accepted), j = 0..K
    p_len = np.append(reach[:-1] - reach[1:], reach[-1])  # P(n accepted = j)
    p_steps = chi2_pvalue(np.bincount(emitted.numpy() - 1, minlength=K + 1), p_len)
    return p_first, p_steps


def test_rejection_sampling_matches_target_distribution():
    for seed in (0, 1):
        p_first, p_steps = _trials(seed)
        assert p_first > 1e-3 and p_steps > 1e-3, (seed, p_first, p_steps)


def test_broken_rules_fail_the_same_test(monkeypatch):
    # 1. accept by comparing p and q only (no coin): accept iff p(d) >= q(d)
    with monkeypatch.context() as m:
        m.setattr(spec, "accept_prob", lambda pt, qt: (pt >= qt).float())
        assert min(_trials(0)) < 1e-9
    # 2. residual not renormalised: max(0, p - q) handed to the inverse-CDF sampler as is
    with monkeypatch.context() as m:
        m.setattr(spec, "residual", lambda p, q: (p - q).clamp_min(0.0))
        assert min(_trials(0)) < 1e-9
    # 3. forgetting the bonus token when all k drafts are accepted
    assert min(_trials(0, drop_bonus=True)) < 1e-9


def test_sampling_helpers():
    w = torch.tensor([[0.0, 0.25, 0.0, 0.75, 0.0]])
    assert int(spec.sample_inverse_cdf(w, torch.tensor([0.9999999]))) == 3  # never a zero-weight index
    assert int(spec.sample_inverse_cdf(w, torch.tensor([0.0]))) == 1
    p, q = torch.tensor([0.5, 0.5, 0.0]), torch.tensor([0.0, 0.5, 0.5])
    assert torch.allclose(spec.residual(p, q), torch.tensor([1.0, 0.0, 0.0]))
    acc = spec.accept_prob(torch.tensor([0.2, 0.6]), torch.tensor([0.4, 0.3]))
    assert torch.allclose(acc, torch.tensor([0.5, 1.0]))


def test_closed_form_against_simulation_and_best_k():
    g = np.random.default_rng(0)
    for alpha, k in ((0.5, 2), (0.8, 4), (0.95, 7)):
        acc = g.random((100_000, k)) < alpha
        tokens = np.cumprod(acc, axis=1).sum(1) + 1  # accepted prefix + correction or bonus
        assert tokens.mean() == pytest.approx(spec.expected_tokens_per_step(alpha, k), rel=0.01)
    assert spec.expected_tokens_per_step(1.0, 3) == 4.0
    assert spec.best_k(0.0, 0.1) == 0 and spec.best_k(0.9, 0.0, k_max=12) == 12
    ks = [spec.best_k(a, 0.05) for a in (0.5, 0.7, 0.8, 0.9, 0.95)]
    assert ks == sorted(ks) and ks[0] >= 1
    c = 0.05
    for a in (0.6, 0.9):
        kb = spec.best_k(a, c)
        assert all(spec.expected_speedup(a, kb, c) >= spec.expected_speedup(a, j, c) for j in range(17))
    with pytest.raises(ValueError, match="alpha"):
        spec.expected_tokens_per_step(1.5, 2)


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=257, seq_len=512)
    target = Transformer(cfg).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(20)  # peaked next-token distributions (a random init is nearly uniform)
    small = Transformer(ModelConfig(n_layers=1, hidden=32, n_heads=2, vocab_size=257, seq_len=512)).eval()
    near = copy.deepcopy(target)  # a draft close to the target: high acceptance
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in near.parameters():
            prm.mul_(1 + 0.1 * torch.randn(prm.shape, generator=g))
    return target, small, near


PROMPT = list(b"the cat sat on the mat; the cat sat on the ")


def test_greedy_equals_target_alone(models, monkeypatch):
    target, small, near = models
    ref, st = spec.speculative_generate(target, PROMPT, draft=None, max_new_tokens=32)
    assert st.target_forwards == 32
    for draft in (small, near, "ngram"):
        for k in (1, 3):
            out, s = spec.speculative_generate(target, PROMPT, draft=draft, k=k, max_new_tokens=32)
            assert out == ref, (draft if isinstance(draft, str) else "model", k)
    _, s = spec.speculative_generate(target, PROMPT, draft=near, k=4, max_new_tokens=32)
    assert s.target_forwards < 24  # several tokens per forward: the near copy agrees often
    # without rolling back the rejected drafts' cache entries the output changes
    monkeypatch.setattr(spec.CachedModel, "rollback", lambda self, n: None)
    try:
        out, _ = spec.speculative_generate(target, PROMPT, draft=near, k=3, max_new_tokens=32)
    except ValueError as e:  # or the stale entries fill the cache
        out = str(e)
    assert out != ref


def test_tokens_per_forward_match_closed_form(models):
    target, _, near = models
    for k in (3,):
        s_all = spec.SpecStats()
        for seed in range(2):
            _, s = spec.speculative_generate(
                target, PROMPT, draft=near, k=k, max_new_tokens=80, temperature=1.0, seed=seed
            )
            s_all.accepted += s.accepted
            s_all.tested += s.tested
            s_all.emitted += s.emitted
            s_all.target_forwards += s.target_forwards
        model = spec.expected_tokens_per_step(s_all.alpha, k)
        assert 0.3 < s_all.alpha < 1.0
        assert s_all.tokens_per_forward == pytest.approx(model, rel=0.10), (k, s_all.alpha)


def test_bad_arguments(models):
    target, _, _ = models
    with pytest.raises(ValueError, match="k must be an int >= 1, got 0"):
        spec.speculative_generate(target, PROMPT, draft="ngram", k=0)
    with pytest.raises(ValueError, match=r"draft \(or a Transformer\)=.* must be one of"):
        spec.speculative_generate(target, PROMPT, draft="gpt")
    with pytest.raises(ValueError, match="seq_len"):
        spec.speculative_generate(target, PROMPT, draft="ngram", max_new_tokens=600)
    other = Transformer(ModelConfig(n_layers=1, hidden=32, n_heads=2, vocab_size=300, seq_len=512))
    with pytest.raises(ValueError, match="vocab_size"):
        spec.speculative_generate(target, PROMPT, draft=other)


def test_llm_speculative_model_and_structured():
    import json

    import jsonschema

    from mlsys_nb.config import load_model_preset
    from mlsys_nb.inference import LLM, SamplingParams

    torch.manual_seed(0)
    target = Transformer(load_model_preset("tiny")).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(20)
    near = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in near.parameters():
            prm.mul_(1 + 0.1 * torch.randn(prm.shape, generator=g))
    prompts = ["the cat sat on the mat; the cat ", "abcabcabc"]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    ref = [o.outputs[0].token_ids for o in LLM(target).generate(prompts, greedy, use_tqdm=False)]
    for draft in (near, "ngram"):
        llm = LLM(target, speculative_model=draft, num_speculative_tokens=3)
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        assert [o.outputs[0].token_ids for o in outs] == ref
        assert sum(s.target_forwards for s in llm.spec_stats) < 48
    schema = {"type": "object", "required": ["a"], "properties": {"a": {"type": "array", "items": {"type": "integer"}}}}
    llm = LLM(target, speculative_model=near, num_speculative_tokens=4)
    for seed in range(2):
        o = llm.generate(
            ["x"], SamplingParams(json_schema=schema, max_tokens=30, temperature=1.5, seed=seed), use_tqdm=False
        )[0]
        jsonschema.validate(json.loads(o.outputs[0].text), schema)
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(target, speculative_model="ngram", num_speculative_tokens=0)


@pytest.fixture(scope="module")
def tiny_pair():
    from mlsys_nb.config import load_model_preset

    torch.manual_seed(0)
    target = Transformer(load_model_preset("tiny")).eval()
    with torch.no_grad():
        target.lm_head.weight.mul_(20)
    near = copy.deepcopy(target)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for prm in near.parameters():
            prm.mul_(1 + 0.1 * torch.randn(prm.shape, generator=g))
    return target, near


def test_speculative_llm_stops_at_every_end_of_sequence_id_as_the_engine_does(tiny_pair):
    """One implementation of the stop rules (``SamplingParams.finish``): with two end-of-sequence ids, the
    speculative path stops at the larger one too, as the engine does (it once stopped at ``min(eos)`` only)."""
    from mlsys_nb.inference import LLM, SamplingParams

    target, near = tiny_pair
    prompts = ["the cat sat on the mat; the cat "]
    plain = LLM(target)
    free = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    toks = free[0].outputs[0].token_ids
    second_eos = max(toks[4:10])  # a token the greedy output reaches within 10 steps
    first = toks.index(second_eos)
    params = SamplingParams(temperature=0, max_tokens=24)
    spec = LLM(target, speculative_model=near, num_speculative_tokens=3)
    for llm in (plain, spec):
        llm.engine.eos_token_ids = {min(llm.engine.eos_token_ids), second_eos}
    assert second_eos > min(plain.engine.eos_token_ids)
    a = plain.generate(prompts, params, use_tqdm=False)[0].outputs[0]
    b = spec.generate(prompts, params, use_tqdm=False)[0].outputs[0]
    assert a.token_ids == toks[: first + 1] and a.finish_reason == "stop"
    assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == (a.text, a.token_ids, "stop", None)


def test_speculative_llm_stops_logprobs_and_n_match_the_engine(tiny_pair):
    """Greedy with stop strings, stop token ids and logprobs: the speculative path returns what the
    continuous-batching engine returns alone (text, token ids, finish and stop reasons, raw logprobs)."""
    from mlsys_nb.inference import LLM, SamplingParams

    target, near = tiny_pair
    prompts = ["the cat sat on the mat; the cat ", "abcabcabc"]
    plain = LLM(target)
    ref_all = plain.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True), use_tqdm=False)
    text0 = ref_all[0].outputs[0].text
    stop_str = text0[5:8]  # a string the greedy output does contain
    stop_tok = ref_all[1].outputs[0].token_ids[6]
    cases = [
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop=[stop_str]),
        SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, stop_token_ids=[stop_tok], logprobs=2),
    ]
    ref = plain.generate(prompts, cases, use_tqdm=False)
    for draft in (near, "ngram"):
        got = LLM(target, speculative_model=draft, num_speculative_tokens=3).generate(prompts, cases, use_tqdm=False)
        for r, o in zip(ref, got):
            a, b = r.outputs[0], o.outputs[0]
            assert (b.text, b.token_ids, b.finish_reason, b.stop_reason) == (
                a.text,
                a.token_ids,
                a.finish_reason,
                a.stop_reason,
            )
        a, b = ref[1].outputs[0], got[1].outputs[0]
        for la, lb in zip(a.logprobs, b.logprobs):
            assert la.keys() == lb.keys()
            assert all(abs(la[t].logprob - lb[t].logprob) < 1e-4 and la[t].rank == lb[t].rank for t in la)
        assert abs(a.cumulative_logprob - b.cumulative_logprob) < 1e-3
    # n samples, seeded: reproducible, and different from each other
    llm = LLM(target, speculative_model=near, num_speculative_tokens=3)
    two = SamplingParams(temperature=1.0, max_tokens=16, n=2, seed=7, ignore_eos=True)
    o1, o2 = (llm.generate(["x"], two, use_tqdm=False)[0] for _ in range(2))
    assert [c.token_ids for c in o1.outputs] == [c.token_ids for c in o2.outputs]
    assert len(o1.outputs) == 2 and o1.outputs[0].token_ids != o1.outputs[1].token_ids
    # top_k = 1 at temperature 1 is greedy: equal to the target alone
    one = LLM(target, speculative_model=near, num_speculative_tokens=3).generate(
        prompts, SamplingParams(temperature=1.0, top_k=1, max_tokens=24, ignore_eos=True), use_tqdm=False
    )
    assert [o.outputs[0].token_ids for o in one] == [o.outputs[0].token_ids for o in ref_all]


# The chi-square test of top-k / top-p under speculation (and its broken variant) lives in
# tests/test_spec_batch.py: there the first token is the prefill's, so it tests the 2nd token's marginal.
