"""The 5D planner (mlsys_nb.planner): rules, the cost model against hand formulas, uneven pipeline
stages, the error for infeasible inputs, and two published layouts (Llama 3 405B, DeepSeek-V3)."""

import math

import pytest

from mlsys_nb import flops, hardware, memory, planner
from mlsys_nb.config import TrainConfig

SMALL = dict(gpus=64, gpu="H100-SXM", global_batch_tokens=256 * 4096, seq_len=4096)
# Llama Team 2024 (arXiv:2407.21783), Table 4: 16,384 H100, TP8 CP1 PP16 DP128, seq 8192, 16 sequences
# per DP rank (16M tokens per step), 400 TFLOP/s per GPU = 41% BF16 MFU (38-43% over the table's rows).
LLAMA = dict(gpus=16384, gpu="H100-SXM", global_batch_tokens=128 * 16 * 8192, seq_len=8192)
LLAMA_PUB = dict(tp=8, cp=1, pp=16, dp=128)
LLAMA_MFU = 0.41
# DeepSeek-AI 2024 (arXiv:2412.19437): 2,048 H800, PP16 (DualPipe), EP64, ZeRO-1 DP, no TP (§3.2); batch 15,360
# sequences of 4,096 tokens (§4.2); all-to-all: each token reaches at most 4 nodes (node-limited routing, §2.1.2),
# dispatched in FP8 and combined in BF16 (§3.3): ep_copies=4, ep_bytes=1.5 on the wire.
DSV3 = dict(
    gpus=2048,
    gpu="H800-SXM",
    global_batch_tokens=15360 * 4096,
    seq_len=4096,
    precision="fp8-dsv3",
    ep_copies=4,
    ep_bytes=1.5,
)
DSV3_PUB = dict(tp=1, cp=1, pp=16, ep=64, dp=128)
DSV3_TOKENS, DSV3_GPU_HOURS = 14.8e12, 2.664e6  # pre-training tokens and H800 GPU-hours (Table 1)


@pytest.fixture(scope="module")
def small():
    return planner.search("llama-3-8b", **SMALL, top=None)


def test_table_shape_order_and_rules(small):
    df = small
    assert list(df.columns) == planner.COLUMNS
    assert list(df.index) == list(range(len(df))) and len(df) > 20
    assert df["step_s"].is_monotonic_increasing
    cfg = memory.preset("llama-3-8b")
    seqs = SMALL["global_batch_tokens"] // SMALL["seq_len"]
    for r in df.itertuples():
        assert r.dp * r.tp * r.pp * r.cp == SMALL["gpus"]
        assert r.tp <= 8 and cfg.n_heads % r.tp == 0 and seqs % (r.dp * r.micro_batch) == 0
        assert r.memory_bytes <= hardware.gpu("H100-SXM").memory_bytes
        assert (r.schedule == "none") == (r.pp == 1)
        assert isinstance(r.bottleneck, str) and "% of step" in r.bottleneck
    assert 0 < df["mfu"].max() <= 1


def test_memory_column_is_the_heaviest_stage_estimate(small):
    """memory_bytes = the largest of the per-stage estimates (each stage asked separately)."""
    cfg = memory.preset("llama-3-8b")
    for r in small[small.pp > 1].head(5).itertuples():
        t = TrainConfig(
            micro_batch=r.micro_batch,
            seq_len=4096,
            recompute=r.recompute,
            dp=r.dp,
            tp=r.tp,
            sp=r.tp > 1,
            pp=r.pp,
            pp_schedule=r.schedule,
            virtual_stages=r.v if r.schedule == "interleaved-1f1b" else 1,
            n_microbatches=256 // (r.dp * r.micro_batch),
            cp=r.cp,
            zero=r.zero,
            overhead_bytes=4e9,
        )
        per_stage = [memory.estimate(cfg, t, stage=s).total for s in range(r.pp)]
        assert r.memory_bytes == pytest.approx(max(per_stage), rel=1e-12)


def _hand_step_dp_only(model, gpus, tokens, seq_len, zero_overlap=0.8):
    """Step time of pure data parallelism (tp = pp = cp = 1, ZeRO-1, no recompute), written out:
    compute = training FLOPs / (gpus x peak); gradient ring all-reduce 2(n-1) alpha + 2(n-1)/n S / beta
    over the network (n > 8 GPUs), 80% hidden behind backward."""
    cfg = memory.preset(model)
    peak = hardware.gpu("H100-SXM").peak("bf16")
    compute = flops.flops_per_token(cfg, seq_len) * tokens / gpus / peak
    n = gpus
    S = 2 * memory.param_count(cfg).total  # bf16 gradients of the whole model
    ib = hardware.link("infiniband-ndr")
    ar = 2 * (n - 1) * ib.latency_s + 2 * (n - 1) / n * S / ib.per_direction_bytes_per_s
    return compute + ar - min(zero_overlap * ar, 2 / 3 * compute), compute


