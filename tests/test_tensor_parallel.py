"""Tensor and sequence parallelism (``mlsys_nb.parallel.tensor``) on 2 and 4 gloo ranks.

One launch per world size runs every check in ``tp_worker.tp_checks`` (layers, blocks, embedding,
loss, the whole model, bytes on the wire, activation and parameter memory, torch's own TP) and
the tests below read its results, so a failure lists every mismatch at once."""

from __future__ import annotations

import pytest
import torch

import mlsys_nb
from mlsys_nb.config import ModelConfig
from mlsys_nb.parallel import tensor as tp

TOL = 1e-5


@pytest.fixture(scope="module", params=[2, 4], ids=["tp2", "tp4"])
def results(request):
    from tensor_parallel_checks import tp_checks

    return mlsys_nb.launch(tp_checks, world_size=request.param, timeout=120.0)


def _items(results, prefix):
    for r, res in enumerate(results):
        for k, v in res.items():
            if k.startswith(prefix):
                yield r, k, v


@pytest.mark.slow
def test_no_check_raised(results):
    errors = [f"rank {r} {k}: {v}" for r, k, v in _items(results, "exception/")]
    assert not errors, "\n".join(errors)


@pytest.mark.slow
@pytest.mark.parametrize(
    "group",
    ["functional/", "column", "row", "mlp_", "attention_", "block", "embedding", "vocab_ce", "model/", "torch_tp"],
)
def test_outputs_and_gradients_equal_unsharded(results, group):
    """Every output, input gradient and parameter gradient equals the unsharded reference."""
    rows = list(_items(results, f"err/{group}"))
    assert rows, f"no results for {group}: the check did not run"
    bad = [f"rank {r} {k}: {v:.3g}" for r, k, v in rows if not v <= TOL]
    assert not bad, "\n".join(bad)


@pytest.mark.slow
def test_each_differentiable_collective_runs_what_its_table_row_says(results):
    """The forward/backward table heading mlsys_nb.parallel.functional, against the collectives
    counted on every rank (names as torch.distributed calls them)."""
    table = {
        "copy_to": ([], ["all_reduce"]),
        "reduce_from": (["all_reduce"], []),
        "gather_from": (["all_gather_into_tensor"], ["reduce_scatter_tensor"]),
        "reduce_scatter_to": (["reduce_scatter_tensor"], ["all_gather_into_tensor"]),
        "gather_replicated": (["all_gather_into_tensor"], []),
        "all_to_all": (["all_to_all_single"], ["all_to_all_single"]),
    }
    for res in results:
        assert {k.split("/")[-1]: tuple(v) for k, v in res.items() if k.startswith("ops/functional/")} == {
            k: tuple(v) for k, v in table.items()
        }
        # and the gradient check bites: f with an identity backward misses the other ranks' share
        assert res["broken/functional/copy_to_without_all_reduce"] > 1e-2


@pytest.mark.slow
def test_every_case_covers_sp_and_no_sp(results):
    keys = {k for _, k, _ in _items(results, "err/")}
    for group in (
        "column",
        "row",
        "mlp_swiglu",
        "mlp_gelu_bias",
        "attention_gqa",
        "block",
        "embedding",
        "model/tied=False",
        "model/tied=True",
        "torch_tp",
    ):
        for sp in (False, True):
            assert any(k.startswith(f"err/{group}") and f"sp={sp}" in k for k in keys), (group, sp)


@pytest.mark.slow
def test_bytes_per_layer_and_per_step_equal_closed_forms(results):
    for r, res in enumerate(results):
        t = res["world"]
        keys = [k[: -len("/measured")] for k in res if k.startswith("bytes/") and k.endswith("/measured")]
        assert len(keys) == 7, keys
        for k in keys:
            assert res[k + "/measured"] == pytest.approx(res[k + "/formula"], rel=1e-12), (t, r, k)
        assert res["calls/layer/sp=False/regather=True"] == {"all_reduce": 4}  # 2 fwd + 2 bwd
        assert res["calls/layer/sp=True/regather=False"] == {"all_gather_into_tensor": 4, "reduce_scatter_tensor": 4}
        # Megatron's SP re-gathers the two column-parallel inputs in backward
        assert res["calls/layer/sp=True/regather=True"] == {"all_gather_into_tensor": 6, "reduce_scatter_tensor": 4}
        h = 64
        assert res["bytes/layer/sp=True/regather=True/norm_grad_sync"] == pytest.approx(2 * 2 * (t - 1) / t * h * 4)
        assert res["bytes/layer/sp=False/regather=True/norm_grad_sync"] == 0


