"""The spot-the-error cards of the source texts' wrong claims (``quiz.bank.cards_training``, ``cards_serving``):
each refuting number computed a second way here (the real model on the meta device, hand formulas from the
papers and datasheets, the simulator, the GPU record's Markdown table) and compared with the owner the card
calls; both statements of every card drawn; and a broken owner caught by the card's second route."""

from __future__ import annotations

import re

import pytest
import torch

from mlsys_nb import quiz

SEED_CARDS = [
    "cards.allreduce_time",
    "cards.nvlink_h100",
    "cards.infiniband_bytes",
    "cards.zero2_states",
    "cards.gpipe_bubble",
    "cards.interleaved_memory",
    "cards.mixtral_params",
    "cards.all_to_all_bytes",
    "cards.recompute_cost",
    "cards.memory_per_param",
    "cards.gpu_days",
    "cards.nvswitch_nodes",
    "cards.prefill_bound",
    "cards.kv_per_token",
    "cards.kv_long_request",
    "cards.seventy_b_one_gpu",
    "cards.speculative_tokens",
    "cards.async_rlhf",
    "cards.rlhf_adam_states",
    "cards.gae_weight",
    "cards.kernel_launch",
    "cards.fp8_kv_capacity",
    "cards.kv_requests_fit",
    "cards.gb_vs_gib",
    "cards.zero2_traffic",
    "cards.tp_allreduces",
    "cards.dp_overlap_ratio",
    "cards.optimizer_state_units",
    "cards.zero_stage_named",
    "cards.network_vs_nvme",
    "cards.moe_tokens_rule",
    "cards.serving_gpus_batching",
    "cards.rollout_one_gpu",
]


def _meta_total(preset: str) -> dict:
    """Parameters of the kit's Transformer built on the meta device, and one routed expert's."""
    from mlsys_nb.memory import preset as cfg_of
    from mlsys_nb.models import Transformer

    cfg = cfg_of(preset)
    with torch.device("meta"):
        model = Transformer(cfg.replace(n_layers=1))
    one = sum(p.numel() for p in model.parameters())
    with torch.device("meta"):
        two = sum(p.numel() for p in Transformer(cfg.replace(n_layers=2)).parameters())
    experts = [m for n, m in model.named_modules() if re.search(r"experts\.\d+$", n)]
    expert = sum(p.numel() for p in experts[0].parameters()) if experts else 0
    return dict(cfg=cfg, total=one + (cfg.n_layers - 1) * (two - one), expert=expert)


def _kv(cfg, nbytes=2):
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * nbytes


def test_the_bank_holds_at_least_25_cards_and_each_shows_both_statements():
    cards = [f for f in quiz.families() if f.startswith("cards.")]
    assert len(cards) >= 25 and set(SEED_CARDS) <= set(cards), sorted(set(SEED_CARDS) - set(cards))
    for name in SEED_CARDS:
        shown = {quiz.make(name, s).params["shown"] for s in range(16)}
        assert shown == {"misconception", "correction"}, name


@pytest.mark.parametrize("name", SEED_CARDS)
def test_the_route_judges_both_statements(name):
    """The second route says "false" of the misconception and "true" of the correction, whichever was drawn."""
    from mlsys_nb.quiz import routes

    for seed in range(16):
        q = quiz.make(name, seed)
        want = "true" if q.params["shown"] == "correction" else "false"
        assert routes.second_route(q) == want == q.answer, (name, seed, q.text)


