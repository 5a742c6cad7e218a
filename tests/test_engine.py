"""The serving engine: greedy outputs equal an independent reference token for token whatever the batch
composition, chunk size, preemptions (recompute and swap) and prefix caching; seeded sampling is
reproducible per request; logprobs, stops, errors, load_weights."""

import copy
import itertools

import pytest
import torch

from mlsys_nb.inference import LLM, SamplingParams
from mlsys_nb.inference.sampler import filter_probs
from mlsys_nb.models import Transformer

VOCAB = 300  # engine_test_model's vocabulary (tests/conftest.py ENGINE_VOCAB)


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model(engine_test_model):  # tests/conftest.py: tiny, VOCAB tokens, weights x5 (no argmax near-ties)
    return engine_test_model


def reference_greedy(model, prompt, n, eos=None):
    """Greedy decoding by recomputing the whole sequence every token (no cache, no engine)."""
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids]))[0, -1].argmax()))
            if ids[-1] == eos:
                break
    return ids[len(prompt) :]


def random_prompts(k, lo=1, hi=60, seed=1, vocab=VOCAB):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, vocab, (int(torch.randint(lo, hi, (1,), generator=g)),), generator=g).tolist()
        for _ in range(k)
    ]


GREEDY = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
CONFIGS = {
    "default": {},
    "chunks of 7 tokens": {"max_num_batched_tokens": 7},
    "no chunked prefill": {"enable_chunked_prefill": False, "max_num_batched_tokens": 128},
    "static batching": {"continuous_batching": False, "max_num_seqs": 3},
    "preempt by recompute": {"num_blocks": 24, "block_size": 4, "max_num_batched_tokens": 16},
    "preempt by swap": {"num_blocks": 24, "block_size": 4, "preemption_mode": "swap"},
    "swap pool too small (falls back to recompute)": {
        "num_blocks": 24,
        "block_size": 4,
        "preemption_mode": "swap",
        "swap_blocks": 12,
    },
    "no prefix caching, batch of 2": {"enable_prefix_caching": False, "max_num_seqs": 2},
}


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equals_reference(model, name):
    prompts = random_prompts(8)
    prompts[3] = prompts[1][:40] + [7, 8, 9]  # a shared prefix (prefix-cache hits)
    llm = LLM(model, **CONFIGS[name])
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    for p, o in zip(prompts, outs):
        assert o.prompt_token_ids == p
        assert o.outputs[0].token_ids == reference_greedy(model, p, 16), name
        assert o.outputs[0].finish_reason == "length"
    pre = llm.engine.status()["preemptions"]
    if "preempt" in name:
        assert sum(pre.values()) > 0, f"{name}: the configuration should have forced a preemption ({pre})"
    if name == "preempt by swap":
        assert pre["swap"] > 0 and pre["recompute"] == 0
    if "too small" in name:
        assert pre["swap"] > 0 and pre["recompute"] > 0
    assert llm.engine.num_blocks_used() == 0, "finished requests must free their blocks"
    llm.engine.kv.manager.check_invariants()


def register_at_allocation(monkeypatch):
    """Break the prefix-cache rule: register a prompt's full blocks when they are allocated, before the
    forward that computes their K/V (what the engine once did, with a second table to paper over it)."""
    from mlsys_nb.inference import paged

    allocate = paged.BlockManager.allocate

    def allocate_and_register(self, seq_id, token_ids):
        cached = allocate(self, seq_id, token_ids)
        self.mark_computed(seq_id, len(self.seqs[seq_id].tokens) // self.block_size * self.block_size)
        return cached

    monkeypatch.setattr(paged.BlockManager, "allocate", allocate_and_register)


def test_prefix_cache_hits_and_mid_prefill_preemption(model, monkeypatch):
    """A request preempted in the middle of its chunked prefill left registered but never computed
    blocks behind: only computed blocks may count as hits. Breaking that rule must break the output."""
    prompt = random_prompts(1, 40, 41, seed=5)[0]
    want = reference_greedy(model, prompt, 8)
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)

    def run():
        llm = LLM(model, block_size=4, max_num_batched_tokens=8)
        eng = llm.engine
        eng.add_request("a", prompt, sp)
        eng.step()  # 8 of 40 prompt tokens computed: 2 of its 10 blocks are prefix-cache hits
        eng.scheduler.preempt(eng.requests["a"][0])
        outs = []
        while eng.has_unfinished_requests():
            outs += [o for o in eng.step() if o.finished]
        return outs[0].outputs[0].token_ids

    assert run() == want
    register_at_allocation(monkeypatch)
    assert run() != want, "trusting registered-but-uncomputed blocks should have corrupted the output"


