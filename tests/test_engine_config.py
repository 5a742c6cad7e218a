"""``EngineConfig``: one set of engine options shared by ``LLM``, ``LLMEngine``, the ``Scheduler`` and the
server's command line; keywords override a config; bad values and unknown names are refused by name."""

import argparse
import dataclasses
import random

import pytest
import torch

from mlsys_nb.config import load_model_preset
from mlsys_nb.inference import LLM, EngineConfig, LLMEngine, SamplingParams
from mlsys_nb.inference.scheduler import Scheduler
from mlsys_nb.models import Transformer


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    m = Transformer(load_model_preset("tiny").replace(vocab_size=300)).eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(5)
    return m


def _random_config(rng: random.Random) -> EngineConfig:
    return EngineConfig(
        block_size=rng.choice([1, 4, 16]),
        num_blocks=rng.choice([None, 64, 300]),
        kv_cache_memory=rng.choice([2**20, 2**24]),
        kv_cache_dtype=rng.choice(["auto", "fp32", "bf16", "fp16"]),
        attention_backend=rng.choice(["gather", "tiled"]),
        max_num_seqs=rng.randint(1, 100),
        max_num_batched_tokens=rng.randint(1, 1000),
        enable_chunked_prefill=rng.random() < 0.5,
        enable_prefix_caching=rng.random() < 0.5,
        continuous_batching=rng.random() < 0.5,
        preemption_mode=rng.choice(["recompute", "swap"]),
        swap_blocks=rng.choice([None, 7]),
        seed=rng.randint(0, 10**6),
        step_times_window=rng.randint(1, 50),
        max_grammar_states=rng.randint(1, 10**6),
        num_speculative_tokens=rng.randint(1, 8),
        enforce_eager=rng.random() < 0.5,
    )


def test_keywords_and_a_config_give_the_same_engine_and_keywords_win(model):
    c = EngineConfig(block_size=4, max_num_seqs=3, max_num_batched_tokens=32, preemption_mode="swap", num_blocks=40)
    a = LLM(model, config=c)
    b = LLM(model, **dataclasses.asdict(c))
    assert a.config == b.config == c == a.engine.config
    for eng in (a.engine, b.engine):
        s = eng.scheduler
        assert (s.max_num_seqs, s.max_num_batched_tokens, s.preemption_mode) == (3, 32, "swap")
        assert eng.kv.block_size == 4 and eng.kv.manager.num_blocks == 40
    assert LLM(model, config=c, block_size=8).engine.kv.block_size == 8  # a keyword overrides the config
    assert LLMEngine(model, None, c, max_num_seqs=5).scheduler.max_num_seqs == 5
    sched = Scheduler(a.engine.kv.manager, EngineConfig(max_num_seqs=7, continuous_batching=False))
    assert sched.max_num_seqs == 7 and sched.continuous is False


def test_unknown_names_and_bad_values_are_refused_by_name():
    with pytest.raises(TypeError, match=r"unknown engine option\(s\) \['blok_size'\]: valid ones are \['block_size'"):
        EngineConfig.build(blok_size=4)
    for kwargs, msg in (
        ({"block_size": 0}, r"block_size must be an int >= 1, got"),
        ({"num_blocks": 1}, r"num_blocks must be an int >= 2, got"),
        ({"max_num_batched_tokens": 2.5}, r"max_num_batched_tokens must be an int"),
        ({"preemption_mode": "drop"}, r"preemption_mode"),
        ({"kv_cache_dtype": "int3"}, r"kv_cache_dtype"),
        ({"attention_backend": "flash"}, r"attention_backend"),
        ({"enable_prefix_caching": "yes"}, r"enable_prefix_caching must be True or False"),
        ({"enforce_eager": 1}, r"enforce_eager must be True or False"),
        ({"num_speculative_tokens": 0}, r"num_speculative_tokens must be an int >= 1, got"),
    ):
        with pytest.raises(ValueError, match=msg):
            EngineConfig(**kwargs)
    with pytest.raises(TypeError, match="config must be an EngineConfig"):
        EngineConfig.build({"block_size": 4})


def test_the_command_line_has_a_flag_per_field_and_round_trips_random_configs():
    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_arguments(parser)
    assert EngineConfig.from_cli(parser.parse_args([])) == EngineConfig()
    flags = set(vars(parser.parse_args([])))  # every flag's destination (help's is suppressed)
    assert flags == set(EngineConfig.fields()) - {"speculative_model"}
    rng = random.Random(0)
    for _ in range(30):
        c = _random_config(rng)
        argv = []
        for f in dataclasses.fields(c):
            v = getattr(c, f.name)
            if f.name == "speculative_model" or v is None:
                continue
            flag = "--" + f.name.replace("_", "-")
            if isinstance(v, bool):
                argv.append(flag if v else "--no-" + f.name.replace("_", "-"))
            else:
                argv += [flag, str(v)]
        assert EngineConfig.from_cli(parser.parse_args(argv)) == c


