"""Roofline model: FLOPs pinned against FlopCounterMode on the real cached forward and a brute-force
count of attended keys; bytes pinned against the bytes a real decode step reads (traced), and a model
without the KV cache's bytes fails that check; decode at batch 1 is memory-bound at ≈ weight bytes /
HBM bandwidth; prefill is compute-bound; generate() with the cache equals generation by full recompute."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from mlsys_nb.config import ArgumentError, ModelConfig
from mlsys_nb.hardware import gpu
from mlsys_nb.inference import ByteTokenizer, KVCache, generate, kv_bytes_per_token, weight_bytes
from mlsys_nb.inference.roofline import (
    attention_flops,
    decode_bytes_read,
    decode_cost,
    matmul_params,
    prefill_cost,
    step_cost,
)
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


def _small(tied=False, n_kv_heads=2):
    cfg = ModelConfig(
        n_layers=2, hidden=64, n_heads=4, n_kv_heads=n_kv_heads, vocab_size=50, seq_len=32, tied_embeddings=tied
    )
    torch.manual_seed(0)
    return cfg, Transformer(cfg)


@pytest.mark.parametrize("tied,n_kv_heads", [(False, 2), (True, 4)])
def test_decode_bytes_read_counts_every_matmul_weight_once_and_the_cache_of_every_sequence(tied, n_kv_heads):
    cfg, m = _small(tied, n_kv_heads)
    for batch, context in ((1, 5), (3, 20)):
        read = decode_bytes_read(m, batch, context)
        assert read["matmul_weights"] == 4 * matmul_params(cfg)  # fp32
        # the K and V of the context and of the token just written, every layer, every sequence (GQA's
        # expanded copies read the same bytes: counted once)
        assert read["kv"] == batch * (context + 1) * kv_bytes_per_token(cfg, "fp32")
        norms = 4 * (2 * cfg.n_layers + 1) * cfg.hidden
        if tied:  # the head reads the whole table; the lookup reads rows of it
            assert read["weights"] == read["matmul_weights"] + norms
        else:  # an untied table is read at the rows looked up only (at most one per sequence)
            rows = read["weights"] - read["matmul_weights"] - norms
            assert rows % (4 * cfg.hidden) == 0 and 1 <= rows // (4 * cfg.hidden) <= batch
        assert read["total"] == read["weights"] + read["kv"]
    with pytest.raises(ArgumentError, match="context"):
        decode_bytes_read(m, 1, 32)


def _notebook_23_roofline_check(cost, model, cfg):
    """Notebook 23 section 4's check: the roofline's decode bytes within 1 % of those a real step reads, at a
    batch and context where the cache weighs in."""
    for batch, context in ((1, 8), (16, 31)):
        read = decode_bytes_read(model, batch, context)
        modelled = cost(cfg, "H100-SXM", context, batch=batch, dtype="fp32").bytes
        assert abs(modelled / read["total"] - 1) < 0.01, (batch, context, modelled, read)


def test_the_roofline_byte_check_fails_for_a_model_without_the_kv_cache(monkeypatch):
    """The key check broken: a roofline that forgot the KV cache's bytes (the weights alone) misses a real
    decode step's bytes by the cache's share (30 % at batch 16, context 31)."""
    from mlsys_nb.config import tiny_config
    from mlsys_nb.inference import roofline

    cfg = tiny_config(hidden=128, n_heads=4, n_kv_heads=2, ffn_hidden=256, vocab_size=8, seq_len=32)  # notebook 23's
    torch.manual_seed(0)
    model = Transformer(cfg)
    _notebook_23_roofline_check(decode_cost, model, cfg)
    monkeypatch.setattr(roofline, "kv_bytes_per_token", lambda *a, **k: 0.0)
    with pytest.raises(AssertionError):
        _notebook_23_roofline_check(roofline.decode_cost, model, cfg)
