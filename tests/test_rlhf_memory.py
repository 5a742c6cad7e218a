"""RLHF memory (four models + rollout KV cache) against hand-worked byte counts for Llama-2-7B and -70B.

Hand inputs: Llama-2-7B has N = 6,738,415,616 parameters with an untied 32000 x 4096 LM head
(131,072,000), MHA (32 KV heads x 128, 32 layers); Llama-2-70B N = 68,976,648,192, head 262,144,000,
GQA with 8 KV heads x 128, 80 layers. A critic / reward model = the trunk + a scalar head Linear(h, 1).
bf16-mixed Adam: 2 (bf16 params) + 2 (grads) + 4 (fp32 master) + 8 (two fp32 moments) = 16 B/param.
"""

import pytest

from mlsys_nb.inference import kv_bytes_per_token
from mlsys_nb.memory import GB, GiB, preset
from mlsys_nb.rl import sizing
from mlsys_nb.rl.sizing import rlhf_estimate

N7, HEAD7 = 6_738_415_616, 131_072_000
N7C = N7 - HEAD7 + 4096 + 1  # 6,607,347,713
N70, HEAD70 = 68_976_648_192, 262_144_000
N70C = N70 - HEAD70 + 8192 + 1  # 68,714,512,385


def total(r):
    ((_, parts),) = r.roles.values()
    return sum(parts.values())


def test_kv_bytes_per_token_counts_kv_heads_not_query_heads():
    assert kv_bytes_per_token(preset("llama-2-7b")) == 2 * 32 * 32 * 128 * 2 == 524_288
    assert kv_bytes_per_token(preset("llama-2-70b")) == 2 * 80 * 8 * 128 * 2 == 327_680  # not 2,621,440 (MHA)
    assert 32_768 * kv_bytes_per_token(preset("llama-2-70b")) == 10 * GiB  # one 32K sequence: 10 GiB
    assert kv_bytes_per_token(preset("llama-2-70b"), "fp8") == 163_840


def test_7b_on_one_gpu_both_trained_models_carry_optimizer_states():
    r = rlhf_estimate("llama-2-7b", n_gpus=1, rollout_batch=64, prompt_len=512, response_len=512)
    assert r.params == {"actor": N7, "reference": N7, "critic": N7C, "reward": N7C}
    ((_, parts),) = r.roles.values()
    assert parts["actor optimizer"] == 8 * N7 and parts["critic optimizer"] == 8 * N7C  # Adam for EACH
    assert parts["actor master"] == 4 * N7 and parts["critic grads"] == 2 * N7C
    four_models = 16 * N7 + 16 * N7C + 2 * N7 + 2 * N7C
    assert four_models == 240_223_739_922
    assert sum(v for k, v in parts.items() if k not in ("rollout weights", "KV cache")) == four_models
    assert parts["KV cache"] == 64 * 1024 * 524_288 == 32 * GiB
    assert parts["rollout weights"] == 2 * N7
    assert total(r) == four_models + 32 * GiB + 2 * N7
    # the seeds' table (4 x 14 GB + 56 GB optimizer + ~20 GB = ~130 GB) counts Adam once, without grads/master
    assert four_models / GB > 1.8 * 130


def test_70b_colocated_vs_split_per_gpu():
    kw = {"n_gpus": 32, "rollout_batch": 256, "prompt_len": 1024, "response_len": 1024, "rollout_tp": 8}
    kv = 256 * 2048 * 327_680
    co = rlhf_estimate("llama-2-70b", placement="colocated", **kw)
    expected_co = (16 * N70 + 16 * N70C + 2 * N70 + 2 * N70C) / 32 + 2 * N70 / 8 + kv / 32
    assert co.per_gpu == pytest.approx(expected_co, rel=1e-12, abs=64)  # ZeRO pads each shard up
    sp = rlhf_estimate("llama-2-70b", placement="split", **kw)  # default 8/8/4/4/8 GPUs
    per_role = {
        "actor": 16 * N70 / 8,
        "critic": 16 * N70C / 8,
        "reference": 2 * N70 / 4,
        "reward": 2 * N70C / 4,
        "rollout": 2 * N70 / 8 + kv / 8,
    }
    for role, (_, parts) in sp.roles.items():
        assert sum(parts.values()) == pytest.approx(per_role[role], rel=1e-12, abs=64), role
    assert sp.per_gpu == pytest.approx(max(per_role.values()), rel=1e-12, abs=64)
    # 70B on 32 GPUs: split 137.95 GB on each actor GPU (16 B x N / 8); co-located 100.06 GB on every GPU
    assert sp.per_gpu / GB == pytest.approx(137.95, abs=0.01) and co.per_gpu / GB == pytest.approx(100.06, abs=0.01)


def test_the_hand_value_catches_a_kv_cache_that_ignores_gqa(monkeypatch):
    kw = {"n_gpus": 1, "rollout_batch": 1, "prompt_len": 0, "response_len": 32_768}
    assert rlhf_estimate("llama-2-70b", **kw).roles["all"][1]["KV cache"] == 10 * GiB
    monkeypatch.setattr(sizing, "kv_bytes_per_token", lambda m, dtype="bf16": 2 * m.n_layers * m.hidden * 2)
    assert rlhf_estimate("llama-2-70b", **kw).roles["all"][1]["KV cache"] == 80 * GiB  # 8x: the seeds' mistake


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (
            {"placement": "mixed"},
            r"placement='mixed' is not allowed: placement must be one of \('colocated', 'split'\)",
        ),
        ({"n_gpus": 0}, "n_gpus must be an int >= 1, got 0"),
        ({"rollout_tp": 3}, "rollout_tp=3: must divide"),
        ({"placement": "split", "n_gpus": 6}, "multiple of 8"),
        (
            {
                "placement": "split",
                "n_gpus": 8,
                "split": {"actor": 4, "critic": 2, "reference": 1, "reward": 1, "rollout": 1},
            },
            "add up to 9",
        ),
        ({"kv_dtype": "fp12"}, "kv_dtype='fp12' is not allowed"),
        ({"precision": "int3"}, "precision='int3'"),
    ],
)
def test_bad_input_is_named(kwargs, match):
    with pytest.raises(ValueError, match=match):
        rlhf_estimate("llama-2-70b", **kwargs)
