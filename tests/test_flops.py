"""FLOPs per token against FlopCounterMode on the real small transformer, the 6N approximations
against published/derived values (Kaplan 2020, PaLM 2022, Llama 2 2023), MFU, training time and cost."""

import pytest
import torch

from mlsys_nb import flops
from mlsys_nb.config import ModelConfig
from mlsys_nb.models import Transformer, measure

# Published shapes (papers' tables, HF configs); built inline so the tests do not depend on data/models.yaml.
LLAMA2_7B = ModelConfig(
    n_layers=32, hidden=4096, n_heads=32, n_kv_heads=32, ffn_hidden=11008, vocab_size=32000, seq_len=4096
)
LLAMA2_13B = ModelConfig(n_layers=40, hidden=5120, n_heads=40, ffn_hidden=13824, vocab_size=32000, seq_len=4096)
LLAMA2_70B = ModelConfig(
    n_layers=80, hidden=8192, n_heads=64, n_kv_heads=8, ffn_hidden=28672, vocab_size=32000, seq_len=4096
)
GPT3 = ModelConfig(
    n_layers=96,
    hidden=12288,
    n_heads=96,
    vocab_size=50257,
    activation="gelu",
    norm="layernorm",
    bias=True,
    tied_embeddings=True,
    seq_len=2048,
)

SHAPES = [
    dict(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=16),
    dict(
        n_layers=3,
        hidden=48,
        n_heads=6,
        n_kv_heads=1,
        vocab_size=97,
        seq_len=24,
        activation="gelu",
        norm="layernorm",
        bias=True,
        tied_embeddings=True,
    ),
    dict(n_layers=1, hidden=40, n_heads=5, head_dim=12, vocab_size=33, ffn_hidden=72, seq_len=20, activation="relu"),
    dict(
        n_layers=2,
        hidden=32,
        n_heads=4,
        vocab_size=40,
        n_experts=4,
        top_k=2,
        expert_ffn_hidden=24,
        n_shared_experts=1,
        n_dense_layers=1,
        seq_len=16,
    ),
]


def independent_matmul_flops(c: ModelConfig, s: int) -> float:
    """Forward matmul FLOPs per token written out op by op, independently of mlsys_nb.flops:
    each nn.Linear costs 2*in*out per token, Q K^T and P V cost 2*s*head_dim per query head."""
    lin = lambda i, o: 2 * i * o  # noqa: E731
    mlp = lambda w: (3 if c.activation == "swiglu" else 2) * lin(c.hidden, w)  # noqa: E731
    total = 0
    for layer in range(c.n_layers):
        total += lin(c.hidden, c.q_dim) + 2 * lin(c.hidden, c.kv_dim) + lin(c.q_dim, c.hidden)
        total += c.n_heads * (2 * s * c.head_dim) * 2
        if c.is_moe and layer >= c.n_dense_layers:
            total += lin(c.hidden, c.n_experts) + (c.top_k + c.n_shared_experts) * mlp(c.expert_ffn_hidden)
        else:
            total += mlp(c.ffn_hidden)
    return total + lin(c.hidden, c.vocab_size)


