"""The small transformer: shapes, parameter counts against the closed form, attention paths,
recompute modes and configuration errors."""

import pytest
import torch

from mlsys_nb.config import ModelConfig
from mlsys_nb.models import Transformer


def llama_count(c: ModelConfig) -> int:
    """Llama-style exact count (GQA + SwiGLU + RMSNorm), written independently of the module."""
    h, f = c.hidden, c.ffn_hidden
    mlp = (3 if c.activation == "swiglu" else 2) * h * f
    layer = h * c.q_dim + 2 * h * c.kv_dim + c.q_dim * h + mlp + 2 * h
    return c.n_layers * layer + c.vocab_size * h * (1 if c.tied_embeddings else 2) + h


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("act", ["swiglu", "gelu", "relu"])
@pytest.mark.parametrize("kv", [1, 2, 4])
def test_parameter_count_matches_closed_form(tied, act, kv):
    c = ModelConfig(
        n_layers=3,
        hidden=48,
        n_heads=4,
        n_kv_heads=kv,
        vocab_size=97,
        ffn_hidden=80,
        activation=act,
        tied_embeddings=tied,
    )
    with torch.device("meta"):
        m = Transformer(c)
    assert m.num_parameters() == llama_count(c)


@pytest.mark.parametrize("recompute", ["none", "selective", "full"])
def test_attention_paths_and_recompute_agree(recompute):
    torch.manual_seed(0)
    c = ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, vocab_size=50, seq_len=16)
    ref = Transformer(c)
    x = torch.randint(0, 50, (3, 12))
    loss_ref = ref(x, x)
    loss_ref.backward()
    g_ref = [p.grad.clone() for p in ref.parameters()]
    m = Transformer(c, recompute=recompute, attn_impl="matmul")
    m.load_state_dict(ref.state_dict())
    loss = m(x, x)
    loss.backward()
    torch.testing.assert_close(loss, loss_ref, rtol=1e-5, atol=1e-6)
    for a, b in zip(g_ref, (p.grad for p in m.parameters())):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


def test_causal():
    torch.manual_seed(1)
    c = ModelConfig(n_layers=1, hidden=32, n_heads=2, vocab_size=30, seq_len=16, activation="gelu", norm="layernorm")
    m = Transformer(c, attn_impl="matmul").eval()
    x = torch.randint(0, 30, (1, 10))
    y = x.clone()
    y[0, 7:] = (y[0, 7:] + 1) % 30
    torch.testing.assert_close(m(x)[0, :7], m(y)[0, :7])
    assert not torch.allclose(m(x)[0, 7:], m(y)[0, 7:])


def test_moe_runs_and_counts():
    c = ModelConfig(
        n_layers=2,
        hidden=32,
        n_heads=4,
        vocab_size=40,
        n_experts=4,
        top_k=2,
        expert_ffn_hidden=24,
        n_shared_experts=1,
        n_dense_layers=1,
    )
    m = Transformer(c)
    x = torch.randint(0, 40, (2, 8))
    m(x, x).backward()
    moe_params = 32 * 4 + 5 * 3 * 32 * 24
    dense_mlp = 3 * 32 * c.ffn_hidden
    assert m.num_parameters() == llama_count(c) - dense_mlp + moe_params


@pytest.mark.parametrize(
    "bad, msg",
    [
        (dict(n_heads=3), "divisible"),
        (dict(n_kv_heads=3), "divisible"),
        (dict(activation="tanh"), "activation"),
        (dict(n_layers=0), "n_layers"),
        (dict(dropout=1.5), "dropout"),
    ],
)
def test_bad_config_names_the_parameter(bad, msg):
    spec = dict(n_layers=2, hidden=32, n_heads=4, vocab_size=40) | bad
    with pytest.raises((ValueError, TypeError), match=msg):
        ModelConfig(**spec)


def test_sequence_too_long():
    c = ModelConfig(n_layers=1, hidden=16, n_heads=2, vocab_size=10, seq_len=8)
    with pytest.raises(ValueError, match="seq_len"):
        Transformer(c)(torch.zeros(1, 9, dtype=torch.long))


def test_init_on_cpu_and_a_meta_build_of_the_same_shapes():
    """A CPU build draws Linear/Embedding weights from N(0, 0.02) with zero biases; a meta build (init
    skipped there: no values) has the same parameters by name and shape."""
    c = ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=300, ffn_hidden=128, seq_len=16)
    torch.manual_seed(0)
    cpu = Transformer(c)
    for name, m in cpu.named_modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Embedding)):
            assert abs(m.weight.std().item() - 0.02) < 0.004 and abs(m.weight.mean().item()) < 0.004, name
        if isinstance(m, torch.nn.Linear) and m.bias is not None:
            assert torch.count_nonzero(m.bias) == 0, name
    with torch.device("meta"):
        meta = Transformer(c)
    assert all(p.is_meta for p in meta.parameters())
    assert [(n, p.shape) for n, p in meta.named_parameters()] == [(n, p.shape) for n, p in cpu.named_parameters()]