def test_step_time_matches_hand_formula_for_data_parallelism(small):
    want, compute = _hand_step_dp_only("llama-3-8b", 64, SMALL["global_batch_tokens"], 4096)
    plan = planner.evaluate("llama-3-8b", **SMALL, dp=64, zero=1, recompute="none", micro_batch=1)
    assert plan.step_s == pytest.approx(want, rel=1e-9)
    assert plan.time["compute"] == pytest.approx(compute, rel=1e-9)
    assert plan.mfu == pytest.approx(compute / want, rel=1e-9)  # MFU = useful compute / step at peak


def test_bubble_is_the_closed_form(small):
    plan = planner.evaluate("llama-3-8b", **SMALL, dp=16, tp=1, pp=4, zero=1, schedule="1f1b")
    m = plan.microbatches
    busy = plan.step_s - plan.time["bubble"] - plan.time["DP comm"]
    assert plan.time["bubble"] == pytest.approx(busy * (4 - 1) / m, rel=1e-9)  # 1F1B: (p-1)/m of busy time
    inter = planner.evaluate("llama-3-8b", **SMALL, dp=16, pp=4, zero=1, schedule="interleaved-1f1b", v=2)
    busy_i = inter.step_s - inter.time["bubble"] - inter.time["DP comm"]
    assert inter.time["bubble"] == pytest.approx(busy_i * 3 / (2 * m), rel=1e-9)


def test_checks_fail_when_the_idea_is_broken(monkeypatch, small):
    """The hand-formula and bubble checks catch a planner that forgets the bubble or the overlap."""
    want, _ = _hand_step_dp_only("llama-3-8b", 64, SMALL["global_batch_tokens"], 4096)
    monkeypatch.setattr(planner, "_coll", lambda *a: 0.0)  # communication forgotten
    plan = planner.evaluate("llama-3-8b", **SMALL, dp=64, zero=1)
    assert plan.step_s != pytest.approx(want, rel=1e-6)
    monkeypatch.undo()
    planner._bubble_ratio.cache_clear()
    monkeypatch.setattr(planner, "_bubble_ratio", lambda *a: 0.0)  # bubble forgotten
    plan = planner.evaluate("llama-3-8b", **SMALL, dp=16, pp=4, zero=1, schedule="1f1b")
    busy = plan.step_s - plan.time["bubble"] - plan.time["DP comm"]
    assert plan.time["bubble"] != pytest.approx(busy * 3 / plan.microbatches, rel=1e-6)


def test_tp_and_other_groups_use_their_links():
    plan = planner.evaluate(
        "llama-3.1-70b",
        gpus=64,
        gpu="H100-SXM",
        global_batch_tokens=512 * 4096,
        seq_len=4096,
        tp=8,
        pp=2,
        dp=4,
        zero=1,
        recompute="full",
        schedule="1f1b",
    )
    assert plan.links["tp"] == "nvlink4"
    assert plan.links["dp"] == "infiniband-ndr" and plan.links["pp"] == "infiniband-ndr"
    small_job = planner.evaluate(
        "llama-3-8b",
        gpus=8,
        gpu="H100-SXM",
        global_batch_tokens=64 * 4096,
        seq_len=4096,
        tp=2,
        dp=4,
        zero=1,
        recompute="full",
    )
    assert small_job.links["dp"] == "nvlink4"  # dp x tp = 8 fits in a node
    h800 = planner.evaluate(
        "llama-3-8b",
        gpus=8,
        gpu="H800-SXM",
        global_batch_tokens=64 * 4096,
        seq_len=4096,
        tp=2,
        dp=4,
        zero=1,
        recompute="full",
    )
    assert h800.links["tp"] == "nvlink4-h800" and h800.time["TP comm"] > small_job.time["TP comm"]


def test_h800_in_hardware_table():
    h800, h100 = hardware.gpu("H800-SXM"), hardware.gpu("H100-SXM")
    assert h800.peak_flops == h100.peak_flops and h800.memory_bytes == 80e9  # datasheet (no reported total)
    assert hardware.link(h800.nvlink).bidirectional_bytes_per_s == 400e9 and "arXiv:2412.19437" in h800.source


