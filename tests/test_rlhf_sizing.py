"""RLHF layout sizing against hand-worked values (Llama-2-7B, 8 x H100-SXM)."""

import pytest

from mlsys_nb.rl.sizing import rlhf_estimate
from mlsys_nb.rl import sizing

N7 = 6_738_415_616  # Llama-2-7B parameters (memory.param_count)
NC7 = N7 - 32_000 * 4096 + 4096 + 1  # critic/reward: LM head replaced by Linear(4096, 1)


def test_colocated_7b_sync_and_train_by_hand():
    c = sizing.layout_cost("llama-2-7b", placement="colocated", n_gpus=8, gpu="H100-SXM", mfu=0.4)
    # sync: ring all-gather of the bf16 weights over NVLink 4 (450 GB/s per direction, 5 us), 8 GPUs
    assert c.sync_s == pytest.approx(7 * 5e-6 + 7 / 8 * 2 * N7 / 450e9, rel=1e-9)  # 0.02624 s
    # train: (6 + 2) N_actor + (6 + 2) N_critic FLOP per token, 256 x 1024 tokens, 8 GPUs at 40 % of 989.4 TFLOP/s
    assert c.train_s == pytest.approx(8 * (N7 + NC7) * 256 * 1024 / (8 * 989.4e12 * 0.4), rel=1e-9)  # 8.840 s
    assert c.train_s == pytest.approx(8.840, abs=1e-3)
    assert c.step_sync_s == c.step_async_s == pytest.approx(c.gen_s + c.sync_s + c.train_s)
    assert c.per_gpu_bytes == rlhf_estimate("llama-2-7b", n_gpus=8).per_gpu and c.fits


def test_split_layout_adds_the_broadcast_and_can_overlap():
    c = sizing.layout_cost("llama-2-7b", placement="split", n_gpus=8, sync_link="infiniband-ndr")
    # split 8 = actor 2, critic 2, reference 1, reward 1, rollout 2 (tp 1: 2 replicas)
    gather = 1 * 5e-6 + 1 / 2 * 2 * N7 / 450e9
    bcast = 2 * 20e-6 + 2 * N7 / 50e9  # pipelined chain over 3 members on NDR InfiniBand (50 GB/s)
    assert c.sync_s == pytest.approx(gather + bcast, rel=1e-9)
    assert c.step_async_s == pytest.approx(max(c.gen_s, c.train_s) + c.sync_s)
    assert c.step_async_s < c.step_sync_s


def test_bigger_models_and_bad_input():
    rows = sizing.compare_placements(
        n_gpus={"llama-2-7b": 8, "llama-3.1-70b": 64, "llama-3.1-405b": 256},
        rollout_tp={"llama-2-7b": 1, "llama-3.1-70b": 8, "llama-3.1-405b": 8},
    )
    assert [r["model"] for r in rows][::2] == ["llama-2-7b", "llama-3.1-70b", "llama-3.1-405b"]
    syncs = [r["sync s"] for r in rows if r["layout"] == "split"]
    assert syncs == sorted(syncs)  # sync grows with the model
    with pytest.raises(ValueError, match="mfu"):
        sizing.layout_cost(mfu=0)
