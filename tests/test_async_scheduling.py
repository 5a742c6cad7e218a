"""Async scheduling (``EngineConfig.async_scheduling``): the engine prepares step t+1 on a worker thread while
step t's forward runs. Its outputs equal the synchronous engine's (itself pinned to recomputation in
test_engine.py) for a mixed batch: prompt lengths, max_tokens, stop ids, n > 1, prefix-cache hits,
preemption by recompute and by swap, seeded sampling; every block comes back. Unseeded samples draw from the
engine's one generator in an order that moves with the schedule (a request added between steps is admitted
one step later), so they pass a chi-square test against the model's own probabilities instead. A look-ahead
that feeds the stale token of step t-1 instead of step t's fails the equality; an exception on the worker
surfaces from ``step()`` and leaves no thread behind."""

import gc
import threading

from _stats import chi2_pvalue

import pytest
import torch

from mlsys_nb.inference import LLM, EngineConfig, SamplingParams
from mlsys_nb.inference.engine import AsyncLLMEngine, LLMEngine

VOCAB = 300  # engine_test_model's vocabulary (tests/conftest.py ENGINE_VOCAB)
pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def model(engine_test_model):  # tests/conftest.py: tiny, VOCAB tokens, weights x5 (no argmax near-ties)
    return engine_test_model


def mixed_requests(seed=1, k=9, sampled=False):
    """Random prompts of 1..50 tokens (two share a 40-token prefix), max_tokens 3..19, stop ids, n = 2."""
    g = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, VOCAB, (int(torch.randint(1, 50, (1,), generator=g)),), generator=g).tolist()]
    prompts += [torch.randint(0, VOCAB, (45,), generator=g).tolist() for _ in range(k - 1)]
    prompts[4] = prompts[2][:40] + [7, 8, 9]  # prefix-cache hits once request 2 has computed its blocks
    prompts = [
        p[: int(torch.randint(1, len(p) + 1, (1,), generator=g))] if i % 3 == 1 else p for i, p in enumerate(prompts)
    ]
    reqs = []
    for i, p in enumerate(prompts):
        kw = dict(max_tokens=3 + 2 * i, ignore_eos=True)
        if i % 4 == 3:
            kw["stop_token_ids"] = list(range(0, VOCAB, 7))  # stops early, at a token id divisible by 7
        if i == 5:
            kw["n"] = 2
        if sampled:
            kw.update(temperature=0.9, top_p=0.95, seed=100 + i)  # unseeded: test_unseeded_sampling_distribution
        else:
            kw["temperature"] = 0
        reqs.append((f"r{i}", p, SamplingParams(**kw)))
    return reqs


def run(engine, reqs, first_wave=3):
    """``first_wave`` requests, then the others after two steps (so they can hit the cached prefixes)."""
    for rid, p, sp in reqs[:first_wave]:
        engine.add_request(rid, p, sp)
    outs, steps = {}, 0
    while engine.has_unfinished_requests() or steps < 2:
        if steps == 2:
            for rid, p, sp in reqs[first_wave:]:
                engine.add_request(rid, p, sp)
        for o in engine.step():
            if o.finished:
                outs[o.request_id] = [(c.token_ids, c.finish_reason, c.stop_reason, c.text) for c in o.outputs]
        steps += 1
    return outs


CONFIGS = {  # sampled too: the first one
    "prefix hits, chunks of 16 tokens, preempt by recompute": dict(
        num_blocks=24, block_size=4, max_num_batched_tokens=16, max_num_seqs=4
    ),
    "preempt by swap": dict(num_blocks=20, block_size=4, preemption_mode="swap"),
}


def both(model, reqs, **kw):
    """(sync outputs, async outputs, async engine)."""
    sync = run(LLMEngine(model, **kw), reqs)
    eng = LLMEngine(model, async_scheduling=True, **kw)
    return sync, run(eng, reqs), eng