# ---- uneven pipeline stages ------------------------------------------------------------------
def test_stage_layers_floor_ceil_and_published_split():
    assert memory.stage_layers(126, 16) == (7,) + (8,) * 14 + (7,)  # Meta: one layer fewer on first/last
    assert memory.stage_layers(61, 16) == (3,) + (4,) * 13 + (3, 3)
    for L, pp in [(10, 3), (7, 7), (100, 9), (5, 2)]:
        s = memory.stage_layers(L, pp)
        assert sum(s) == L and max(s) - min(s) <= 1 and len(s) == pp
    assert memory.stage_layers(10, 3, (2, 5, 3)) == (2, 5, 3)
    with pytest.raises(ValueError, match="pp"):
        memory.stage_layers(4, 5)
    with pytest.raises(ValueError, match="pp_layers"):
        memory.stage_layers(10, 3, (2, 2, 2))


def test_memory_uses_the_heaviest_uneven_stage():
    cfg = memory.preset("llama-3.1-405b")
    per_layer = memory.param_count(cfg).per_layer
    t = TrainConfig(pp=16, dp=1, seq_len=8192)
    for st, (lo, hi) in {0: (0, 7), 1: (7, 15), 15: (119, 126)}.items():
        b = memory.estimate(cfg, t, stage=st)
        head = cfg.vocab_size * cfg.hidden * ((st == 0) + (st == 15)) + (cfg.hidden if st == 15 else 0)
        assert b.layers == hi - lo and b.n_params_rank == pytest.approx(sum(per_layer[lo:hi]) + head)
    custom = memory.estimate(cfg, t.replace(pp_layers=(6,) + (8,) * 15), stage=0)
    assert custom.layers == 6
    heaviest = memory.estimate(cfg, t)
    assert heaviest.total == max(memory.estimate(cfg, t, stage=s).total for s in range(16))


def test_dualpipe_rank_holds_two_stages():
    cfg = memory.preset("llama-3-8b")
    one = memory.estimate(cfg, TrainConfig(pp=4, n_microbatches=8, pp_schedule="1f1b", seq_len=2048), stage=1)
    two = memory.estimate(cfg, TrainConfig(pp=4, n_microbatches=8, pp_schedule="dualpipe", seq_len=2048), stage=1)
    assert two.n_params_rank == pytest.approx(2 * one.n_params_rank)  # stages 1 and 2: 8 + 8 layers
    assert two.in_flight == 5  # pp + 1 micro-batches


# ---- errors ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(global_batch_tokens=1000), "global_batch_tokens"),
        (dict(gpus=0), "gpus"),
        (dict(gpu="B300"), "B300"),
        (dict(compute_efficiency=2.0), "compute_efficiency"),
        (dict(dp_overlap=-0.1), "dp_overlap"),
        (dict(precision="fp4"), "precision"),
        (dict(tp=16), "gpus_per_node"),
        (dict(zero=5), "zero"),
        (dict(bogus=1), "bogus"),
    ],
)
def test_bad_inputs_are_explained(kw, match):
    with pytest.raises((ValueError, KeyError, TypeError), match=match):
        planner.search("llama-3-8b", **{**SMALL, **kw})


def test_infeasible_names_the_smallest_shortfall():
    kw = dict(
        gpus=8,
        gpu="A100-40GB-SXM",
        global_batch_tokens=64 * 4096,
        seq_len=4096,
        tp=8,
        pp=1,
        zero=(0, 1),
        recompute=("none", "full"),
        micro_batch=(1, 2),
    )
    with pytest.raises(ValueError, match=r"GB too much") as e:
        planner.search("llama-3.1-70b", **kw)
    # brute force over the same space: the smallest need
    cfg = memory.preset("llama-3.1-70b")
    needs = [
        memory.estimate(
            cfg,
            TrainConfig(
                micro_batch=mb,
                seq_len=4096,
                dp=1,
                tp=8,
                sp=True,
                zero=z,
                recompute=r,
                n_microbatches=64 // mb,
                gpu="A100-40GB-SXM",
                overhead_bytes=4e9,
            ),
        ).total
        for z in (0, 1)
        for r in ("none", "full")
        for mb in (1, 2)
    ]
    assert f"needs {min(needs) / 1e9:.1f} GB" in str(e.value)