def test_a_reused_block_is_no_hit_until_its_new_owner_computes_it(model, monkeypatch):
    """The stale-block case: block b held computed K/V for prefix P, was handed to another request as
    its partial last block (overwritten), then to a request with prefix P whose chunked prefill is
    preempted before it writes b. b must not be a hit when that request comes back: the scheduler once
    kept its own "this block is computed" table, which still said yes for b from its first life."""
    n_blocks, bs = 10, 4
    p = random_prompts(1, 12, 13, seed=11)[0]
    e = random_prompts(1, (n_blocks - 2) * bs + 2, (n_blocks - 2) * bs + 3, seed=12)[0]
    d = p + random_prompts(1, 8, 9, seed=13)[0]
    want = reference_greedy(model, d, 6)

    def run():
        eng = LLM(model, block_size=bs, num_blocks=n_blocks, max_num_batched_tokens=64).engine
        man = eng.kv.manager
        for rid, prompt in (("p", p), ("e", e)):  # e takes every free block: p's second one as its last
            eng.add_request(rid, prompt, SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
            while eng.has_unfinished_requests():
                eng.step()
        eng.scheduler.max_num_batched_tokens = 1  # d's prefill writes one token, then d is preempted
        eng.add_request("d", d, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
        eng.step()
        seq = eng.requests["d"][0]
        table = man.block_table(seq.seq_id)
        eng.scheduler.preempt(seq)
        eng.scheduler.max_num_batched_tokens = 64
        outs = []
        while eng.has_unfinished_requests():
            outs += [o for o in eng.step() if o.finished]
        man.check_invariants()
        return table, outs[0].outputs[0].token_ids

    table, got = run()
    assert table[1] == 1, f"the scenario needs d's second block to be p's reused block 1, got table {table}"
    assert got == want

    register_at_allocation(monkeypatch)  # breaking the rule must break the output
    assert run()[1] != want, "a block registered before it is computed should have been hit with stale K/V"


def test_prefix_caching_saves_prefill(model):
    shared = random_prompts(1, 48, 49, seed=2)[0]
    prompts = [shared + [i] for i in range(4)]
    llm = LLM(model, block_size=16)
    outs = llm.generate(prompts[:1], GREEDY, use_tqdm=False) + llm.generate(prompts[1:], GREEDY, use_tqdm=False)
    assert [o.num_cached_tokens for o in outs] == [0, 48, 48, 48]
    for p, o in zip(prompts, outs):
        assert o.outputs[0].token_ids == reference_greedy(model, p, 16)


def test_swap_must_copy_back(model, monkeypatch):
    """The swap test is able to fail: a swap-in that forgets to copy the K/V back changes the outputs."""
    from mlsys_nb.inference.model_runner import SwapPool

    prompts = random_prompts(8)

    def forgetful_swap_in(self, sid, kv, blocks, first=0):
        self.free.extend(self.held.pop(sid))  # frees the CPU blocks without copying anything back

    monkeypatch.setattr(SwapPool, "swap_in", forgetful_swap_in)
    llm = LLM(model, num_blocks=24, block_size=4, preemption_mode="swap", enable_prefix_caching=False)
    outs = llm.generate(prompts, GREEDY, use_tqdm=False)
    assert llm.engine.status()["preemptions"]["swap"] > 0
    assert any(o.outputs[0].token_ids != reference_greedy(model, p, 16) for p, o in zip(prompts, outs))


def test_seeded_sampling_is_per_request(model):
    prompts = random_prompts(6, seed=3)
    sp = SamplingParams(temperature=0.8, top_p=0.9, top_k=50, max_tokens=12, seed=123, ignore_eos=True)
    alone = LLM(model, seed=0).generate([prompts[0]], sp, use_tqdm=False)[0].outputs[0].token_ids
    batched = (
        LLM(model, seed=7, max_num_batched_tokens=9)
        .generate(
            prompts, [sp] + [SamplingParams(temperature=1.0, max_tokens=12, ignore_eos=True)] * 5, use_tqdm=False
        )[0]
        .outputs[0]
        .token_ids
    )
    assert alone == batched, "a seeded request must not depend on its batch or on the engine seed"
    other = LLM(model).generate(
        [prompts[0]], SamplingParams(temperature=0.8, max_tokens=12, seed=124, ignore_eos=True), use_tqdm=False
    )
    assert other[0].outputs[0].token_ids != alone
    n3 = LLM(model).generate(
        [prompts[0]], SamplingParams(temperature=1.0, max_tokens=12, seed=5, n=3, ignore_eos=True), use_tqdm=False
    )[0]
    assert [c.index for c in n3.outputs] == [0, 1, 2] and len({tuple(c.token_ids) for c in n3.outputs}) == 3


def test_filter_probs_against_brute_force():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(50, generator=g)
    for temp, k, p in [(1.0, -1, 1.0), (0.7, 10, 1.0), (1.3, -1, 0.8), (0.5, 20, 0.5)]:
        probs = (logits / temp).softmax(-1)
        order = probs.argsort(descending=True).tolist()
        keep = order[:k] if k > 0 else order
        kept = probs[keep] / probs[keep].sum()
        mass, nucleus = 0.0, []
        for tok, q in zip(keep, kept.tolist()):
            if mass >= p:
                break
            nucleus.append(tok)
            mass += q
        want = torch.zeros(50)
        want[nucleus] = probs[nucleus] / probs[nucleus].sum()
        torch.testing.assert_close(filter_probs(logits, temp, k, p), want)


def test_logprobs_are_the_models(model):
    prompt = random_prompts(1, seed=4)[0]
    out = (
        LLM(model)
        .generate(prompt, SamplingParams(temperature=0, max_tokens=5, logprobs=2, ignore_eos=True), use_tqdm=False)[0]
        .outputs[0]
    )
    ids = list(prompt)
    total = 0.0
    with torch.no_grad():
        for tok, entry in zip(out.token_ids, out.logprobs):
            lp = model(torch.tensor([ids]))[0, -1].log_softmax(-1)
            assert entry[tok].rank == 1 and abs(entry[tok].logprob - float(lp[tok])) < 1e-4
            second = int(lp.topk(2).indices[1])
            assert abs(entry[second].logprob - float(lp[second])) < 1e-4 and entry[second].rank == 2
            total += float(lp[tok])
            ids.append(tok)
    assert abs(out.cumulative_logprob - total) < 1e-3


def test_stops(model):
    prompt = random_prompts(1, seed=6)[0]
    ref = reference_greedy(model, prompt, 16)
    llm = LLM(model)
    stop_tok = ref[5]
    o = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16, stop_token_ids=[stop_tok]), use_tqdm=False)[
        0
    ].outputs[0]
    assert o.finish_reason == "stop" and o.stop_reason == stop_tok and o.token_ids == ref[: ref.index(stop_tok) + 1]
    llm.engine.eos_token_ids = {stop_tok}  # the model's end-of-sequence id stops it unless ignore_eos
    o = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16), use_tqdm=False)[0].outputs[0]
    assert o.finish_reason == "stop" and o.token_ids == reference_greedy(model, prompt, 16, eos=stop_tok)
    o = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)[0]
    assert o.outputs[0].token_ids == ref
    text = llm.engine.decode(ref)
    stop = next(text[i : i + 1] for i in range(2, len(text)) if text[i : i + 1].isprintable() and text[i] != "\ufffd")
    o = (
        LLM(model)
        .generate(prompt, SamplingParams(temperature=0, max_tokens=16, stop=[stop], ignore_eos=True), use_tqdm=False)[0]
        .outputs[0]
    )
    assert o.finish_reason == "stop" and o.stop_reason == stop and o.text == text[: text.index(stop)]


