"""KV-cache sizes: kv_cache_bytes against published per-token figures (data/inference_reference.yaml)
and the real cache tensors; max_concurrent_sequences against a brute-force count over real tensors."""

import math

import pytest
import torch

from mlsys_nb.config import ModelConfig, load_yaml
from mlsys_nb.hardware import GPU, gpu
from mlsys_nb.inference import KVCache, kv_bytes_per_token, kv_cache_bytes, max_concurrent_sequences, weight_bytes
from mlsys_nb.models import Transformer

REF = load_yaml("inference_reference.yaml")


def _model(spec):
    return spec if isinstance(spec, str) else ModelConfig(**spec)


@pytest.mark.parametrize("row", REF["kv_bytes_per_token"], ids=lambda r: str(r["model"])[:30])
def test_published_bytes_per_token(row):
    m = _model(row["model"])
    assert kv_bytes_per_token(m, row["dtype"]) == row["bytes_per_token"], row["source"]
    assert kv_cache_bytes(m, 1000, row["dtype"]) == 1000 * row["bytes_per_token"]


def test_mla_table1_ratio():
    t = REF["mla_table1"]
    cfg = ModelConfig(
        n_layers=10,
        hidden=1024,
        n_heads=8,
        head_dim=t["d_h"],
        vocab_size=100,
        kv_lora_rank=t["d_c"],
        rope_head_dim=t["d_h_rope"],
    )
    assert kv_bytes_per_token(cfg, "fp32") == 4 * 10 * 4.5 * t["d_h"]  # 9/2 d_h l elements


@pytest.mark.parametrize("n_kv", [1, 2, 8])
def test_real_cache_tensors(n_kv):
    cfg = ModelConfig(n_layers=3, hidden=64, n_heads=8, n_kv_heads=n_kv, vocab_size=300, seq_len=40)
    m = Transformer(cfg).eval()
    cache = KVCache(m, 2, 40)
    with torch.no_grad():
        m(torch.randint(0, 300, (2, 13)), cache=cache)
    # the bytes of the K/V actually written for 2 x 13 tokens
    written = sum(t[:, :, :, :13].nbytes for t in (cache.k, cache.v))
    assert written == kv_cache_bytes(m, 26, "fp32") == kv_cache_bytes(cfg, 26, torch.float32)
    assert cache.nbytes == kv_cache_bytes(cfg, 80, "fp32")
    assert kv_cache_bytes(cfg, 26, "bf16") * 2 == kv_cache_bytes(cfg, 26, "fp32")


def test_max_concurrent_sequences_brute_force_on_real_tensors():
    cfg = ModelConfig(n_layers=2, hidden=64, n_heads=4, n_kv_heads=2, vocab_size=300, seq_len=64)
    m = Transformer(cfg).to(torch.bfloat16)
    w = sum(p.nbytes for p in m.parameters())
    assert w == weight_bytes(cfg, "bf16")
    per_seq = KVCache(m, 1, 64).nbytes
    for mem in (w * 1.5, w * 3 + 12345, w * 0.5, w * 1.11):
        fake = GPU("fake", memory_bytes=mem, hbm_bandwidth_bytes_per_s=1e9)
        n = 0
        while w + (n + 1) * per_seq <= 0.9 * mem:  # count sequences one by one
            n += 1
        assert max_concurrent_sequences(m, fake, 64) == n


def test_max_concurrent_sequences_cases():
    mem = gpu("H100-SXM").memory_bytes  # 81,559 MiB as the device reports it
    # Llama-2-7B (MHA) in bf16 on an H100: (0.9 * memory - 2 B x 6.74e9) / (0.5 MiB x 4096)
    n = max_concurrent_sequences("llama-2-7b", "H100-SXM", 4096)
    assert n == math.floor((0.9 * mem - 2 * 6738415616) / (524288 * 4096)) == 29
    assert max_concurrent_sequences("llama-3.1-405b", "L4", 4096) == 0  # 811 GB of weights
    # TP=8 shards the weights and the 8 KV heads of Llama-3-70B: each GPU holds 1/8 of both
    per_gpu = (0.9 * mem - 2 * 70553706496 / 8) / (2 * 80 * 8 * 128 * 2 * 8192 / 8)
    assert max_concurrent_sequences("llama-3-70b", "H100-SXM", 8192, tp=8) == math.floor(per_gpu) == 176
    # past n_kv_heads the KV heads are replicated: tp=16 shards the cache only 8 ways
    per_gpu16 = (0.9 * mem - 2 * 70553706496 / 16) / (2 * 80 * 8 * 128 * 2 * 8192 / 8)
    assert max_concurrent_sequences("llama-3-70b", "H100-SXM", 8192, tp=16) == math.floor(per_gpu16)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        max_concurrent_sequences("tiny", gpu("H100-SXM"), 128, gpu_memory_utilization=1.5)
    with pytest.raises(ValueError, match="tokens"):
        kv_cache_bytes("tiny", -1)
    with pytest.raises(ValueError, match="dtype"):
        kv_cache_bytes("tiny", 1, "fp13")
