"""DDP, ZeRO-1/2/3, PyTorch DDP and FSDP2 on real gloo ranks (2 and 4), one launch per world size.

Each launch trains the small transformer for 3 steps with every implementation and both AdamW and
SGD (momentum), and returns numbers only; the tests below compare them with independent
references: single-process training on the full batch (computed inside each rank without any
communication), PyTorch's DistributedDataParallel, the ring-traffic closed forms
(Patarasuk & Yuan 2009; ZeRO arXiv:1910.02054 §7) and the model-state closed forms (ZeRO §3 /
``mlsys_nb.memory``).
"""

from __future__ import annotations

import pytest
import torch

import mlsys_nb

WORLD_SIZES = (2, 3)  # 3: shards do not divide the model, so the padding is tested too
TOL = 1e-5
DDP_LIKE = ("naive", "ddp", "ddp_no_overlap", "ddp_accum", "zero1", "zero2")
OPT_STATE_BYTES = {"adamw": 8, "sgd-momentum": 4}  # fp32 m and v / fp32 momentum, per parameter


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda w: f"world{w}")
def runs(request):
    sizes = [int(s) for s in torch.randint(1, 50, (4,), generator=torch.Generator().manual_seed(request.param))]
    from ddp_zero_checks import rank_checks

    per_rank = mlsys_nb.launch(rank_checks, world_size=request.param, args=(sizes,), backend="gloo", timeout=120)
    return request.param, sizes, per_rank


def test_every_implementation_equals_single_process_training(runs):
    world, _, per_rank = runs
    for rank, out in enumerate(per_rank):
        for optimizer, res in out["results"].items():
            assert out["moved"][optimizer] > 1e-3, (
                f"training barely changed the weights ({optimizer}): the check would be vacuous"
            )
            for impl, r in res.items():
                assert r["max_diff_single"] < TOL, (
                    f"world {world} rank {rank} {optimizer} {impl}: {r['max_diff_single']:.3g}"
                )


def test_every_implementation_equals_pytorch_ddp_and_fsdp2(runs):
    world, _, per_rank = runs
    for out in per_rank:
        for optimizer, res in out["results"].items():
            for impl, r in res.items():
                assert r["max_diff_torch_ddp"] < TOL, (
                    f"world {world} {optimizer} {impl} vs torch DDP: {r['max_diff_torch_ddp']:.3g}"
                )
            fsdp2 = res["fsdp2"]["max_diff_single"]
            assert fsdp2 < TOL, f"FSDP2 vs single process: {fsdp2:.3g}"


def test_bytes_communicated_per_step_match_closed_forms(runs):
    world, _, per_rank = runs
    for out in per_rank:
        psi_bytes = 4 * out["n_params"]  # fp32 gradients / parameters
        padded_bytes = 4 * _padded_layout(world)[1]  # ZeRO's flat units, each padded to a multiple of world
        ring = (world - 1) / world
        for res in out["results"].values():
            for impl in DDP_LIKE:  # one all-reduce, or reduce-scatter + all-gather, of everything
                psi = padded_bytes if impl.startswith("zero") else psi_bytes
                assert res[impl]["bytes_sent_per_step"] == pytest.approx(2 * ring * psi, rel=1e-12), impl
            for impl in ("zero3", "zero3_prefetch"):  # gather twice, reduce-scatter once
                assert res[impl]["bytes_sent_per_step"] == pytest.approx(3 * ring * padded_bytes, rel=1e-12), impl
                assert res[impl]["bytes_sent_per_step"] / res["zero1"]["bytes_sent_per_step"] == pytest.approx(1.5)
            ops = res["zero1"]["by_op"]
            assert set(ops) == {"reduce_scatter_single", "all_gather_single"}, ops
            # FSDP2 reshards the blocks after forward but not its root (embedding, norm, head)
            assert 2 * ring * psi_bytes < res["fsdp2"]["bytes_sent_per_step"] <= 3 * ring * psi_bytes