@pytest.mark.slow
def test_memory_per_rank_matches_memory_estimate_and_closed_forms(results):
    for r, res in enumerate(results):
        for tag in ("layer/none", "layer/tp/sp=False", "layer/tp/sp=True"):
            m = res[f"act/{tag}/measured"]
            assert m == res[f"act/{tag}/memory.layer_terms"], (r, tag, m, res[f"act/{tag}/memory.layer_terms"])
            assert m == pytest.approx(res[f"act/{tag}/formula"], rel=1e-12), (r, tag)
        # TP+SP divides the whole layer by t; TP alone leaves the replicated part
        act = {k: res[f"act/layer/{k}/measured"] for k in ("none", "tp/sp=False", "tp/sp=True")}
        assert act["tp/sp=True"] < act["tp/sp=False"] < act["none"], act
        for tied in (False, True):
            m = res[f"param/tied={tied}/measured"]
            assert m == res[f"param/tied={tied}/formula"] == res[f"param/tied={tied}/memory.estimate"], (r, tied)


@pytest.mark.slow
def test_torch_tp_uses_the_same_collectives(results):
    for res in results:
        assert res["calls/torch_tp/sp=False"] == res["calls/ours_mlp/sp=False"] == {"all_reduce": 2}
        assert res["calls/torch_tp/sp=True"] == res["calls/ours_mlp/sp=True"]


@pytest.mark.slow
def test_bad_sizes_raise_clear_errors():
    cfg = ModelConfig(n_layers=1, hidden=64, n_heads=8, n_kv_heads=2, vocab_size=128, seq_len=16)

    def body():
        out = {}
        for name, make in [
            ("kv", lambda: tp.TPAttention(cfg)),
            ("col", lambda: tp.ColumnParallelLinear(8, 6)),
            ("vocab", lambda: tp.VocabParallelEmbedding(126, 8)),
        ]:
            try:
                make()
                out[name] = None
            except ValueError as e:
                out[name] = str(e)
        return out

    res = mlsys_nb.launch(body, world_size=4, timeout=60.0)[0]
    assert "n_kv_heads=2" in res["kv"]
    assert "out_features=6" in res["col"]
    assert "vocab_size=126" in res["vocab"]


def test_shard_slices_evenly_and_rejects_uneven():
    x = torch.arange(12.0).view(3, 4)
    assert torch.equal(torch.cat([tp.shard(x, 1, r, 2) for r in range(2)], dim=1), x)
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        tp.shard(x, 1, 0, 3)


def test_tp_bytes_per_layer_is_two_ring_all_reduces_and_sp_sends_the_same():
    """``tp.tp_bytes_per_layer`` is the forward half of what the rank test counts per layer
    (``tensor_parallel_checks._layer_step_bytes``: 8(t−1)/t·b·s·h elements forward + backward): two ring
    all-reduces of b·s·h, and SP's reduce-scatters + all-gathers send exactly as much. Catches one
    all-reduce per layer, a lost (t−1)/t, SP counted as extra traffic, the dtype ignored."""
    for b, s, h, t in ((1, 2048, 4096, 2), (2, 4096, 5120, 8), (4, 128, 64, 4)):
        want = 2 * 2 * (t - 1) / t * b * s * h * 2  # bf16
        assert tp.tp_bytes_per_layer(b, s, h, t, False) == pytest.approx(want, rel=1e-12)
        assert tp.tp_bytes_per_layer(b, s, h, t, True) == pytest.approx(want, rel=1e-12)
        assert tp.tp_bytes_per_layer(b, s, h, t, False, "fp32") == pytest.approx(2 * want, rel=1e-12)
