"""from_hf / to_hf against real transformers models with random weights (built locally): logits
equal to 1e-4 in fp32 for random GQA/MHA/MQA configs, tied and untied heads, rope_theta and
rms_norm_eps; Qwen2 (q/k/v biases) and Mistral; RoPE scaling refused; the cached decode of a
converted model equals transformers' own greedy generate."""

import pytest
import torch

transformers = pytest.importorskip("transformers")

from mlsys_nb.inference import KVCache, kv_cache_bytes  # noqa: E402
from mlsys_nb.models import from_hf, to_hf  # noqa: E402

TOL = {"rtol": 1e-4, "atol": 1e-4}


def random_config(seed, kind="llama", **over):
    g = torch.Generator().manual_seed(seed)
    r = lambda lo, hi: int(torch.randint(lo, hi, (1,), generator=g))
    n_kv = r(1, 4)
    n_heads = n_kv * r(1, 4)
    head_dim = 2 * r(2, 9)
    kw = {
        "vocab_size": r(40, 120),
        "hidden_size": n_heads * head_dim * r(1, 3),
        "intermediate_size": r(16, 80),
        "num_hidden_layers": r(1, 4),
        "num_attention_heads": n_heads,
        "num_key_value_heads": n_kv,
        "head_dim": head_dim,
        "max_position_embeddings": 64,
        "rms_norm_eps": float(10.0 ** -r(4, 7)),
        "rope_parameters": {"rope_type": "default", "rope_theta": float(r(100, 500_000))},
        "tie_word_embeddings": bool(r(0, 2)),
        "initializer_range": 0.2,
    }  # logits of order 1, not 1e-3
    kw.update(over)
    cls = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[kind]
    if kind == "mistral":
        kw["sliding_window"] = None
    torch.manual_seed(seed)
    hf = cls[1](cls[0](**kw)).eval()
    with torch.no_grad():  # random biases too (transformers initialises them to zero)
        for n, p in hf.named_parameters():
            if n.endswith("bias") or "norm" in n:
                p.add_(0.1 * torch.randn_like(p))
    return hf


@pytest.mark.parametrize("kind", ["llama", "qwen2", "mistral"])
@pytest.mark.parametrize("seed", range(4))
@torch.no_grad()
def test_logits_equal_transformers(kind, seed):
    hf = random_config(seed, kind)
    ours = from_hf(hf)
    c = ours.cfg
    assert c.rope_theta == hf.config.rope_parameters["rope_theta"] and c.norm_eps == hf.config.rms_norm_eps
    assert c.tied_embeddings == hf.config.tie_word_embeddings and c.n_kv_heads == hf.config.num_key_value_heads
    x = torch.randint(0, c.vocab_size, (2, 17))
    torch.testing.assert_close(ours(x), hf(x).logits, **TOL)
    back = to_hf(ours)
    assert type(back).__name__ == ("Qwen2ForCausalLM" if kind == "qwen2" else "LlamaForCausalLM")
    torch.testing.assert_close(back(x).logits, hf(x).logits, **TOL)


@torch.no_grad()
def test_wrong_epsilon_or_theta_is_caught():
    """The equality above fails if the conversion dropped rms_norm_eps or rope_theta."""
    hf = random_config(11, rms_norm_eps=1e-1, rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    x = torch.randint(0, hf.config.vocab_size, (1, 12))
    ours = from_hf(hf)
    for name, bad in (("norm_eps", 1e-5), ("rope_theta", 10000.0)):
        wrong = type(ours)(ours.cfg.replace(**{name: bad})).eval()
        wrong.load_state_dict(ours.state_dict())
        assert not torch.allclose(wrong(x), hf(x).logits, **TOL), name
    torch.testing.assert_close(ours(x), hf(x).logits, **TOL)


def test_rope_scaling_and_sliding_window_refused():
    hc = transformers.LlamaConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=16384,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 5e5,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    )
    with pytest.raises(NotImplementedError, match="llama3"):
        from_hf(transformers.LlamaForCausalLM(hc))
    mc = transformers.MistralConfig(
        vocab_size=50,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        sliding_window=64,
    )
    m = transformers.MistralForCausalLM(mc)
    with pytest.raises(NotImplementedError, match="sliding_window=64"):
        from_hf(m)
    assert from_hf(m, seq_len=64).cfg.seq_len == 64


@torch.no_grad()
def test_cached_greedy_decode_equals_transformers_generate_and_cache_size():
    hf = random_config(5)
    ours = from_hf(hf)
    prompt = torch.randint(0, hf.config.vocab_size, (1, 6))
    ref = hf.generate(prompt, max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0)
    cache = KVCache(ours, 1, 16)
    tok, out = prompt, []
    for _ in range(10):
        tok = ours(tok, cache=cache)[:, -1].argmax(-1, keepdim=True)
        out.append(tok)
    assert torch.equal(torch.cat([prompt] + out, 1), ref)
    # transformers' own cache holds the same number of bytes kv_cache_bytes predicts
    hf_out = hf(prompt, use_cache=True)
    layers = hf_out.past_key_values.layers
    n = sum(t.nbytes for layer in layers for t in (layer.keys, layer.values))
    assert n == kv_cache_bytes(ours, prompt.shape[1], torch.float32)
