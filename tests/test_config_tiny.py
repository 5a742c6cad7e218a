"""``config.tiny_config``, the one small-model factory: its default shape, the callers' exact sizes kept
(the old literal configs as the independent reference), and a clear error for an unknown field."""

import pytest

from mlsys_nb.config import ArgumentError, ModelConfig, tiny_config


def test_default_shape_and_parameter_count_of_the_built_model():
    from mlsys_nb.models import Transformer

    cfg = tiny_config()
    assert (cfg.n_layers, cfg.hidden, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_hidden, cfg.vocab_size, cfg.seq_len) == (
        2,
        32,
        4,
        2,
        64,
        64,
        16,
    )
    # the docstring's 22,688 parameters, counted on the real module (not by the memory calculator)
    assert sum(p.numel() for p in Transformer(cfg).parameters()) == 22_688


def test_overrides_apply_and_none_takes_modelconfig_defaults():
    cfg = tiny_config(n_layers=3, hidden=48, n_heads=6, n_kv_heads=None, ffn_hidden=None, tied_embeddings=True)
    assert cfg == ModelConfig(n_layers=3, hidden=48, n_heads=6, vocab_size=64, seq_len=16, tied_embeddings=True)
    assert cfg.n_kv_heads == 6 and cfg.ffn_hidden == 128  # MHA; 8/3 * 48 = 128


def test_unknown_field_names_it_and_lists_the_valid_ones():
    with pytest.raises(ArgumentError) as e:
        tiny_config(hiden=64)
    msg = str(e.value)
    assert "hiden" in msg and "hidden" in msg and "vocab_size" in msg and "n_kv_heads" in msg
    assert isinstance(e.value, ValueError)
    with pytest.raises(ValueError, match="n_heads"):  # a known field is still validated by ModelConfig
        tiny_config(n_heads=3)


# The configs each caller built before the factory existed, written out literally: the reference.
_OLD = {
    "harness": ModelConfig(
        n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, ffn_hidden=64, vocab_size=64, seq_len=16, name="dp-tiny"
    ),
    "mesh": ModelConfig(n_layers=4, hidden=32, n_heads=8, n_kv_heads=4, vocab_size=64, seq_len=16),
    "weight_sync_64": ModelConfig(n_layers=2, hidden=64, n_heads=4, vocab_size=257, seq_len=64),
    "weight_sync_16_1": ModelConfig(n_layers=1, hidden=16, n_heads=1, vocab_size=257, seq_len=64),
    "paged_mqa": ModelConfig(n_layers=2, hidden=32, n_heads=4, n_kv_heads=1, vocab_size=61, seq_len=64),
}


def _new():
    import sys
    from pathlib import Path

    from mlsys_nb.parallel import harness, mesh
    from mlsys_nb.rl import weight_sync as ws

    sys.path.insert(0, str(Path(__file__).parent))
    import test_paged

    return {
        "harness": harness.dp_tiny_config(),
        "mesh": mesh.mesh_tiny_config(),
        "weight_sync_64": ws.toy_config(64, 2),
        "weight_sync_16_1": ws.toy_config(16, 1),
        "paged_mqa": test_paged.tiny_model(4, 1).cfg,
    }


def test_callers_keep_their_exact_sizes():
    new = _new()
    for k, old in _OLD.items():
        assert new[k] == old, k
        assert new[k].ffn_hidden == old.ffn_hidden and new[k].head_dim == old.head_dim, k


def test_rlhf_tiny_config_is_the_tiny_preset_with_a_short_context():
    from dataclasses import replace

    from mlsys_nb.memory import preset
    from mlsys_nb.rl import rlhf

    assert rlhf.rlhf_config() == replace(preset("tiny"), seq_len=32, name="tiny-rlhf")
    assert rlhf.rlhf_config(48).seq_len == 48


def test_the_size_check_bites_when_a_caller_forgets_an_override():
    """The broken idea: the mesh's config without ``ffn_hidden=None`` keeps the base's width 64 instead of
    ModelConfig's 88 for hidden 32; the comparison above would fail on it."""
    forgot = tiny_config(n_layers=4, n_heads=8, n_kv_heads=4)
    assert forgot != _OLD["mesh"] and forgot.ffn_hidden == 64 and _OLD["mesh"].ffn_hidden == 88