def test_text_prompts_and_metrics(model):
    llm = LLM(model)
    outs = llm.generate(
        ["hello", "a longer prompt with words"],
        SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
        use_tqdm=False,
    )
    for o, p in zip(outs, ["hello", "a longer prompt with words"]):
        assert o.prompt == p and o.prompt_token_ids == list(p.encode())
        assert isinstance(o.outputs[0].text, str)
        m = o.metrics
        assert m.arrival_time <= m.first_token_time <= m.last_token_time <= m.finished_time
        assert len(m.token_times) == 4 and m.ttft >= 0 and m.tpot >= 0


def test_bad_inputs(model):
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)
    llm = LLM(model)
    with pytest.raises(ValueError, match="too long.*max_model_len=128"):
        llm.generate([[1] * 200], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match=r"\[0, 300\)"):
        llm.generate([[1, 999]], GREEDY, use_tqdm=False)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        LLM(model, enable_chunked_prefill=False, max_num_batched_tokens=16)
    with pytest.raises(ValueError, match="preemption_mode"):
        LLM(model, preemption_mode="drop")
    assert llm.generate([[1, 2, 3]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids  # still serves


def test_load_weights_clears_prefix_cache(model):
    prompt = random_prompts(1, 40, 41, seed=8)[0]
    llm = LLM(copy.deepcopy(model), block_size=8)
    llm.generate(prompt, GREEDY, use_tqdm=False)
    torch.manual_seed(1)
    new = Transformer(model.cfg).eval()
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(5)
    llm.load_weights(new.state_dict())
    out = llm.generate(prompt, GREEDY, use_tqdm=False)[0]
    assert out.num_cached_tokens == 0, "the prefix cache holds K/V of the old weights"
    assert out.outputs[0].token_ids == reference_greedy(new, prompt, 16)


@pytest.fixture(scope="module")
def hf_model():
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=320,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        initializer_range=0.1,
        rope_parameters={"rope_type": "default", "rope_theta": 5000.0},
    )
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"num_blocks": 20, "block_size": 4, "max_num_batched_tokens": 12},
        {"num_blocks": 20, "block_size": 4, "preemption_mode": "swap", "max_num_batched_tokens": 5},
    ],
    ids=["default", "chunks of 12 + preemption", "chunks of 5 + swap"],
)
def test_greedy_equals_transformers_generate(hf_model, kw):
    """The engine on a converted transformers Llama answers exactly what transformers' generate does."""
    prompts = random_prompts(6, 2, 50, seed=9, vocab=320)
    llm = LLM(hf_model, **kw)
    assert llm.engine.eos_token_ids == {hf_model.generation_config.eos_token_id}  # 2 in transformers 5
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=12), use_tqdm=False)
    with torch.no_grad():
        for p, o in zip(prompts, outs):
            want = hf_model.generate(
                torch.tensor([p]),
                attention_mask=torch.ones(1, len(p), dtype=torch.long),
                do_sample=False,
                max_new_tokens=12,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            assert o.outputs[0].token_ids == want
            assert o.outputs[0].finish_reason == ("stop" if want[-1] == 2 else "length")
    if kw:
        assert sum(llm.engine.status()["preemptions"].values()) > 0


def test_workload_prefix_hits_equal_the_analytical_count(model):
    from mlsys_nb.inference.engine import LLMEngine
    from mlsys_nb.inference.metrics import percentile, summarize
    from mlsys_nb.inference.workload import make_workload, run_workload, shared_prefix_tokens

    reqs = make_workload(
        10,
        rate=200.0,
        prompt_len=(20, 40),
        output_len=(2, 5),
        shared_prefix_len=17,
        n_prefixes=2,
        vocab_size=VOCAB,
        seed=3,
    )
    assert reqs == make_workload(
        10,
        rate=200.0,
        prompt_len=(20, 40),
        output_len=(2, 5),
        shared_prefix_len=17,
        n_prefixes=2,
        vocab_size=VOCAB,
        seed=3,
    )
    assert all(b.arrival_time > a.arrival_time for a, b in itertools.pairwise(reqs))
    eng = LLMEngine(model, block_size=4, max_num_seqs=1)  # one at a time: every earlier prefix is computed
    outs, secs = run_workload(eng, reqs, use_tqdm=False)
    assert eng.stats["cached_tokens"] == shared_prefix_tokens(reqs, 4) > 0
    assert [len(o.outputs[0].token_ids) for o in outs] == [r.max_tokens for r in reqs]
    s = summarize(outs, secs)
    assert s["ttft_ms_p50"] <= s["ttft_ms_p99"] and s["e2e_ms_p50"] >= s["ttft_ms_p50"]
    xs = [3.0, 1.0, 4.0, 1.5, 9.0]
    import numpy as np

    assert abs(percentile(xs, 90) - float(np.percentile(xs, 90))) < 1e-12


def test_load_weights_from_a_transformers_state_dict(hf_model):
    """RLHF pushes a trained transformers model's weights into a running engine."""
    transformers = pytest.importorskip("transformers")
    llm = LLM(copy.deepcopy(hf_model))
    torch.manual_seed(7)
    trained = transformers.LlamaForCausalLM(hf_model.config).eval()
    prompt = random_prompts(1, 10, 20, seed=11, vocab=320)[0]
    llm.load_weights(trained.state_dict())
    got = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=8, ignore_eos=True), use_tqdm=False)[0]
    with torch.no_grad():
        want = trained.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            do_sample=False,
            max_new_tokens=8,
            min_new_tokens=8,
            pad_token_id=0,
        )[0, len(prompt) :]
    assert got.outputs[0].token_ids == want.tolist()