def test_a_bf16_kv_pool_stores_rounded_keys_and_holds_twice_the_blocks(model):
    prompts = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (9, 30)]
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    opts = dict(block_size=4, num_blocks=None, kv_cache_memory=2**20, max_num_seqs=1000)
    full, half = LLM(model, **opts), LLM(model, kv_cache_dtype="bf16", **opts)
    assert full.engine.kv.k.dtype == torch.float32 and half.engine.kv.k.dtype == torch.bfloat16
    assert half.engine.kv.manager.num_blocks == 2 * full.engine.kv.manager.num_blocks  # same bytes, half per value
    a, b = full.generate(prompts, sp, use_tqdm=False), half.generate(prompts, sp, use_tqdm=False)
    # layer 0's keys depend on the embeddings only: the bf16 pool holds exactly the fp32 keys rounded
    n_slots = sum(len(p) for p in prompts)
    k32, k16 = full.engine.kv.k[0].flatten(0, 1)[:n_slots], half.engine.kv.k[0].flatten(0, 1)[:n_slots]
    assert torch.equal(k16, k32.to(torch.bfloat16)) and not torch.equal(k16.float(), k32)
    assert [o.outputs[0].token_ids for o in a] == [o.outputs[0].token_ids for o in b]


def test_the_server_command_line_exposes_every_engine_option():
    from mlsys_nb.inference.serve import build_parser

    parser = build_parser()
    dests = set(vars(parser.parse_args([])))
    assert set(EngineConfig.fields()) - {"speculative_model", "num_speculative_tokens"} <= dests
    args = parser.parse_args(
        ["--block-size", "8", "--no-enable-prefix-caching", "--preemption-mode", "swap", "--kv-cache-dtype", "bf16"]
    )
    assert EngineConfig.from_cli(args) == EngineConfig(
        block_size=8, enable_prefix_caching=False, preemption_mode="swap", kv_cache_dtype="bf16"
    )
    assert (args.model, args.host, args.max_n) == ("tiny", "127.0.0.1", parser.get_default("max_n"))


def test_the_tiled_attention_backend_generates_what_the_gather_backend_does(model):
    """``attention_backend="tiled"`` (paged attention block by block with the online softmax) gives the greedy
    tokens and nearly the logprobs of the default gather-then-SDPA path: prefill chunks, decodes, prefix hits."""
    prompts = [torch.randint(0, 300, (n,), generator=torch.Generator().manual_seed(n)).tolist() for n in (5, 17, 33)]
    prompts.append(prompts[2][:20] + [7, 8, 9])  # a shared prefix: blocks reused from the cache
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    opts = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=3)
    a = LLM(model, **opts).generate(prompts, sp, use_tqdm=False)
    tiled = LLM(model, attention_backend="tiled", **opts)
    assert tiled.engine.kv.attention_backend == "tiled"
    b = tiled.generate(prompts, sp, use_tqdm=False)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert abs(x.outputs[0].cumulative_logprob - y.outputs[0].cumulative_logprob) < 1e-3


def test_cuda_graphs_are_the_default_on_cuda_and_each_refusal_says_why(model):
    """Which configurations capture CUDA-graph decode (the default on CUDA; ``enforce_eager=True`` turns it off) and
    why the others do not; on this CPU the engine says why it runs eager. The captured sizes cover every decode batch
    the engine can form (each fits the next size up), 1 to ``max_num_seqs`` capped at 512."""
    from mlsys_nb.inference.cuda_graphs import GRAPH_BUCKETS, cuda_graph_refusal, graph_buckets

    assert cuda_graph_refusal(EngineConfig(), "cuda") is None
    for kw, why in (
        ({"enforce_eager": True}, "enforce_eager=True"),
        ({"attention_backend": "tiled"}, "attention_backend='tiled'"),
        ({"attention_backend": "varlen"}, "attention_backend='varlen'"),
        ({"kv_cache_dtype": "int8"}, "kv_cache_dtype='int8'"),
        ({"kv_cache_dtype": "fp8"}, "kv_cache_dtype='fp8'"),
        ({"async_scheduling": True}, "async_scheduling=True"),
    ):
        assert why in cuda_graph_refusal(EngineConfig(**kw), "cuda"), kw
    assert cuda_graph_refusal(EngineConfig(), "cpu") == "the model is on cpu, not CUDA"
    eng = LLM(model).engine
    assert eng.cuda_graphs_off == "the model is on cpu, not CUDA" and eng.runner.graphs is None
    rng = random.Random(1)
    for n in [1, 2, 3, 64, 65, 511, 512, 513, 10_000] + [rng.randint(1, 2000) for _ in range(20)]:
        got = graph_buckets(n)
        assert list(got) == sorted(set(got)) and got[-1] == min(n, 512), (n, got)
        assert set(got) - {min(n, 512)} <= set(GRAPH_BUCKETS)
        for b in range(1, min(n, 512) + 1):  # a decode batch of b rows is padded to at most twice b
            up = next(x for x in got if x >= b)
            assert up < 2 * b or up == b, (n, b, up)
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_buckets(0)