@pytest.mark.parametrize("shape", SHAPES, ids=["gqa-swiglu", "mqa-gelu-bias-tied", "relu-headdim", "moe"])
def test_formula_equals_flop_counter_forward_and_backward(shape):
    torch.manual_seed(0)
    c = ModelConfig(**shape)
    m = Transformer(c, attn_impl="matmul")
    for b, s in [(2, c.seq_len), (3, c.seq_len // 2 + 1)]:
        x = torch.randint(0, c.vocab_size, (b, s))
        counted = flops.count_flops(m, x)
        tok = b * s
        # the matmul attention computes the full s x s scores: compare the non-causal count
        assert counted["forward"] == flops.flops_per_token(c, s, backward=False, causal=False) * tok
        assert counted["backward"] == 2 * counted["forward"]
        assert counted["total"] == flops.flops_per_token(c, s, causal=False) * tok
        assert counted["forward"] == independent_matmul_flops(c, s) * tok


def test_sdpa_counts_zero_attention_flops_on_cpu():
    """Why the matmul path exists: SDPA's attention is invisible to the counter on CPU."""
    c = ModelConfig(**SHAPES[0])
    x = torch.randint(0, c.vocab_size, (2, 16))
    counted = flops.count_flops(Transformer(c, attn_impl="sdpa"), x, backward=False)["forward"]
    b = flops.breakdown(c, 16, causal=False)
    assert counted == (b.forward_total - b.forward["attn_scores"] - b.forward["attn_values"]) * 32


@pytest.mark.parametrize("recompute", ["full", "selective"])
@pytest.mark.parametrize("act", ["swiglu", "gelu"])
def test_hardware_flops_with_recompute_equal_counter(recompute, act):
    torch.manual_seed(1)
    c = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=16, activation=act)
    x = torch.randint(0, 50, (2, 16))
    counted = flops.count_flops(Transformer(c, attn_impl="matmul", recompute=recompute), x)["total"]
    assert counted == flops.hardware_flops_per_token(c, 16, recompute=recompute, causal=False) * 32
    textbook = flops.hardware_flops_per_token(c, 16, recompute=recompute, causal=False, early_stop=False)
    assert textbook * 32 > counted > flops.flops_per_token(c, 16, causal=False) * 32


def test_causal_count_keeps_the_lower_triangle():
    c = ModelConfig(**SHAPES[0])
    s = 16
    full, causal = flops.breakdown(c, s, causal=False), flops.breakdown(c, s, causal=True)
    pairs = s * (s + 1) / 2
    assert causal.forward["attn_scores"] * s == pytest.approx(full.forward["attn_scores"] * pairs / s)
    for k in ("qkv", "out_proj", "mlp", "lm_head"):
        assert causal.forward[k] == full.forward[k]
    frame = full.to_frame()
    assert frame.loc["total", "fwd+bwd FLOPs/token"] == flops.flops_per_token(c, s, causal=False)


def test_parameter_count_and_6n_attention_share():
    # exact totals and the attention share over 6N (derived, exact N)
    assert flops.parameter_count(LLAMA2_7B) == 6_738_415_616
    assert flops.parameter_count(LLAMA2_70B) == 68_976_648_192
    # a non-embedding count of the blocks only would drop it; ours keeps the final norm (h = 8192)
    assert flops.parameter_count(LLAMA2_70B, exclude_embedding=True) == 68_452_352_000 + 8192
    share = lambda cfg, s: flops.six_n_attention(cfg, s) / flops.six_n(cfg) - 1  # noqa: E731
    assert share(LLAMA2_7B, 4096) == pytest.approx(0.159, abs=5e-4)
    assert share(LLAMA2_70B, 4096) == pytest.approx(0.078, abs=5e-4)
    # GPT-3 with its nominal N = 175e9: the code's attention term 12·L·h·s over 6N (Chowdhery et al. 2022,
    # arXiv:2204.02311, Appendix B)
    attention = flops.six_n_attention(GPT3, 2048) - flops.six_n(GPT3)
    assert attention == 12 * GPT3.n_layers * GPT3.q_dim * 2048
    assert attention / (6 * 175e9) == pytest.approx(0.028, abs=5e-4)
    table = flops.approximation_table(LLAMA2_7B, 4096)
    assert table.loc["exact (this module)", "relative error"] == 0
    # the exact count includes the LM head and the attention; 6N (non-embedding) undercounts
    assert table.loc["6N (N = non-embedding)", "relative error"] < -0.1


def test_gpt3_forward_without_attention_matches_ipn_value():
    # a textbook calculate_transformer_flops(12288, 96, 2048, 50257): fwd total 349,127,467,008 (24h^2 per
    # layer + 2hV head), a hand-worked GPT-3 count
    b = flops.breakdown(GPT3, 2048, causal=False)
    assert b.forward_total - b.forward["attn_scores"] - b.forward["attn_values"] == 349_127_467_008
    assert (b.forward["qkv"] + b.forward["out_proj"] + b.forward["mlp"]) / 96 == 3_623_878_656


def test_worked_training_times():
    # derived: 70B, 2T tokens
    assert flops.training_flops(70e9, 2e12) == pytest.approx(8.4e23)
    est = flops.training_time(70e9, 2e12, gpu="A100-80GB", n_gpus=512, mfu=0.5)
    assert est.peak_flops_per_s == 312e12
    assert est.days == pytest.approx(121.72, abs=0.01)
    assert est.gpu_hours == pytest.approx(1_495_726.5, abs=0.1)
    assert float(est) == est.seconds
    days = [flops.training_time(70e9, 2e12, gpu=990e12, n_gpus=1024, mfu=u).days for u in (0.3, 0.4, 0.5, 0.6, 0.7)]
    assert days == pytest.approx([31.97, 23.98, 19.18, 15.98, 13.70], abs=0.006)
    # GPU-hours independent of the cluster size under perfect scaling; cost = GPU-hours x price
    e2 = flops.training_time(70e9, 2e12, gpu="A100-80GB-SXM", n_gpus=2048, mfu=0.5, price_per_gpu_hour=2.0)
    assert e2.gpu_hours == pytest.approx(est.gpu_hours)
    assert e2.cost_usd == pytest.approx(2.0 * est.gpu_hours)
    assert est.to_frame().loc["wall-clock", "unit"] == "days"
    assert flops.training_flops(175e9, 300e9) == pytest.approx(3.15e23)  # GPT-3 6ND [GPT-3]


def test_llama2_implied_mfu():
    # Llama 2 (arXiv:2307.09288) Table 2: reported A100 GPU-hours, 2T tokens, 312 TFLOP/s
    hours = {7e9: 184_320, 13e9: 368_640, 70e9: 1_720_320}
    nominal = [flops.implied_mfu(n, 2e12, h, gpu="A100-80GB") for n, h in hours.items()]
    assert nominal == pytest.approx([0.406, 0.377, 0.435], abs=5e-4)
    exact = [
        flops.implied_mfu(flops.parameter_count(c), 2e12, h, gpu=312e12)
        for c, h in zip((LLAMA2_7B, LLAMA2_13B, LLAMA2_70B), hours.values())
    ]
    assert exact == pytest.approx([0.391, 0.377, 0.428], abs=5e-4)


def test_mfu_and_hfu_from_step_time():
    c = ModelConfig(**SHAPES[0])
    tps = 1234.5
    per_tok = flops.flops_per_token(c, 16)
    assert flops.mfu(c, tps, seq_len=16, gpu=1e9) == pytest.approx(tps * per_tok / 1e9)
    assert flops.mfu(c, tps, seq_len=16, gpu=1e9, n_gpus=4) == pytest.approx(tps * per_tok / 4e9)
    h = flops.hfu(c, tps, seq_len=16, gpu=1e9, recompute="full")
    assert h > flops.mfu(c, tps, seq_len=16, gpu=1e9)
    # a linear-only model with textbook full recompute: HFU / MFU = 4/3 (PaLM, arXiv:2204.02311, App. B)
    assert flops.mfu(7e9, 1000, gpu="H100-SXM") == pytest.approx(1000 * 42e9 / 989.4e12)
    m = Transformer(c, attn_impl="matmul")
    meas = measure.measure_step(m, torch.randint(0, 50, (2, 17)), repeats=2)
    assert meas["tokens_per_step"] == 32 and meas["step_s"] > 0
    assert measure.measure_matmul_peak(64, repeats=2) > 0


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda: flops.training_time(7e9, 1e12, gpu="A100-80GB", n_gpus=8, mfu=1.5), "mfu"),
        (lambda: flops.training_time(7e9, 1e12, gpu="A100-80GB", n_gpus=0, mfu=0.4), "n_gpus"),
        (lambda: flops.training_time(7e9, -1, gpu="A100-80GB", n_gpus=8, mfu=0.4), "tokens"),
        (lambda: flops.training_time(7e9, 1e12, gpu="TPU-9000", n_gpus=8, mfu=0.4), "unknown GPU"),
        (lambda: flops.training_time(7e9, 1e12, gpu="A100", n_gpus=8, mfu=0.4), "unknown GPU"),  # ambiguous
        (lambda: flops.flops_per_token(LLAMA2_7B, 0), "seq_len"),
        (lambda: flops.hardware_flops_per_token(LLAMA2_7B, 8, recompute="half"), "recompute"),
        (lambda: flops.flops_per_token("llama", 8), "unknown model preset 'llama'"),  # presets are accepted by name
        (lambda: flops.flops_per_token(3.5, 8), "ModelConfig"),
    ],
)
def test_bad_input_names_the_parameter(call, match):
    with pytest.raises((ValueError, KeyError, TypeError), match=match):
        call()