def test_cuda_graphs_need_cuda(model):
    llm = LLM(model)
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA graphs need"):
            llm.engine.runner.capture_cuda_graphs()


def _static_decode(model, seed: int, steps: int):
    """Three requests stepped ``steps`` times, then their next (decode-only) batch packed (``StepBatch``) and loaded
    into the 8-row static buffers a CUDA graph captures (``StaticDecodeBatch``, on CPU): -> (batch, io)."""
    from mlsys_nb.inference.cuda_graphs import StaticDecodeBatch
    from mlsys_nb.inference.model_runner import StepBatch

    eng = LLM(model, block_size=4).engine
    for i, p in enumerate(random_prompts(3, 5, 30, seed=seed)):
        eng.add_request(str(i), p, SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
    for _ in range(steps):
        eng.step()
    scheduled = eng.scheduler.schedule().scheduled
    assert all(n == 1 for _, n in scheduled) and len(scheduled) == 3
    batch = StepBatch(eng.kv, scheduled)
    io = StaticDecodeBatch(eng.kv, 8, eng.kv.manager.blocks_needed(eng.max_model_len), "cpu")
    io.load(batch)
    return batch, io


def test_cuda_graph_padding_changes_nothing(model):
    """The CUDA-graph path's static buffers, run eagerly on CPU: a decode batch padded to its bucket by
    repeating row 0 gives the same logits as the unpadded packed batch."""
    batch, io = _static_decode(model, seed=12, steps=4)
    with torch.no_grad():
        want = model(batch.tokens, positions=batch.positions, cache=batch)[0, batch.sample_rows]
        got = model(io.tokens, positions=io.positions, cache=io)[0][:3][batch.sample_rows]
    # 8 padded rows vs 3 packed rows: the matmuls have other shapes, so the CPU's GEMM may block them
    # differently (fp32 rounding up to ~3e-5 seen on AMD EPYC); a padding bug moves logits by O(1)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


class _NoHostSync:
    """Raises on every op that reads a tensor back to the host or creates one from host data mid-forward
    (``.item()``/``int(t)``, ``nonzero``/boolean masks, ``torch.tensor``): each is a device sync on a GPU,
    and a CUDA graph's capture refuses it (the GPU pack's first run failed here: RoPE's bound check)."""

    OPS = {"_local_scalar_dense", "item", "is_nonzero", "nonzero", "masked_select", "lift_fresh", "lift_fresh_copy"}

    def __enter__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        ops = self.OPS

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func._schema.name.split("::")[-1] in ops:
                    raise RuntimeError(f"host sync inside the captured forward: {func}")
                return func(*args, **(kwargs or {}))

        self.mode = Mode()
        return self.mode.__enter__()

    def __exit__(self, *exc):
        return self.mode.__exit__(*exc)


def test_cuda_graph_forward_has_no_host_sync(model, monkeypatch):
    """What ``CUDAGraphRunner`` captures (the model over ``StaticDecodeBatch``'s buffers) runs no op that syncs with
    the host; with RoPE's device-side bound check back on (the cache not saying its positions were checked on
    the host), the same forward is caught."""
    from mlsys_nb.inference.cuda_graphs import StaticDecodeBatch

    _, io = _static_decode(model, seed=13, steps=3)
    with torch.inference_mode():
        with _NoHostSync():
            model(io.tokens, positions=io.positions, cache=io)
        monkeypatch.setattr(StaticDecodeBatch, "positions_checked", False)
        with pytest.raises(RuntimeError, match="host sync"), _NoHostSync():
            model(io.tokens, positions=io.positions, cache=io)


# ---- isolation: validation before queueing, atomic add_request, one request's failure is its own ----------
POISONED = [  # values that once passed validation and then broke every request's step
    ("temperature", dict(temperature=float("nan"))),
    ("top_p", dict(top_p=float("nan"))),
    ("seed", dict(seed=2**64 - 1, n=2)),
    ("logprobs", dict(logprobs=VOCAB + 1)),
    ("presence_penalty", dict(presence_penalty=float("inf"))),
    ("logit_bias", dict(logit_bias={VOCAB + 5: 1.0})),
    ("stop_token_ids", dict(stop_token_ids=[VOCAB])),
]


@pytest.mark.parametrize("param,kw", POISONED, ids=[p for p, _ in POISONED])
def test_poisoned_values_are_refused_before_anything_is_queued(model, param, kw):
    from mlsys_nb.inference.sampling_params import ParamError

    eng = LLM(model).engine
    with pytest.raises(ParamError) as e:
        eng.add_request("bad", [1, 2, 3], SamplingParams(**kw))
    assert e.value.param == param, e.value
    assert not eng.requests and not eng.scheduler.has_unfinished()


def test_tiny_temperature_and_top_p_sample_the_argmax(model):
    """temperature 1e-45 (raised to 0.01) and top_p 1e-320 (0 in float32) keep a finite distribution whose
    only token is the most likely one; without the guard on the top token top_p gives all-zero probabilities."""
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(0)) * 3
    probs = filter_probs(logits, 1.0, top_p=1e-320)
    assert torch.isfinite(probs).all() and int(probs.argmax()) == int(logits.argmax()) and float(probs.max()) == 1.0
    p = SamplingParams(temperature=1e-45)
    probs = filter_probs(logits, p.temperature)
    assert torch.isfinite(probs).all() and int(probs.argmax()) == int(logits.argmax())
    assert not torch.isfinite(filter_probs(logits, 1e-45)).all(), "the raw temperature overflows: the clamp matters"
    ref = LLM(model).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=8), use_tqdm=False)
    out = LLM(model).generate(
        [[1, 2, 3]] * 2, [SamplingParams(temperature=1e-45, max_tokens=8), SamplingParams(top_p=1e-320, max_tokens=8)]
    )
    assert [o.outputs[0].token_ids for o in out] == [ref[0].outputs[0].token_ids] * 2


