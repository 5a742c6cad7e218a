"""Roofline model: FLOPs pinned against FlopCounterMode on the real cached forward and a brute-force
count of attended keys; decode at batch 1 is memory-bound at ≈ weight bytes / HBM bandwidth;
prefill is compute-bound; generate() with the cache equals generation by full recompute."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys_nb.config import ModelConfig
from mlsys_nb.hardware import gpu
from mlsys_nb.inference import ByteTokenizer, KVCache, generate, weight_bytes
from mlsys_nb.inference.roofline import attention_flops, decode_cost, matmul_params, prefill_cost, step_cost
from mlsys_nb.models import Transformer


@pytest.mark.parametrize("tied", [False, True])
def test_matmul_flops_equal_flop_counter_on_cached_decode(tied):
    cfg = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, vocab_size=300, seq_len=64, tied_embeddings=tied)
    m = Transformer(cfg).eval()
    cache = KVCache(m, 3, 64)
    with torch.no_grad():
        m(torch.randint(0, 300, (3, 10)), cache=cache)
        with FlopCounterMode(display=False) as fc:
            m(torch.randint(0, 300, (3, 1)), cache=cache)
    # SDPA counts 0 FLOPs on CPU, so the counter sees exactly the weight matmuls
    assert fc.get_total_flops() == 2 * matmul_params(cfg) * 3
    c = step_cost(cfg, "H100-SXM", batch=3, new_tokens_per_seq=1, context=10, dtype="fp32")
    assert c.flops == 2 * matmul_params(cfg) * 3 + 3 * attention_flops(cfg, 1, 10)


@pytest.mark.parametrize("new,ctx", [(1, 0), (1, 37), (9, 0), (5, 12)])
def test_attention_flops_brute_force(new, ctx):
    cfg = ModelConfig(n_layers=3, hidden=64, n_heads=4, vocab_size=300)
    keys = sum(ctx + j + 1 for j in range(new))  # query j sees the cache and new tokens 0..j
    assert attention_flops(cfg, new, ctx) == 3 * keys * (2 * 64 + 2 * 64)


def test_decode_batch1_is_weight_bandwidth_bound_and_prefill_compute_bound():
    h100 = gpu("H100-SXM")
    d = decode_cost("llama-3-8b", h100, context=0)
    assert d.bound == "memory" and d.intensity_flop_per_byte < 1.1
    # at context 0 the decode step time is the matmul weights over HBM bandwidth
    assert d.time_s == pytest.approx(matmul_params("llama-3-8b") * 2 / h100.hbm_bandwidth_bytes_per_s, rel=1e-3)
    assert 4.0e-3 < d.time_s < 5.0e-3  # 7.5e9 matmul weights x 2 B / 3.35e12 B/s = 4.5 ms per token
    p = prefill_cost("llama-3-8b", h100, 2048)
    assert p.bound == "compute" and p.intensity_flop_per_byte > p.ridge_flop_per_byte
    # batching decode raises intensity ~linearly while weights dominate the bytes
    b64 = decode_cost("llama-3-8b", h100, context=0, batch=64)
    assert b64.intensity_flop_per_byte == pytest.approx(64 * d.intensity_flop_per_byte, rel=0.01)
    # at long context the KV reads do not amortise: intensity saturates
    long1, long64 = (decode_cost("llama-3-8b", h100, context=32768, batch=b) for b in (1, 64))
    assert long64.intensity_flop_per_byte < 0.5 * 64 * long1.intensity_flop_per_byte
    assert weight_bytes("llama-3-8b") > matmul_params("llama-3-8b") * 2  # embedding table is not read whole
    with pytest.raises(ValueError, match="batch"):
        decode_cost("tiny", h100, context=1, batch=0)


@torch.no_grad()
def test_generate_equals_full_recompute_greedy():
    torch.manual_seed(0)
    cfg = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, vocab_size=320, seq_len=64)
    m = Transformer(cfg).eval()
    tok = ByteTokenizer(320)
    prompts = ["hello", "a longer prompt", "東京"]
    outs = generate(m, tok, prompts, max_new_tokens=12)
    for p, o in zip(prompts, outs):
        x = torch.tensor([tok.encode(p)])
        ref = []
        for _ in range(12):  # no cache: recompute the whole sequence for every token
            t = int(m(x)[0, -1].argmax())
            if t == tok.eos_id:
                break
            ref.append(t)
            x = torch.cat([x, torch.tensor([[t]])], 1)
        assert o.token_ids == ref
        assert o.text == tok.decode(ref) and o.ttft_s > 0
    with pytest.raises(ValueError, match="seq_len=64"):
        generate(m, tok, "x" * 60, max_new_tokens=10)