def test_pruning_keeps_memory_estimates_few(small):
    """Speed comes from closed forms: most candidates never reach mlsys_nb.memory.estimate (timed in
    benchmarks/planner.py, not here)."""
    df = planner.search("llama-3.1-405b", **LLAMA)
    a = df.attrs
    assert a["memory_estimates"] < 0.05 * a["candidates"] and a["candidates"] > 5000


# ---- published layouts ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    full = planner.search("llama-3.1-405b", **LLAMA, top=20)
    pub = planner.search("llama-3.1-405b", **LLAMA, **{k: v for k, v in LLAMA_PUB.items() if k != "dp"}, top=None)
    meta_space = planner.search("llama-3.1-405b", **LLAMA, cp=1, top=None)  # CP only for long context (Meta)
    return full, pub[pub.dp == LLAMA_PUB["dp"]].reset_index(drop=True), meta_space


def test_llama3_405b_layout_fits_and_ranks_near_the_top(llama):
    full, pub, meta_space = llama
    assert len(pub) > 0, "TP8 CP1 PP16 DP128 must fit"
    best_pub = pub.iloc[0]
    layouts = meta_space.drop_duplicates(["dp", "tp", "pp", "cp"]).reset_index(drop=True)
    assert planner.rank_of(layouts, **LLAMA_PUB) < 5  # 4th of the cp=1 layouts
    assert best_pub.step_s <= 1.10 * meta_space.step_s.iloc[0]
    # over the whole space the model prefers TP4 x CP4 (no recomputation needed): stated gap
    assert best_pub.step_s <= 1.6 * full.step_s.iloc[0]
    # modelled MFU (compute at peak) is an upper bound of the reported 41%, within 1.5x
    assert LLAMA_MFU <= best_pub.mfu <= 1.5 * LLAMA_MFU


@pytest.fixture(scope="module")
def dsv3():
    full = planner.search("deepseek-v3", **DSV3, top=40)
    pub = planner.search("deepseek-v3", **DSV3, **{k: v for k, v in DSV3_PUB.items() if k != "dp"}, top=None)
    return full, pub[pub.dp == DSV3_PUB["dp"]].reset_index(drop=True)


def test_deepseek_v3_layout_fits_and_ranks_near_the_top(dsv3):
    full, pub = dsv3
    assert len(pub) > 0
    best = pub.iloc[0]
    z1 = pub[pub.zero == 1]  # the published ZeRO-1 variant is as fast as the best variant of these degrees
    assert best.schedule == "dualpipe" and len(z1) and z1.iloc[0].step_s == best.step_s
    assert z1.iloc[0].schedule == "dualpipe"
    assert planner.rank_of(full, **DSV3_PUB) is not None  # among the 40 best of the whole space
    assert best.step_s <= 1.10 * full.step_s.iloc[0]
    cfg = memory.preset("deepseek-v3")
    implied = flops.implied_mfu(cfg, DSV3_TOKENS, DSV3_GPU_HOURS, gpu="H800-SXM", seq_len=4096)
    assert 0.3 < implied < 0.45
    assert implied <= best.mfu <= 2.0 * implied


def test_mla_flops_match_the_active_parameter_count():
    cfg = memory.preset("deepseek-v3")
    b = flops.breakdown(cfg, 4096).forward
    pc = memory.param_count(cfg)
    norms = cfg.n_layers * (2 * cfg.hidden + cfg.q_lora_rank + cfg.kv_lora_rank) + cfg.hidden
    matmul_params = pc.active - pc.embedding - norms  # every other weight is used once per token
    assert b["qkv"] + b["out_proj"] + b["mlp"] + b["lm_head"] == pytest.approx(2 * matmul_params, rel=1e-12)
    assert math.isclose(b["attn_scores"] / b["attn_values"], (128 + 64) / 128)


def test_uneven_stage_check_fails_when_layers_are_dropped(monkeypatch):
    """A split that forgets the L mod pp extra layers (7 x 16 = 112 of 126) is caught by the per-stage
    parameter check above: stage 1 would hold 7 layers, not 8."""
    cfg = memory.preset("llama-3.1-405b")
    per_layer = memory.param_count(cfg).per_layer
    monkeypatch.setattr(memory, "stage_layers", lambda L, pp, split=None: (L // pp,) * pp)
    b = memory.estimate(cfg, TrainConfig(pp=16, dp=1, seq_len=8192), stage=1)
    assert not (b.layers == 8 and b.n_params_rank == pytest.approx(sum(per_layer[7:15])))