def test_training_cards_refuting_numbers_a_second_way():
    from mlsys_nb import comm, flops, hardware, memory
    from mlsys_nb import pipeline as pl

    # allreduce_time: ring all-reduce sends 2(n-1)/n S: 1.75 GB at n = 8, 3.89 ms on 450 GB/s
    assert comm.collective_time("all_reduce", 1e9, 8, 0.0, 450e9) == pytest.approx(1.75e9 / 450e9)
    # nvlink_h100 / infiniband_bytes: datasheet figures (18 links x 25 GB/s; 400 Gb/s / 8)
    assert hardware.link(hardware.gpu("H100-SXM").nvlink).bidirectional_bytes_per_s == 2 * 18 * 25e9
    assert hardware.link("infiniband-ndr").per_direction_bytes_per_s == 400e9 / 8
    # zero2_states: the tutorial's own components (140 + 140 + 560 GB) with grads and moments over 8: 227.5, not 210
    assert memory.model_state_bytes(70e9, dp=8, zero=2, precision="bf16-nomaster").total == pytest.approx(
        140e9 + 140e9 / 8 + 560e9 / 8
    )
    # gpipe_bubble: the simulator's idle fraction is (p-1)/(m+p-1) = 27.3 % at p 4, m 8 (the script printed 68.6 %)
    r = pl.simulate(pl.schedule("gpipe", 4, 8), F=1, B=2)
    assert r.bubble_fraction == pytest.approx(3 / 11) and 3 * 8 / (4 * 8 + 3) == pytest.approx(0.686, abs=1e-3)
    # interleaved_memory: the simulator's first stage holds p + (p-1)/v micro-batches, 1F1B p
    inter = pl.simulate(pl.schedule("interleaved-1f1b", 4, 16, 2), F=1, B=2).peak_activations[0]
    assert inter == pl.peak_in_flight("interleaved-1f1b", 4, 16, 2)[0] == 4 + 3 / 2 > 4
    # mixtral_params: counted on the meta model, published counts (Jiang et al. 2024) 46.7B / 12.9B, not 61 / 19
    m = _meta_total("mixtral-8x7b")
    cfg = m["cfg"]
    active = m["total"] - cfg.n_layers * (cfg.n_experts - cfg.top_k) * m["expert"]
    pc = memory.param_count(cfg)
    assert (pc.total, pc.active) == (m["total"], active) == (46_702_792_704, 12_879_925_248)
    # all_to_all_bytes: (n-1)/n S once vs 2(n-1)/n S
    assert comm.bytes_sent_per_rank("all_to_all", 1e9, 8) == pytest.approx(
        comm.bytes_sent_per_rank("all_reduce", 1e9, 8) / 2
    )
    # recompute_cost: full recomputation adds at most one forward, 2 of 6 FLOPs per parameter per token
    c = memory.preset("llama-2-7b")
    assert 0.2 < flops.hardware_flops_per_token(c, 4096, recompute="full") / flops.flops_per_token(c, 4096) - 1 < 1 / 3
    # memory_per_param: activations per layer grow with s (Korthikanti's sbh(34 + 5as/h) even faster)
    t = [memory.estimate(c, memory.TrainConfig(micro_batch=1, seq_len=s)).activations_per_layer for s in (1024, 8192)]
    hand = [s * c.hidden * (34 + 5 * c.n_heads * s / c.hidden) for s in (1024, 8192)]
    assert t[1] / t[0] == pytest.approx(8) and hand[1] / hand[0] > 8  # FlashAttention (kit default): linear in s
    # gpu_days: days are wall clock; GPU-days = days x GPUs
    est = flops.training_time("llama-2-70b", 2e12, gpu="H100-SXM", n_gpus=1024, mfu=0.4)
    assert est.gpu_hours / 24 == pytest.approx(est.days * 1024)
    # zero2_traffic: reduce-scatter (n-1)/n S + all-gather (n-1)/n S = DDP's 2(n-1)/n S, not half of it
    from mlsys_nb.parallel import tensor as tp
    from mlsys_nb.parallel import zero

    for n in (8, 64):
        assert zero.zero_bytes_per_step(70e9, n, 2) == pytest.approx(2 * (n - 1) / n * 140e9)
        assert zero.zero_bytes_per_step(70e9, n, 2) == pytest.approx(zero.zero_bytes_per_step(70e9, n, 0))
    # tp_allreduces: a layer's forward sends two ring all-reduces of [b, s, h] (backward two more, the conjugates)
    for t in (2, 4, 8):
        assert tp.tp_bytes_per_layer(1, 4096, 8192, t, False) == pytest.approx(2 * 2 * (t - 1) / t * 4096 * 8192 * 2)
    # nvswitch_nodes: a 16-rank group on 8-GPU nodes leaves NVLink
    from mlsys_nb.planner.context import plan_context
    from mlsys_nb.planner.traffic import group_link

    ctx = plan_context("llama-3-8b", gpus=16, gpu="H100-SXM", global_batch_tokens=8192 * 16, seq_len=8192)
    assert group_link(ctx, 1, 8)[0] == "nvlink4" and group_link(ctx, 1, 16)[0] == "infiniband-ndr"