def _padded_layout(world):
    """By hand, from the module: (unpadded total, padded unit total, FSDP2 per-rank local elements,
    FSDP2 padded shard). ZeRO units (embedding, blocks, norm, head) are each padded to a multiple of
    ``world``; FSDP2 splits every parameter's rows into ceil(rows/world)-row shards."""
    from mlsys_nb.models import Transformer
    from mlsys_nb.parallel.harness import dp_tiny_config
    from mlsys_nb.parallel.zero import default_units

    model = Transformer(dp_tiny_config())
    units = [sum(p.numel() for p in u.parameters()) for u in default_units(model)]
    padded = sum(-(-u // world) * world for u in units)
    shard_rows = [(-(-p.shape[0] // world), p.numel() // p.shape[0]) for p in model.parameters()]
    fsdp2_shard = sum(r * c for r, c in shard_rows)
    fsdp2_local = [
        sum(max(0, min(r, p.shape[0] - k * r)) * c for (r, c), p in zip(shard_rows, model.parameters()))
        for k in range(world)
    ]
    return sum(units), padded, fsdp2_local, fsdp2_shard


def _predicted_model_states(n_params, world, stage, optimizer, impl="zero", rank=0):
    """ZeRO paper's model states (Rajbhandari et al. 2020, section 3) in fp32 (4 B params, 4 B grads,
    no separate master copy), with each implementation's padding worked out by hand."""
    total, padded, fsdp2_local, fsdp2_shard = _padded_layout(world)
    assert total == n_params
    k = OPT_STATE_BYTES[optimizer] // 4  # fp32 states per parameter
    if stage == 0:
        return dict(params=4 * total, grads=4 * total, optimizer=4 * k * total)
    if impl == "fsdp2":
        return dict(params=4 * fsdp2_shard, grads=4 * fsdp2_shard, optimizer=4 * k * fsdp2_local[rank])
    return dict(
        params=4 * (padded // world if stage >= 3 else padded),
        grads=4 * (padded // world if stage >= 2 else padded),
        optimizer=4 * k * padded // world,
    )


def _memory_module_prediction(world, stage, optimizer, impl="zero", rank=0):
    """The same numbers from ``mlsys_nb.memory.estimate`` (model states of the tiny config), with the
    implementation's ``zero_layout``; FSDP2's optimizer states on ranks past 0 from ``sharded_elements``."""
    from mlsys_nb.config import TrainConfig
    from mlsys_nb.memory import estimate, sharded_elements
    from mlsys_nb.parallel.harness import dp_tiny_config

    layout = "fsdp2" if impl == "fsdp2" else "units"
    train = TrainConfig(
        micro_batch=2,
        seq_len=16,
        precision="fp32",
        optimizer=optimizer,
        dp=world,
        zero=stage,
        zero_layout=layout,
        device="cpu",
        kernels="eager",
    )
    est = estimate(dp_tiny_config(), train)
    opt = est.optimizer + est.master
    if impl == "fsdp2" and rank:
        el = sharded_elements(dp_tiny_config(), world, "fsdp2", rank=rank)
        opt = opt * el["local"] // el["shard"]
    return dict(params=est.params, grads=est.grads, optimizer=opt)


def test_per_rank_model_state_bytes_match_prediction(runs):
    world, _, per_rank = runs
    for rank, out in enumerate(per_rank):
        for optimizer, res in out["results"].items():
            for impl, stage in STAGES.items():
                measured = {k: res[impl]["memory"][k] for k in ("params", "grads", "optimizer")}
                expected = _predicted_model_states(out["n_params"], world, stage, optimizer, impl, rank)
                assert measured == expected, f"{impl} {optimizer}: measured {measured} vs formula {expected}"


STAGES = dict(naive=0, ddp=0, torch_ddp=0, zero1=1, zero2=2, zero3=3, zero3_prefetch=3, fsdp2=3)


def test_per_rank_model_state_bytes_match_mlsys_nb_memory(runs):
    world, _, per_rank = runs
    for rank, out in enumerate(per_rank):
        for optimizer, res in out["results"].items():
            for impl, stage in STAGES.items():
                measured = {k: res[impl]["memory"][k] for k in ("params", "grads", "optimizer")}
                predicted = _memory_module_prediction(world, stage, optimizer, impl, rank)
                assert measured == predicted, (
                    f"rank {rank} {impl} {optimizer}: measured {measured} vs mlsys_nb.memory {predicted}"
                )


def test_comm_counter_counts_ring_bytes_of_each_collective(runs):
    world, sizes, per_rank = runs
    ring = (world - 1) / world
    for rank, out in enumerate(per_rank):
        probe = out["probe"]
        ops = ("all_reduce", "reduce_scatter_single", "all_gather_single", "broadcast")
        for (op, k), factor in zip(zip(ops, sizes), (2 * ring, ring, ring, 1.0)):
            full = 4 * k * world  # bytes of the full tensor (S as nccl-tests defines it)
            assert probe[op]["ok"], f"rank {rank}: wrapped {op} returned a wrong result"
            assert probe[op]["calls"] == 1 and probe[op]["payload_bytes"] == full, (op, probe[op])
            assert probe[op]["bytes_sent"] == pytest.approx(factor * full), (op, probe[op])
        assert probe["nested"] == (2, 1, True), probe["nested"]


def test_zero3_gathers_one_unit_at_a_time_and_two_with_prefetch(runs):
    """High-water mark of gathered full parameters: the largest unit (a block) without prefetch,
    two with prefetch, which is what mlsys_nb.memory budgets ("2 x largest layer")."""
    from mlsys_nb.config import TrainConfig
    from mlsys_nb.memory import estimate
    from mlsys_nb.parallel.harness import dp_tiny_config

    world, _, per_rank = runs
    cfg = dp_tiny_config()
    block = 4 * (
        cfg.hidden * (2 * cfg.q_dim + 2 * cfg.kv_dim) + 3 * cfg.hidden * cfg.ffn_hidden + 2 * cfg.hidden
    )  # q, o, k, v + gate, up, down + 2 norms, fp32
    block = 4 * -(-block // 4 // world) * world  # gathered into the unit's flat buffer, padded to a multiple of world
    est = estimate(
        cfg,
        TrainConfig(
            micro_batch=2,
            seq_len=cfg.seq_len,
            precision="fp32",
            optimizer="adamw",
            dp=world,
            zero=3,
            zero_layout="units",
            device="cpu",
            kernels="eager",
        ),
    )
    for out in per_rank:
        for res in out["results"].values():
            assert res["zero3"]["peak_gathered_bytes"] == block, res["zero3"]["peak_gathered_bytes"]
            assert res["zero3_prefetch"]["peak_gathered_bytes"] == 2 * block
            want = est.detail["temporary"]["ZeRO-3 gathered layers (2 x largest)"]
            assert res["zero3_prefetch"]["peak_gathered_bytes"] == want