@pytest.mark.parametrize("name", list(CONFIGS))
def test_async_outputs_equal_sync(model, name):
    kw = CONFIGS[name]
    for sampled in (False, True) if name == next(iter(CONFIGS)) else (False,):
        sync, asy, eng = both(model, mixed_requests(sampled=sampled), **kw)
        assert asy == sync, f"{name}, sampled={sampled}"
        assert eng.num_blocks_used() == 0 and not eng.requests, "every block comes back"
        eng.kv.manager.check_invariants()
        assert sum(eng.status()["preemptions"].values()) > 0, f"{name}: no preemption happened"
        if "prefix" in name:
            assert eng.stats["cached_tokens"] > 0, "the second wave should hit the first one's prefixes"
        lookahead = [s for s in eng.step_times if "lookahead" in s]
        assert len(lookahead) > len(eng.step_times) // 2, "most steps should come prepared by the worker"
        assert any(o[1] == "stop" for outs in sync.values() for o in outs), "a stop id should end some request"
        assert len(sync["r5"]) == 2
        eng.close()


def test_stale_token_breaks_the_equality(model, monkeypatch):
    """The idea broken: the look-ahead's batch keeps the token of step t-1 where step t's token belongs."""
    reqs = mixed_requests()
    kw = CONFIGS[next(iter(CONFIGS))]

    def stale_fill_in(self, sampled):
        nxt = self.lookahead.next
        if nxt is None or nxt[1] is None:
            return
        for seq in sampled:  # the manager gets the right token; the batch's input ids the stale one
            held = self.kv.manager.seqs.get(seq.seq_id)
            if held is not None and not seq.finished and len(held.tokens) >= seq.num_tokens:
                held.tokens[seq.num_tokens - 1] = seq.output_token_ids[-1]
        off = 0
        for seq, n in nxt[1].scheduled:
            if seq in sampled and not seq.finished:
                nxt[1].tokens[0, off] = seq.token_ids[-2]
            off += n

    monkeypatch.setattr(AsyncLLMEngine, "fill_in", stale_fill_in)
    sync, asy, eng = both(model, reqs, **kw)
    assert asy != sync, "feeding the stale token should have changed the outputs"
    eng.close()


def test_unseeded_sampling_distribution(model):
    """600 unseeded samples of two tokens (top_k=3), async on: the joint counts of (first, second) token
    follow the model's probabilities, p(a) p(b | a), by a chi-square test (the second token is sampled in a
    step the worker prepared with a placeholder)."""
    prompt, k = [5, 17, 42, 99], 3
    eng = LLMEngine(model, async_scheduling=True, max_num_seqs=128, max_num_batched_tokens=512, seed=3)
    eng.add_request("u", prompt, SamplingParams(temperature=1.0, top_k=k, max_tokens=2, ignore_eos=True, n=600))
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                pairs = [tuple(c.token_ids) for c in o.outputs]
    assert sum("lookahead" in s for s in eng.step_times) >= 1
    eng.close()

    def top(ids):
        with torch.no_grad():
            logits = model(torch.tensor([ids]))[0, -1]
        v, i = logits.topk(k)
        return i.tolist(), v.softmax(0).tolist()

    cells, probs = [], []
    for a, pa in zip(*top(prompt)):
        for b, pb in zip(*top(prompt + [a])):
            cells.append((a, b))
            probs.append(pa * pb)
    counts = [sum(p == c for p in pairs) for c in cells]
    assert sum(counts) == len(pairs), "every sample is one of the top-k x top-k pairs"
    assert chi2_pvalue(counts, probs) > 1e-3, (counts, probs)


def lookahead_threads():
    return [t for t in threading.enumerate() if t.name.startswith("mlsys-lookahead")]


def test_worker_exception_surfaces_and_no_thread_is_left(model, monkeypatch):
    eng = LLMEngine(model, async_scheduling=True)
    for rid, p, sp in mixed_requests()[:4]:
        eng.add_request(rid, p, sp)
    real, calls = eng.runner.prepare, []

    def prepare(scheduled):
        calls.append(threading.current_thread().name)
        if len(calls) == 3:
            raise FloatingPointError("injected into the look-ahead")
        return real(scheduled)

    monkeypatch.setattr(eng.runner, "prepare", prepare)
    with pytest.raises(RuntimeError, match="injected into the look-ahead") as info:
        for _ in range(10):
            eng.step()
    assert isinstance(info.value.__cause__, FloatingPointError)
    assert calls[2].startswith("mlsys-lookahead"), "the failing preparation ran on the worker"
    assert not lookahead_threads(), "the worker thread is joined after its failure"
    with pytest.raises(RuntimeError, match="stopped"):
        eng.step()


