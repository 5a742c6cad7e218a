"""Single-process checks of mlsys_nb.parallel.zero and .ddp (no ranks needed)."""

from __future__ import annotations

import pytest
import torch

from mlsys_nb.models import Transformer
from mlsys_nb.parallel.ddp import DataParallel
from mlsys_nb.parallel.harness import local_slice, make_batches, tiny_config
from mlsys_nb.models.measure import measured_state_bytes
from mlsys_nb.parallel.zero import ZeRO, default_units


def test_default_units_are_embedding_blocks_norm_head_in_forward_order():
    model = Transformer(tiny_config(n_layers=3))
    units = default_units(model)
    assert units == [model.embed, *model.blocks, model.norm, model.lm_head]
    covered = sum(p.numel() for u in units for p in u.parameters())
    assert covered == model.num_parameters()


def test_tiny_config_units_divide_by_8_so_shards_need_no_padding():
    model = Transformer(tiny_config())
    assert model.num_parameters() == 22688
    for u in default_units(model):
        assert sum(p.numel() for p in u.parameters()) % 8 == 0, u


def test_measured_state_bytes_of_plain_adamw_training():
    model = Transformer(tiny_config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = make_batches(tiny_config(), 1, 2)[0]
    model(x, y).backward()
    opt.step()
    n = sum(p.numel() for p in model.parameters())
    got = measured_state_bytes(model, opt)
    assert got == dict(params=4 * n, grads=4 * n, optimizer=8 * n, step_counters=4 * len(list(model.parameters())))


def test_measured_state_bytes_counts_shared_storage_once():
    model = Transformer(tiny_config(tied_embeddings=True))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    assert measured_state_bytes(model, opt)["params"] == 4 * model.num_parameters()


def test_bad_arguments_are_explained():
    model = Transformer(tiny_config())
    with pytest.raises(ValueError, match="stage=4"):
        ZeRO(model, torch.optim.SGD, stage=4)
    with pytest.raises(ValueError, match="prefetch=True needs stage=3"):
        ZeRO(model, torch.optim.SGD, stage=2, prefetch=True)
    with pytest.raises(NotImplementedError, match="tied embeddings"):
        ZeRO(Transformer(tiny_config(tied_embeddings=True)), torch.optim.SGD, stage=3)
    with pytest.raises(ValueError, match="do not cover parameters"):
        ZeRO(model, torch.optim.SGD, stage=1, units=[model.embed])
    with pytest.raises(ValueError, match="bucket_cap_mb must be a finite number of MB >= 0, got -1"):
        DataParallel(model, bucket_cap_mb=-1)
    x, y = make_batches(tiny_config(), 1, 6)[0]
    with pytest.raises(ValueError, match="not divisible by world_size=4"):
        local_slice((x, y), 0, 4)