def test_add_request_is_atomic(model):
    """All n samples or none: a failure while building the second sample leaves nothing queued."""
    eng = LLM(model).engine
    pr = eng.prepare([1, 2, 3], SamplingParams(n=3, seed=5))
    pr.generators = pr.generators[:1]  # the second sample cannot be built
    with pytest.raises(IndexError):
        eng.add_request("r", None, prepared=pr)
    assert not eng.requests and not eng.scheduler.has_unfinished(), "an orphan sample was queued"
    eng.add_request("ok", [1, 2, 3], SamplingParams(max_tokens=2))
    while eng.has_unfinished_requests():
        eng.step()
    assert eng.num_blocks_used() == 0


def _run(eng, reqs):
    for rid, prompt, sp in reqs:
        eng.add_request(rid, prompt, sp)
    outs = {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                outs[o.request_id] = o
    return outs


@pytest.mark.parametrize("where", ["sample", "forward"])
def test_a_failing_sequence_fails_alone(model, where, monkeypatch):
    """A request whose sampling (or forward pass) raises is finished with ``error``; the others produce exactly
    what they produce without it, and every block comes back."""
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    good = [(f"g{i}", [i + 1, 7, 9, i + 2], sp) for i in range(4)]
    ref = _run(LLM(model).engine, good)
    eng = LLM(model).engine
    poison = 299  # a prompt token that marks the failing request
    if where == "sample":
        import mlsys_nb.inference.sampler as sampler

        real = sampler.sample_row

        def row(logits, seq, *a):
            if poison in seq.prompt_token_ids and len(seq.output_token_ids) >= 3:
                raise FloatingPointError("poisoned row")
            return real(logits, seq, *a)

        monkeypatch.setattr(sampler, "sample_row", row)
    else:
        real = eng.runner.run

        def run(scheduled, timer=None):
            if any(poison in s.prompt_token_ids and s.output_token_ids for s, _ in scheduled):
                raise FloatingPointError("poisoned forward")
            return real(scheduled, timer=timer)

        monkeypatch.setattr(eng.runner, "run", run)
    outs = _run(eng, good + [("bad", [poison, 1, 2], SamplingParams(temperature=0.8, max_tokens=12, n=2, seed=1))])
    assert "poisoned" in outs["bad"].error and all(c.finish_reason == "abort" for c in outs["bad"].outputs)
    for rid, _, _ in good:
        assert outs[rid].error is None and outs[rid].outputs[0].token_ids == ref[rid].outputs[0].token_ids
    assert eng.num_blocks_used() == 0 and not eng.requests and eng.stats["requests_failed"] == 1


def test_logit_processors_against_a_reference(model):
    """process_logits (min_tokens, logit_bias, repetition/frequency/presence penalties) and min_p against a
    direct transcription of their definitions on random logits, and one greedy run steered by logit_bias."""
    import numpy as np

    from mlsys_nb.inference.sampler import process_logits
    from mlsys_nb.inference.sequence import Sequence

    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, VOCAB)
    prompt, out = [3, 5, 5, 9], [5, 7, 7, 7, 11]
    sp = SamplingParams(
        repetition_penalty=1.3,
        frequency_penalty=0.4,
        presence_penalty=-0.7,
        logit_bias={7: 2.5, 100: -30},
        min_tokens=8,
        max_tokens=20,
    )
    seq = Sequence(0, "r", prompt, sp)
    seq.output_token_ids = list(out)
    got = process_logits(torch.tensor(logits, dtype=torch.float32), seq, eos_token_ids=[256]).numpy()
    want = logits.copy()
    want[256] = -np.inf  # min_tokens: 5 generated < 8
    want[7] += 2.5
    want[100] -= 30
    for t in set(prompt) | set(out):
        want[t] = want[t] / 1.3 if want[t] > 0 else want[t] * 1.3
    for t in set(out):
        want[t] -= 0.4 * out.count(t) - 0.7
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    probs = filter_probs(torch.tensor(logits, dtype=torch.float32), 1.0, min_p=0.2).numpy()
    p = np.exp(logits - logits.max())
    p /= p.sum()
    p[p < 0.2 * p.max()] = 0
    np.testing.assert_allclose(probs, p / p.sum(), rtol=1e-5, atol=1e-7)
    target = 42
    o = LLM(model).generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=4, logit_bias={target: 100}))
    assert o[0].outputs[0].token_ids == [target] * 4