def test_a_failing_forward_fails_alone_with_async(model, monkeypatch):
    """A forward that raises while the look-ahead runs: the look-ahead is taken back, the culprit request fails
    alone, the others produce what the synchronous engine produces, and every block comes back."""
    sp = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    good = [(f"g{i}", [i + 1, 7, 9, i + 2], sp) for i in range(4)]
    ref = run(LLMEngine(model), good, first_wave=4)
    eng = LLMEngine(model, async_scheduling=True)
    poison = 299
    real_fwd, real_run = eng.runner.forward, eng.runner.run

    def poisoned(scheduled):  # its decodes raise (not its prompt); the worker may be appending to its outputs
        return any(poison in s.prompt_token_ids and n == 1 for s, n in scheduled)

    def forward(batch, timer=None):
        if poisoned(batch.scheduled):
            raise FloatingPointError("poisoned forward")
        return real_fwd(batch, timer)

    def run_alone(scheduled, timer=None):  # the isolation pass runs each request alone
        if poisoned(scheduled):
            raise FloatingPointError("poisoned forward")
        return real_run(scheduled, timer)

    monkeypatch.setattr(eng.runner, "forward", forward)
    monkeypatch.setattr(eng.runner, "run", run_alone)
    bad = ("bad", [poison, 1, 2], SamplingParams(temperature=0, max_tokens=10))
    for rid, p, s in good + [bad]:
        eng.add_request(rid, p, s)
    outs, errors = {}, {}
    while eng.has_unfinished_requests():
        for o in eng.step():
            if o.finished:
                (errors if o.error else outs)[o.request_id] = o
    assert "poisoned" in errors["bad"].error
    assert {
        r: [(c.token_ids, c.finish_reason, c.stop_reason, c.text) for c in o.outputs] for r, o in outs.items()
    } == ref
    assert eng.num_blocks_used() == 0
    eng.kv.manager.check_invariants()
    eng.close()


def test_close_mid_run_goes_on_synchronously(model):
    reqs = mixed_requests()
    kw = CONFIGS[next(iter(CONFIGS))]
    sync = run(LLMEngine(model, **kw), reqs)
    eng = LLMEngine(model, async_scheduling=True, **kw)
    real_step, calls = eng.step, []

    def step():
        calls.append(1)
        if len(calls) == 6:  # a batch prepared by the worker is waiting: dropped
            assert eng.lookahead.next is not None and eng.lookahead.next[0]
            eng.close()
        return real_step()

    eng.step = step
    assert run(eng, reqs) == sync
    assert eng.num_blocks_used() == 0 and not lookahead_threads()


def test_garbage_collection_joins_the_thread(model):
    """(``close()`` joins it too: test_close_mid_run_goes_on_synchronously.)"""
    llm = LLM(model, async_scheduling=True)
    llm.generate([[1, 2, 3]], SamplingParams(temperature=0, max_tokens=3), use_tqdm=False)
    assert lookahead_threads(), "the worker ran"
    del llm
    gc.collect()
    assert not lookahead_threads(), "the worker thread is left behind"


def test_async_scheduling_option():
    with pytest.raises(ValueError, match="async_scheduling"):
        EngineConfig(async_scheduling=1)
    with pytest.raises(ValueError, match="async_scheduling=True needs speculative_model=None"):
        EngineConfig(async_scheduling=True, speculative_model="ngram")
    import argparse

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_arguments(parser)
    assert EngineConfig.from_cli(parser.parse_args(["--async-scheduling"])).async_scheduling is True


def test_async_step_model_by_hand():
    from mlsys_nb.inference.metrics import async_step_model

    # the worker's 1 s hides behind a 3 s forward; 0.5 s of sampling stays in line
    assert async_step_model(1.0, 3.0, 0.5) == 3.5
    # a 4 s preparation outlasts the 3 s forward: the step waits for it
    assert async_step_model(4.0, 3.0, 0.5) == 4.5
    with pytest.raises(ValueError, match="rest_s"):
        async_step_model(1.0, 1.0, -1.0)