def test_serving_cards_refuting_numbers_a_second_way():
    from mlsys_nb import hardware, inference, memory
    from mlsys_nb.inference.speculative import expected_tokens_per_step
    from mlsys_nb.quiz.routes.cards_serving import recorded_launch_us
    from mlsys_nb.quiz.routes.rl import rlhf_timeline
    from mlsys_nb.rl import sizing
    from mlsys_nb.rl.gae import gae
    from mlsys_nb.runtime.gpu_record import lookup

    # prefill_bound: 100 tokens at batch 1 are ~100 FLOP/B, below the H100's ridge (989 TFLOP/s / 3.35 TB/s)
    g = hardware.gpu("H100-SXM")
    c = inference.prefill_cost("llama-2-70b", "H100-SXM", 100)
    assert c.bound == "memory" and c.intensity_flop_per_byte < 100.1 < g.peak("bf16") / g.hbm_bandwidth_bytes_per_s
    # kv_per_token / kv_long_request: 2·L·n_kv·d·2 bytes: 128 KiB (Llama-3-8B), 320 KiB x 32768 = 10 GiB (70B)
    assert inference.kv_bytes_per_token("llama-3-8b") == _kv(memory.preset("llama-3-8b")) == 128 * 1024
    assert inference.kv_cache_bytes("llama-2-70b", 32768) == _kv(memory.preset("llama-2-70b")) * 32768 == 10 * 2**30
    # seventy_b_one_gpu: the meta model's bf16 weights exceed an 80 GB H100
    w = 2 * _meta_total("llama-2-70b")["total"]
    assert inference.weight_bytes("llama-2-70b") == w and not g.fits(w) and w > 80e9
    # speculative_tokens: sum of alpha^i, i = 0..k: 3.689 at 0.8, 5 (3.36 is k = 4)
    assert expected_tokens_per_step(0.8, 5) == pytest.approx(sum(0.8**i for i in range(6))) == pytest.approx(3.68928)
    # async_rlhf: the two-worker timeline matches the closed forms and stays below 1.5x when generation dominates
    for gen, train in ((8.0, 1.0), (10.0, 2.0)):
        ends = [rlhf_timeline(gen, train, 0.5, lag=lag) for lag in (1, 2)]
        sim = (ends[0][-1] - ends[0][20]) / (ends[1][-1] - ends[1][20])
        closed = sizing.sync_step_s(gen, train, 0.5) / sizing.async_step_s(gen, train, 0.5)
        assert sim == pytest.approx(closed, rel=1e-9) and closed < 1.5
    # rlhf_adam_states: two trained 70B models over TP 8: 2 x 8.75B x 8 B = 140 GB of moments, not 70
    assert 2 * memory.model_state_bytes(70e9 / 8).optimizer == pytest.approx(2 * 8.75e9 * 8) == pytest.approx(140e9)
    # gae_weight: the weight of the TD error 10 steps ahead is (γλ)^10 = 0.5415
    r = torch.zeros(11, dtype=torch.float64)
    r[10] = 1
    adv, _ = gae(r, torch.zeros_like(r), torch.zeros_like(r), torch.tensor(0.0, dtype=torch.float64), 0.99, 0.95)
    assert float(adv[0]) == pytest.approx((0.99 * 0.95) ** 10) == pytest.approx(0.5415, abs=1e-4)
    # kv_requests_fit: 480e9 B / (327,680 B x tokens): 357 / 178 / 44 requests, not the tutorial's 375 / 187 / 46
    per_token = _kv(memory.preset("llama-2-70b"))
    assert [int(480e9 // (per_token * c)) for c in (4096, 8192, 32768)] == [357, 178, 44]
    assert [int(480e9 // inference.kv_cache_bytes("llama-2-70b", c)) for c in (4096, 8192, 32768)] == [357, 178, 44]
    # fp8_kv_capacity: KIVI's per-channel K and per-token V fp32 scales: 1.75x bf16's tokens at Llama-2-7B's shape
    from mlsys_nb.inference.kv_cache import kv_block_bytes

    L, H, d, b = 32, 32, 128, 16
    hand = (2 * L * H * d * b * 2) / (L * H * (b * d + 4 * d) + L * H * b * (d + 4))
    assert kv_block_bytes("llama-2-7b", 16) / kv_block_bytes("llama-2-7b", 16, "fp8") == pytest.approx(hand)
    assert 1.7 < hand < 1.8
    # gb_vs_gib (the playbook's "140GB (=133GiB)"): 140e9 B is 130.4 GiB
    assert (
        memory.model_state_bytes(70e9).params / memory.GiB
        == pytest.approx(140e9 / 1024**3)
        == pytest.approx(130.39, abs=0.01)
    )
    # kernel_launch: the GPU record (JSON) and its Markdown table agree, ~10 us, about 5x below 50 us
    rec = lookup("test_kernel_launch_latency", "launch cost per tiny kernel")[0]["value"]
    assert rec == pytest.approx(recorded_launch_us(), rel=1e-3) and 50 / rec > 4


def test_seed_cards_of_issue_52_refuting_numbers_a_second_way():
    """The seven cards added for the seed errors left uncarded: each refuting number by hand."""
    from mlsys_nb import comm, hardware, inference, memory

    peak, ndr = hardware.gpu("H100-SXM").peak("bf16"), 400e9 / 8
    # dp_overlap_ratio: all-reduce of 2N bytes over backward 4·N·tokens FLOPs; N cancels
    for n in (8e9, 70e9):
        r = comm.collective_time("all_reduce", 2 * n, 8, 0.0, ndr) / (4 * n * 4096 / peak)
        assert r == pytest.approx(7 / 8 * 2 * peak / (2 * 4096 * ndr))
    # optimizer_state_units: m, v and the master are three fp32 values per weight: 12 h² bytes, not 6 h²
    s = memory.model_state_bytes(4096**2)
    assert s.optimizer + s.master == 12 * 4096**2
    # zero_stage_named: only the optimizer states (incl. the master) divided by DP is ZeRO-1; ZeRO-3 is 16 N / DP
    for dp in (8, 16, 32):
        assert memory.model_state_bytes(70e9, dp=dp, zero=1).total == pytest.approx(4 * 70e9 + 12 * 70e9 / dp)
        assert memory.model_state_bytes(70e9, dp=dp, zero=3).total == pytest.approx(16 * 70e9 / dp)
    # network_vs_nvme: an NVMe drive's PCIe 4.0 x4 link (16 GT/s, 128b/130b) carries < 8 GB/s; NDR 50 GB/s
    x4 = hardware.link("pcie4-x16").per_direction_bytes_per_s / 4
    assert x4 == pytest.approx(16e9 * 4 * 128 / 130 / 8, rel=0.02) and 2 * x4 < ndr / 3
    # moe_tokens_rule: Mixtral's total and active counts (meta model) are 3.63x apart
    m = _meta_total("mixtral-8x7b")
    active = m["total"] - m["cfg"].n_layers * (m["cfg"].n_experts - m["cfg"].top_k) * m["expert"]
    assert m["total"] / active == pytest.approx(3.626, abs=1e-3)
    # serving_gpus_batching: the plan meets 50 tokens/s per user and the target; batch 1 would need ~100x the GPUs
    cfg, bw = memory.preset("llama-3-8b"), hardware.gpu("H100-SXM").hbm_bandwidth_bytes_per_s
    weights = 2 * (_meta_total("llama-3-8b")["total"] - cfg.vocab_size * cfg.hidden)  # the matmul weights, read once
    for seed in range(6):
        q = quiz.make("cards.serving_gpus_batching", seed)
        batch, n = (int(x) for x in re.search(r"; batch (\d+) step .*?\) = (\d+) \(", q.solution[0]).groups())
        step = max(weights * batch / peak, (weights + batch * 151 * _kv(cfg)) / bw)  # hand roofline (no attention)
        assert step <= 1 / 50 and n * batch / step >= 0.99 * q.params["target"] > (n - 1) * batch / step, (seed, n)
        one = (weights + 151 * _kv(cfg)) / bw
        assert q.params["target"] * one > 50 * n, "one request per GPU needs far more GPUs"
    # rollout_one_gpu: 70B bf16 weights exceed one 80 GB H100; at TP 2 each GPU holds half the weights and KV
    w, kv = 2 * _meta_total("llama-2-70b")["total"], _kv(memory.preset("llama-2-70b")) * 150
    assert w > 0.9 * 80e9 and (0.9 * 80e9 - w / 2) / (kv / 2) >= 64 > 0
    assert inference.max_concurrent_sequences("llama-2-70b", "H100-SXM", 150, tp=2) >= 64


def _tutorial_simulator(monkeypatch):
    """pipeline.simulate reporting the tutorial script's bubble (p−1)·m/(p·m + p − 1) instead of the timeline's."""
    from mlsys_nb import pipeline as pl

    real = pl.simulate

    def simulate(sched, **kw):
        real(sched, **kw)
        return type("Broken", (), {"bubble_fraction": (sched.p - 1) * sched.m / (sched.p * sched.m + sched.p - 1)})

    monkeypatch.setattr(pl, "simulate", simulate)


BROKEN = {  # card -> how its owner is broken
    "cards.speculative_tokens": lambda mp: mp.setattr(
        "mlsys_nb.inference.speculative.expected_tokens_per_step", lambda a, k: 1 + a * k
    ),  # no geometric sum
    "cards.kv_long_request": lambda mp: mp.setattr(
        "mlsys_nb.inference.kv_cache.kv_bytes_per_token", lambda model, dtype="bf16": 2.0**20
    ),  # "one token is about 1 MB"
    "cards.zero2_states": lambda mp: mp.setattr(
        "mlsys_nb.memory.model_state_bytes",
        lambda n, dp=1, zero=0, precision="bf16-mixed": __import__("mlsys_nb.memory").memory.ModelStates(
            params=2 * n, grads=0, optimizer=8 * n / dp, master=0
        ),
    ),  # gradients dropped, as in the tutorial's table
    "cards.gpipe_bubble": _tutorial_simulator,
    "cards.dp_overlap_ratio": lambda mp: mp.setattr(
        "mlsys_nb.comm.collective_time", lambda op, size, n, alpha, beta: size / beta
    ),  # the message divided by the bandwidth (each byte crossing a link once)
    "cards.optimizer_state_units": lambda mp: mp.setattr(
        "mlsys_nb.memory.model_state_bytes",
        lambda n, dp=1, zero=0, precision="bf16-mixed": __import__("mlsys_nb.memory").memory.ModelStates(
            params=2 * n, grads=2 * n, optimizer=8 * n, master=0
        ),
    ),  # the fp32 master copy forgotten
    "cards.serving_gpus_batching": lambda mp: mp.setattr(
        "mlsys_nb.inference.decode_cost",
        lambda model, gpu, context, batch=1, **kw: _times_batch(model, gpu, context, batch),
    ),  # a decode step that reads the weights once per sequence: batching gains nothing
    "cards.rollout_one_gpu": lambda mp: mp.setattr(
        "mlsys_nb.inference.max_concurrent_sequences", lambda model, gpu, seq_len, tp=1, **kw: 10**6
    ),  # the weights left out of the memory budget
}


def _times_batch(model, gpu, context, batch):
    """inference.decode_cost as if each sequence of the batch were decoded alone, one after another."""
    import dataclasses

    from mlsys_nb.inference.roofline import decode_cost

    one = decode_cost(model, gpu, context)
    return dataclasses.replace(one, batch=batch, flops=one.flops * batch, bytes=one.bytes * batch)


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_a_broken_owner_fails_the_cards_second_route(monkeypatch, name):
    """With the owner broken, the corrected statement the card shows carries the wrong number and the second
    route (which never calls the owner) judges it false, so the key "true" fails."""
    from mlsys_nb.quiz import routes

    BROKEN[name](monkeypatch)
    corrections = [q for s in range(16) if (q := quiz.make(name, s)).params["shown"] == "correction"]
    assert corrections and all(routes.second_route(q) == "false" != q.answer for q in corrections), name