def test_step_times_window_keeps_memory_flat(model):
    """20,000 steps (the model's forward stubbed: the leak was the bookkeeping): the memory traced over the last
    1,000 steps (after 1,000 traced steps filled the window with traced records) stays flat; with an unbounded
    list of step records the same measurement grows (the check catches the leak)."""
    import tracemalloc

    from mlsys_nb.inference.model_runner import StepBatch

    def engine(window):
        eng = LLM(model, step_times_window=window).engine
        eng.runner.run = lambda scheduled, timer=None: (
            torch.zeros(sum(1 for s, n in scheduled if n == s.num_uncomputed), VOCAB),
            StepBatch(eng.kv, scheduled),
        )
        return eng

    def growth(eng, steps):
        sp = SamplingParams(temperature=0, max_tokens=100, ignore_eos=True)
        i, before = 0, None
        for k in range(steps):
            if not eng.has_unfinished_requests():
                eng.add_request(str(i), [1, 2, 3], sp)
                i += 1
            eng.step()
            if k == steps - 2001:
                tracemalloc.start()
            elif k == steps - 1001:
                before = tracemalloc.get_traced_memory()[0]
        after = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        return after - before

    eng = engine(500)
    flat = growth(eng, 20_000)
    assert flat < 50_000 and len(eng.step_times) == 500 and eng.num_steps == 20_000, flat
    leaky = engine(500)
    leaky.step_times = []
    assert growth(leaky, 2_500) > 150_000, "1,000 unbounded step records must show"


