"""The serving engine on CUDA: greedy equals decoding by recomputation (the default engine, which captures CUDA-graph
decode), CUDA-graph decode equals eager decode (``enforce_eager=True``) token for token, a configuration the graphs
refuse runs eager and says why, and the graph speed-up of decoding measured at batch 1, 8 and 32 (interleaved)."""

import time

import pytest
import torch

pytestmark = pytest.mark.gpu

VOCAB = 512


@pytest.fixture(scope="module")
def model():
    from mlsys_nb.config import ModelConfig
    from mlsys_nb.models import Transformer

    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=4, hidden=256, n_heads=8, n_kv_heads=4, vocab_size=VOCAB, seq_len=512)
    m = Transformer(cfg).to("cuda").eval()
    with torch.no_grad():
        for p in m.parameters():
            p.mul_(5)  # well separated logits: no near-ties for argmax
    return m


def prompts(k, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [
        torch.randint(0, VOCAB, (int(torch.randint(4, 40, (1,), generator=g)),), generator=g).tolist() for _ in range(k)
    ]


def greedy(n):
    from mlsys_nb.inference import SamplingParams

    return SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)


def test_greedy_on_cuda_equals_recompute(model, record):
    from mlsys_nb.inference import LLM

    ps = prompts(6)
    llm = LLM(model)
    assert llm.engine.cuda_graphs_off is None and llm.engine.runner.graphs is not None  # the default on CUDA
    outs = llm.generate(ps, greedy(12), use_tqdm=False)
    for p, o in zip(ps, outs):
        ids = list(p)
        with torch.no_grad():
            for _ in range(12):
                ids.append(int(model(torch.tensor([ids], device="cuda"))[0, -1].argmax()))
        assert o.outputs[0].token_ids == ids[len(p) :]
    record("greedy == recompute (6 prompts x 12 tokens)", "equal", "")


def test_cuda_graph_decode_equals_eager(model, record):
    from mlsys_nb.inference import LLM

    ps = prompts(11, seed=2)  # 11 rows: padded to the bucket of 16
    plain = LLM(model, enforce_eager=True)
    assert plain.engine.runner.graphs is None and plain.engine.cuda_graphs_off == "enforce_eager=True"
    eager = plain.generate(ps, greedy(16), use_tqdm=False)
    llm = LLM(model, max_num_seqs=32)  # captures 1, 2, 4, ..., 32
    assert sorted(llm.engine.runner.graphs.graphs) == [1, 2, 4, 8, 16, 32]
    graphed = llm.generate(ps, greedy(16), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in graphed] == [o.outputs[0].token_ids for o in eager]
    record("CUDA-graph decode == eager (11 prompts x 16 tokens)", "equal", "")
    tiled = LLM(model, attention_backend="tiled")  # its decode reads the longest context back: no graphs
    assert tiled.engine.runner.graphs is None and "tiled" in tiled.engine.cuda_graphs_off
    same = tiled.generate(ps, greedy(16), use_tqdm=False)
    assert [o.outputs[0].token_ids for o in same] == [o.outputs[0].token_ids for o in eager]


@pytest.mark.parametrize("batch", [1, 8, 32])
def test_cuda_graph_speedup(model, record, batch):
    from mlsys_nb.inference import LLM

    ps = prompts(batch, seed=3)
    eager, graphed = LLM(model, enforce_eager=True), LLM(model, enforce_eager=True)
    graphed.engine.runner.capture_cuda_graphs(buckets=(1, 8, 32))
    times = {"eager": [], "graph": []}
    outs = {}
    for _ in range(3):  # interleaved: both variants see the same machine state
        for name, llm in (("eager", eager), ("graph", graphed)):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            outs[name] = llm.generate(ps, greedy(64), use_tqdm=False)
            torch.cuda.synchronize()
            times[name].append(time.perf_counter() - t0)
    assert [o.outputs[0].token_ids for o in outs["graph"]] == [o.outputs[0].token_ids for o in outs["eager"]]
    e, g = min(times["eager"]), min(times["graph"])
    record(f"generate 64 tokens, batch {batch}: eager", e * 1e3, "ms", "best of 3, interleaved")
    record(f"generate 64 tokens, batch {batch}: CUDA graphs", g * 1e3, "ms", "best of 3, interleaved")
    record(f"CUDA-graph speed-up, batch {batch}", e / g, "x", "whole generate (prefill eager in both)")
