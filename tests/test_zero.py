"""Single-process checks of mlsys_nb.parallel.zero and .ddp (no ranks needed)."""

from __future__ import annotations

import pytest
import torch

from mlsys_nb.models import Transformer
from mlsys_nb.parallel.ddp import DataParallel
from mlsys_nb.parallel.harness import local_slice, make_batches, dp_tiny_config
from mlsys_nb.models.measure import measured_state_bytes
from mlsys_nb.parallel.zero import ZeRO, default_units


def test_default_units_are_embedding_blocks_norm_head_in_forward_order():
    model = Transformer(dp_tiny_config(n_layers=3))
    units = default_units(model)
    assert units == [model.embed, *model.blocks, model.norm, model.lm_head]
    covered = sum(p.numel() for u in units for p in u.parameters())
    assert covered == model.num_parameters()


def test_tiny_config_units_divide_by_8_so_shards_need_no_padding():
    model = Transformer(dp_tiny_config())
    assert model.num_parameters() == 22688
    for u in default_units(model):
        assert sum(p.numel() for p in u.parameters()) % 8 == 0, u


def test_measured_state_bytes_of_plain_adamw_training():
    model = Transformer(dp_tiny_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = make_batches(dp_tiny_config(), 1, 2)[0]
    model(x, y).backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    got = measured_state_bytes(model, opt)
    assert got == dict(params=4 * n, grads=4 * n, optimizer=8 * n, step_counters=4 * len(list(model.parameters())))


def test_measured_state_bytes_counts_shared_storage_once():
    model = Transformer(dp_tiny_config(tied_embeddings=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert measured_state_bytes(model, opt)["params"] == 4 * model.num_parameters()


def test_bad_arguments_are_explained():
    model = Transformer(dp_tiny_config())
    with pytest.raises(ValueError, match="stage=4"):
        ZeRO(model, torch.optim.SGD, stage=4)
    with pytest.raises(ValueError, match="prefetch=True needs stage=3"):
        ZeRO(model, torch.optim.SGD, stage=2, prefetch=True)
    with pytest.raises(NotImplementedError, match="tied embeddings"):
        ZeRO(Transformer(dp_tiny_config(tied_embeddings=True)), torch.optim.SGD, stage=3)
    with pytest.raises(ValueError, match="do not cover parameters"):
        ZeRO(model, torch.optim.SGD, stage=1, units=[model.embed])
    with pytest.raises(ValueError, match="bucket_cap_mb must be a finite number of MB >= 0, got -1"):
        DataParallel(model, bucket_cap_mb=-1)
    x, y = make_batches(dp_tiny_config(), 1, 6)[0]
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        local_slice((x, y), 0, 4)


def test_zero_bytes_per_step_two_ring_phases_for_ddp_and_stages_1_2_three_for_stage_3():
    """``zero_bytes_per_step``: DDP's all-reduce and ZeRO-1/2's reduce-scatter + all-gather both send
    2(n−1)/n·S per rank, ZeRO-3's second parameter all-gather makes it 3(n−1)/n·S (1.5×, what
    tests/test_ddp_zero_ranks.py counts on ranks). Catches ZeRO-3 as 3× DDP, a stage 1/2 that adds a
    gather, the dtype ignored, a stage out of range accepted."""
    from mlsys_nb.parallel.zero import zero_bytes_per_step

    for n_params, n in ((7e9, 8), (1.3e9, 64), (125e6, 2)):
        one = (n - 1) / n * 2 * n_params  # one ring phase of the bf16 gradients
        got = [zero_bytes_per_step(n_params, n, z) for z in range(4)]
        assert got == pytest.approx([2 * one, 2 * one, 2 * one, 3 * one], rel=1e-12)
        assert zero_bytes_per_step(n_params, n, 3, "fp32") == pytest.approx(6 * one, rel=1e-12)
    with pytest.raises(ValueError, match="zero"):
        zero_bytes_per_step(7e9, 8, 4)