def test_the_teaching_generate_loop_equals_the_engine(model):
    """``generation.generate`` (one contiguous cache, one prefill, a decode loop) is a teaching loop: its
    greedy outputs equal the engine's for a batch of prompts of different lengths, EOS included."""
    from mlsys_nb.inference import ByteTokenizer, generate

    tok = ByteTokenizer()
    prompts = ["a", "Hello there", "The KV cache holds", "x" * 40]
    ours = generate(model, tok, prompts, max_new_tokens=12)
    sp = SamplingParams(temperature=0, max_tokens=12)
    theirs = LLM(model, tokenizer=tok).generate(prompts, sp, use_tqdm=False)
    for g, o in zip(ours, theirs):
        c = o.outputs[0]
        assert [t for t in c.token_ids if t != tok.eos_id] == g.token_ids
        assert (c.text, c.finish_reason) == (g.text, g.finish_reason)


def test_histogram_counts_equal_numpy_on_random_latencies():
    """``Histogram``'s cumulative buckets equal numpy's count of values <= each bound (random values, ties at
    the bounds included: Prometheus' ``le``); a histogram binning with ``<`` instead misses the ties."""
    import bisect

    import numpy as np

    from mlsys_nb.inference.sequence import TTFT_BUCKETS, Histogram

    rng = np.random.default_rng(0)
    xs = np.concatenate([rng.lognormal(-3, 2, 500), np.array(TTFT_BUCKETS[:5])])  # some exactly on a bound
    h = Histogram(TTFT_BUCKETS)
    for x in xs:
        h.observe(float(x))
    want = [int((xs <= b).sum()) for b in TTFT_BUCKETS]
    assert h.counts == want and h.count == len(xs) and abs(h.sum - xs.sum()) < 1e-9
    strict = [bisect.bisect_right(sorted(xs), b) - int((xs == b).sum()) for b in TTFT_BUCKETS]
    assert strict != want  # the "<" binning differs on the ties: the check above can fail
    with pytest.raises(ValueError, match="bounds"):
        Histogram((1.0, 0.5))
