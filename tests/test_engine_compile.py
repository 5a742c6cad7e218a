"""``EngineConfig.compile=True``: the model's forward compiled with ``torch.compile`` (``compiled.CompiledModel``,
attention one opaque op). Its greedy tokens equal eager's; after the first step compiled one graph (symbolic in the
packed token count T; a lone decode padded to T = 2) no batch size 1..64 recompiles (a compile-counting backend
counts the graphs; a sweep 1, 2, 3, 7, 8, 16, 33, 64 on an engine of 64 sequences); with the token count not marked
dynamic every new batch size is a new graph (the mutation). One inductor compile for the module (tens of seconds on
a busy CPU); the recompile counts of the mutation use dynamo's graphs without code generation (backend "eager")."""

import pytest
import torch

from mlsys_nb.inference import LLM, EngineConfig, SamplingParams
from mlsys_nb.inference.compiled import CompiledModel

OPTS = dict(block_size=4, max_num_batched_tokens=16, max_num_seqs=8)
WIDE = dict(block_size=4, max_num_batched_tokens=128, max_num_seqs=64)  # every 2-token prompt of 64 in one step
SWEEP = (1, 2, 3, 7, 8, 16, 33, 64)  # batch sizes: 1 (a lone decode, padded), odd, powers of two, 64
SP = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)


def prompts(n: int, length: int = 2, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 300, (length,), generator=g).tolist() for _ in range(n)]


def decode_batches(llm, sizes=range(1, 9)) -> None:
    """For each size B: B two-token prompts (a prefill step of 2B tokens), then decode steps of B tokens."""
    for b in sizes:
        llm.generate(prompts(b, seed=b), SP, use_tqdm=False)


@pytest.fixture(scope="module")
def compiled_llm(engine_test_model):
    return LLM(engine_test_model, compile=True, **OPTS)


def test_compiled_greedy_tokens_equal_eager(engine_test_model, compiled_llm):
    """A mixed workload: chunked prefills beside decodes, a prefix-cache hit; tokens equal, logprobs within 1e-3."""
    g = torch.Generator().manual_seed(3)
    ps = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 19, 33, 9)]
    ps.append(ps[2][:24] + [7, 8, 9])
    sp = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, logprobs=0)
    a = LLM(engine_test_model, **OPTS).generate(ps, sp, use_tqdm=False)
    b = compiled_llm.generate(ps, sp, use_tqdm=False)
    for x, y in zip(a, b):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids
        assert abs(x.outputs[0].cumulative_logprob - y.outputs[0].cumulative_logprob) < 1e-3
    stats = compiled_llm.engine.status()["compile"]
    assert stats["graphs"] == 1 and stats["compile_seconds"] > 0  # one graph for every T


def test_no_recompilation_across_batch_sizes_after_warm_up(compiled_llm):
    warm = dict(compiled_llm.engine.status()["compile"])  # warmed up by the test above
    decode_batches(compiled_llm)  # decode steps of T = 1..8 tokens (T = 1: a lone decode), prefills of 2..16
    assert compiled_llm.engine.status()["compile"] == warm == {"graphs": 1, "compile_seconds": warm["compile_seconds"]}
    wide = LLM(compiled_llm.engine.model, compile=True, **WIDE)  # a second engine on the same weights: no compile
    assert wide.engine.runner.compiled is compiled_llm.engine.runner.compiled
    decode_batches(wide, SWEEP)  # decode steps of T = 1..64 tokens, prefills of 2..128 tokens in one step
    steps = {st["num_tokens"] for st in wide.engine.step_times}
    assert {1, 7, 33, 64, 66, 128} <= steps, steps  # those batch sizes really ran as steps of that many tokens
    assert wide.engine.status()["compile"] == warm


def test_the_generated_code_fuses_rmsnorm_rope_and_swiglu(compiled_llm):
    """Inductor's code for the compiled forward: the attention op once per layer, the matmuls as library calls,
    and the elementwise work in fused C++ loops: RMSNorm (mean, rsqrt, mul) with the residual add, SwiGLU (silu,
    mul), RoPE (index, mul, sub), read from the Python module inductor wrote for this forward."""
    from mlsys_nb.inference.compiled import generated_kernels

    code = generated_kernels()
    assert code["attention_calls"] == compiled_llm.engine.model.cfg.n_layers
    assert code["extern"]["mm"] >= 4 * code["attention_calls"]  # q/k/v/o (or fused qkv) and the MLP, per layer
    names = " ".join(code["fused"])
    for ops in (("add", "mean", "rsqrt"), ("silu", "mul"), ("index", "mul", "sub")):
        assert any(all(op in k for op in ops) for k in code["fused"]), (ops, names)


def test_flex_attention_compiled_in_the_engine_generates_the_same_tokens(engine_test_model, compiled_llm):
    """``attention_backend="flex"`` with ``compile=True``: decodes through FlexAttention's fused kernel, one compile per
    power-of-two decode batch (here 1 and 2), chunks through gather; greedy tokens equal eager gather's."""
    from torch._dynamo.utils import counters

    g = torch.Generator().manual_seed(5)
    ps = [torch.randint(0, 300, (n,), generator=g).tolist() for n in (3, 19, 9)]
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True, logprobs=0)
    opts = dict(OPTS, max_num_seqs=2)
    a = LLM(engine_test_model, **opts).generate(ps, sp, use_tqdm=False)
    flex = LLM(engine_test_model, compile=True, attention_backend="flex", **opts)
    b = flex.generate(ps, sp, use_tqdm=False)
    graphs = counters["stats"]["unique_graphs"]
    b2 = flex.generate(ps, sp, use_tqdm=False)  # the same batches again: nothing new to compile
    for x, y, z in zip(a, b, b2):
        assert x.outputs[0].token_ids == y.outputs[0].token_ids == z.outputs[0].token_ids
        assert abs(x.outputs[0].cumulative_logprob - y.outputs[0].cumulative_logprob) < 1e-3
    assert counters["stats"]["unique_graphs"] == graphs
    assert flex.engine.runner.compiled is compiled_llm.engine.runner.compiled  # the model's one graph, shared


@pytest.mark.parametrize("dynamic", [True, False])
def test_a_token_count_not_marked_dynamic_recompiles(engine_test_model, dynamic):
    torch._dynamo.reset()  # graphs per code object are capped (recompile_limit): start from none
    llm = LLM(engine_test_model, **OPTS)
    llm.engine.runner.compiled = CompiledModel(llm.engine.model, dynamic=dynamic, backend="eager")
    decode_batches(llm, [1, 2, 3])  # T = 2, 1, 4, 2, 6, 3
    graphs = llm.engine.runner.compiled.stats["graphs"]
    assert graphs == 1 if dynamic else graphs == 5


def test_compile_is_an_engine_option_and_a_flag():
    import argparse

    parser = argparse.ArgumentParser()
    EngineConfig.add_cli_arguments(parser)
    assert EngineConfig.from_cli(parser.parse_args(["--compile"])).compile is True
    assert EngineConfig().compile is False
    with pytest.raises(ValueError, match="compile must be True or False"):
        EngineConfig(compile="yes")
    with pytest.raises(ValueError, match="backend must be 'inductor' or 'eager'"):
        CompiledModel(torch.nn.Linear(1, 1), backend="cudagraphs")
