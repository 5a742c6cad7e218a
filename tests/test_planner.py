"""The 5D planner (mlsys_nb.planner): rules, the cost model against hand formulas (uncalibrated:
``calibration=None``), uneven pipeline stages, the error for infeasible inputs, two published layouts
(Llama 3 405B, DeepSeek-V3), and the calibration on data/published_runs.yaml (fit, leave-one-out
predictions, published layouts in the search's top 10, compare)."""

import math

import pytest

from mlsys_nb import flops, hardware, memory, planner
from mlsys_nb.config import TrainConfig

SMALL = dict(gpus=64, gpu="H100-SXM", global_batch_tokens=256 * 4096, seq_len=4096)
UNCAL = dict(SMALL, calibration=None)  # the model at datasheet peaks: what the hand formulas below write out
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
    return planner.search("llama-3-8b", **SMALL, top=300)  # 300 of ~9,000 rows: the rules hold on each


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
            recompute_layers=r.recompute_layers or None,
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
    plan = planner.evaluate("llama-3-8b", **UNCAL, dp=64, zero=1, recompute="none", micro_batch=1)
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
    monkeypatch.setattr(planner.traffic, "collective_seconds", lambda *a: 0.0)  # communication forgotten
    plan = planner.evaluate("llama-3-8b", **UNCAL, dp=64, zero=1)
    assert plan.step_s != pytest.approx(want, rel=1e-6)
    monkeypatch.undo()
    planner.bubble_ratio.cache_clear()
    monkeypatch.setattr(planner.model, "bubble_ratio", lambda *a: 0.0)  # bubble forgotten
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


# ---- pruning: bounds below the estimate, the same rows as without them ----------------------
PRUNE_CASES = [  # (model, setup, a restriction that keeps the unpruned search to a few seconds)
    (
        "llama-3-8b",
        dict(gpus=64, gpu="H100-SXM", global_batch_tokens=256 * 4096, seq_len=4096),
        dict(micro_batch=(1, 2, 4)),
    ),
    (
        "mixtral-8x7b",
        dict(gpus=128, gpu="H100-SXM", global_batch_tokens=512 * 4096, seq_len=4096),
        dict(micro_batch=(1, 2), zero=(1, 3)),
    ),
    (
        "llama-3-70b",
        dict(gpus=256, gpu="A100-80GB-SXM", global_batch_tokens=1024 * 4096, seq_len=4096),
        dict(micro_batch=(1, 2), zero=(1, 3)),
    ),
    (
        "deepseek-v3",
        dict(gpus=512, gpu="H800-SXM", global_batch_tokens=2048 * 4096, seq_len=4096, precision="fp8-dsv3"),
        dict(pp=(8, 16), micro_batch=1, zero=(1, 3)),
    ),
]


def _random_layouts(model, setup, n, seed):
    import random

    ctx = planner.context.plan_context(model, **setup)
    cands, _ = planner.layout_search.layout_candidates(
        ctx, None, None, None, None, (0, 1, 2, 3), ("none", "selective", "full"), None, planner.SCHEDULES[1:], None
    )
    return ctx, random.Random(seed).sample(cands, n)


def _estimates(ctx, lays):
    """(layout, micro-batches, memory.estimate total) of the layouts whose schedule accepts them."""
    out = []
    for lay in lays:
        m = ctx.sequences // (lay.dp * lay.micro_batch)
        try:
            out.append((lay, m, memory.estimate(ctx.model, planner.context.layout_train_config(ctx, lay, m)).total))
        except ValueError:  # a schedule that does not take (pp, m, v): search never asks
            pass
    return out


@pytest.mark.parametrize("model,setup,_kw", PRUNE_CASES, ids=[c[0] for c in PRUNE_CASES])
def test_memory_bounds_are_below_the_estimate(model, setup, _kw):
    """Both closed-form bounds (model states or last-stage activations; per rank, states + block
    activations) never exceed mlsys_nb.memory.estimate, on random layouts of four models."""
    ctx, lays = _random_layouts(model, setup, 120, seed=len(model))
    rows = _estimates(ctx, lays)
    assert len(rows) > 60
    for lay, m, est in rows:
        assert planner.bounds.memory_bound(ctx, lay, m) <= est * (1 + 1e-12), lay
        assert planner.bounds.stage_memory_bound(ctx, lay, m) <= est * (1 + 1e-12), lay


def _unpruned(monkeypatch):
    monkeypatch.setattr(planner.bounds, "memory_bound", lambda *a: 0.0)
    monkeypatch.setattr(planner.bounds, "stage_memory_bound", lambda *a: 0.0)


def test_pruned_search_returns_the_unpruned_rows(monkeypatch):
    """The pruned search (two lower bounds before memory.estimate) returns exactly the rows of a
    search that runs the estimate on every layout in step-time order; random ``top`` per case."""
    import random

    rng = random.Random(1)
    runs = []
    for model, setup, kw in PRUNE_CASES:
        top = rng.choice([5, 20, 40])
        runs.append((model, setup, kw, top, planner.search(model, **setup, **kw, top=top)))
    _unpruned(monkeypatch)
    for model, setup, kw, top, pruned in runs:
        full = planner.search(model, **setup, **kw, top=top)
        assert full.equals(pruned), model
        assert full.attrs["memory_estimates"] > pruned.attrs["memory_estimates"], model


def test_pruning_check_fails_with_a_bound_above_the_estimate(monkeypatch):
    """A 'bound' 20 % above the per-rank sum (no longer a lower bound) drops layouts that fit: both
    checks above catch it."""
    model, setup, kw = PRUNE_CASES[2]
    real = planner.bounds.stage_memory_bound
    monkeypatch.setattr(planner.bounds, "stage_memory_bound", lambda ctx, lay, m: 1.2 * real(ctx, lay, m))
    ctx, lays = _random_layouts(model, setup, 120, seed=len(model))
    assert any(
        planner.bounds.stage_memory_bound(ctx, lay, m) > est * (1 + 1e-12) for lay, m, est in _estimates(ctx, lays)
    )
    broken = planner.search(model, **setup, **kw, top=20)
    _unpruned(monkeypatch)
    assert not planner.search(model, **setup, **kw, top=20).equals(broken)


# ---- published layouts ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def llama():
    full = planner.search("llama-3.1-405b", **LLAMA, top=300)
    pub = planner.search("llama-3.1-405b", **LLAMA, **{k: v for k, v in LLAMA_PUB.items() if k != "dp"}, top=None)
    return full, pub[pub.dp == LLAMA_PUB["dp"]].reset_index(drop=True)


def test_llama3_405b_layout_fits_and_its_mfu_is_near_the_reported(llama):
    full, pub = llama
    assert len(pub) > 0, "TP8 CP1 PP16 DP128 must fit"
    best_pub = pub.iloc[0]
    # Meta trained 8K without activation checkpointing (arXiv:2407.21783, §3.3.2): so does the kit's best variant,
    # with one layer per interleaved chunk (the first chunk only the embedding, the last only the head: v 8)
    assert best_pub.recompute == "none" and best_pub.schedule == "interleaved-1f1b" and best_pub.v == 8
    assert abs(best_pub.mfu / LLAMA_MFU - 1) < 0.20  # calibrated model (in-sample for this run)
    lay = planner.Layout(
        **{k: best_pub[k] for k in ("dp", "tp", "pp", "cp", "ep", "zero", "recompute")},
        micro_batch=int(best_pub.micro_batch),
        schedule=best_pub.schedule,
        v=int(best_pub.v),
    )
    peak = planner.evaluate("llama-3.1-405b", lay, **LLAMA, calibration=None)
    assert peak.mfu > LLAMA_MFU and peak.mfu > best_pub.mfu  # datasheet peaks: an upper bound
    # not met (stated): unconstrained, the calibrated model still prefers CP at 8K (TP 4 x CP 4, no
    # recomputation), by the bubble (test_best_layout_close_to_published...); the published degrees are the
    # 16th distinct layout (0.10 s per step behind the 10th, TP8 CP2 PP16 DP64, by the bubble)
    layouts = full.drop_duplicates(["dp", "tp", "pp", "cp", "ep"]).reset_index(drop=True)
    rank = planner.rank_of(layouts, **LLAMA_PUB)
    assert layouts.cp.iloc[0] > 1 and rank is not None and 10 <= rank < 20
    tenth = planner.evaluate("llama-3.1-405b", planner.Layout(**{k: layouts.iloc[9][k] for k in COLS}), **LLAMA)
    pub_plan = planner.evaluate("llama-3.1-405b", planner.Layout(**{k: best_pub[k] for k in COLS}), **LLAMA)
    cmp = planner.compare(tenth, pub_plan)
    assert cmp.attrs["decides"] == "bubble" and 0 < cmp.attrs["total"] < 0.03 * pub_plan.step_s


def test_chunks_per_rank_follow_llama3_split():
    """memory.max_chunks against a brute force: the most chunks v such that, dealing each rank's items (the
    embedding on the first rank, its layers, the head on the last) into v consecutive chunks, none is empty
    and every chunk but the embedding's and the head's holds a layer. 126 layers on 16 stages: v = 8."""
    import random

    def brute(n_layers, pp):
        sizes = memory.stage_layers(n_layers, pp)
        best = 0
        for v in range(1, n_layers + 3):
            ok = True
            for s, n in enumerate(sizes):
                items = ["emb"] * (s == 0 and pp > 1) + ["layer"] * n + ["head"] * (s == pp - 1 and pp > 1)
                if len(items) < v:  # v non-empty chunks of consecutive items
                    ok = False
                chunks = [items[i * len(items) // v : (i + 1) * len(items) // v] for i in range(v)] if ok else []
                ok = ok and all(c and ("layer" in c or c in (["emb"], ["head"])) for c in chunks)
            if ok:
                best = v
        return best

    rng = random.Random(0)
    cases = [(126, 16), (32, 4), (30, 16), (10, 4)] + [(rng.randint(2, 130), rng.randint(1, 20)) for _ in range(40)]
    for n_layers, pp in cases:
        if pp <= n_layers:
            assert memory.max_chunks(n_layers, pp) == brute(n_layers, pp), (n_layers, pp)
    assert memory.max_chunks(126, 16) == 8
    t = TrainConfig(pp=16, pp_schedule="interleaved-1f1b", virtual_stages=9, seq_len=8192, tp=8, sp=True)
    with pytest.raises(ValueError, match="virtual_stages"):
        memory.check(memory.preset("llama-3.1-405b"), t)


def test_llama_8k_falls_out_without_one_layer_per_chunk(llama):
    """With at most 4 chunks per rank (the rule pp x v <= layers, which forbids Llama 3's embedding-only first
    chunk) the published 8K layout pays twice the interleaved bubble and drops out of the 300 best rows."""
    full = planner.search("llama-3.1-405b", **LLAMA, v=(2, 4), top=300)
    layouts = full.drop_duplicates(["dp", "tp", "pp", "cp", "ep"]).reset_index(drop=True)
    assert planner.rank_of(layouts, **LLAMA_PUB) is None


@pytest.fixture(scope="module")
def dsv3():
    full = planner.search("deepseek-v3", **DSV3, top=40)
    pub = planner.search("deepseek-v3", **DSV3, **{k: v for k, v in DSV3_PUB.items() if k != "dp"}, top=None)
    return full, pub[pub.dp == DSV3_PUB["dp"]].reset_index(drop=True)


def test_deepseek_v3_layout_fits_and_compare_names_why_it_loses(dsv3):
    full, pub = dsv3
    assert len(pub) > 0
    best = pub.iloc[0]
    z1 = pub[pub.zero == 1]  # the published ZeRO-1 variant fits; ZeRO-2 frees memory for fewer recomputed layers
    assert best.schedule == "dualpipe" and best.recompute == "full" and len(z1) and z1.iloc[0].step_s >= best.step_s
    cfg = memory.preset("deepseek-v3")
    implied = flops.implied_mfu(cfg, DSV3_TOKENS, DSV3_GPU_HOURS, gpu="H800-SXM", seq_len=4096)
    assert 0.3 < implied < 0.45
    assert abs(best.mfu / implied - 1) < 0.40  # held out of the fit entirely (no reported MFU)
    cols = tuple(planner.Layout.__dataclass_fields__)  # recompute_layers too
    plan = {
        n: planner.evaluate(cfg, planner.Layout(**{k: row[k] for k in cols}), **DSV3)
        for n, row in (("best", full.iloc[0]), ("pub", best))
    }
    cmp = planner.compare(plan["best"], plan["pub"])
    # the planner's best wins mostly by not recomputing: the kit's memory model needs 3 of the 4 layers of
    # each stage recomputed for the published degrees (DeepSeek-V3 recomputes only norms and MLA
    # up-projections, §3.2.3)
    assert cmp.attrs["decides"] == "recompute" and cmp.attrs["total"] > 0
    assert cmp["b - a"].sum() == pytest.approx(cmp.attrs["total"], rel=1e-9)


def test_search_recomputes_the_fewest_layers_that_fit(dsv3, llama):
    """A row recomputing k layers per stage (``recompute_layers``, Megatron-LM's block method) is the fewest
    that fit: with k - 1 the same layout does not (DeepSeek-V3's published degrees: 3 of 4 layers per stage
    with ZeRO-2). Its recomputation is k / (layers of the heaviest stage) of full recomputation's: 1 / 8 for
    Llama 3 405B on 16 stages (7, 8 x 14, 7 layers)."""
    _, pub = dsv3
    part = pub[(pub.recompute == "full") & (pub.recompute_layers > 0)]
    assert len(part)
    cols = ("dp", "tp", "pp", "cp", "ep", "zero", "recompute", "micro_batch", "schedule", "v", "recompute_layers")
    for _, row in part.head(3).iterrows():
        lay = planner.Layout(**{k: row[k] for k in cols})
        assert planner.evaluate("deepseek-v3", lay, **DSV3).fits
        if lay.recompute_layers > 1:
            fewer = planner.Layout(**{**{k: row[k] for k in cols}, "recompute_layers": lay.recompute_layers - 1})
            assert not planner.evaluate("deepseek-v3", fewer, **DSV3).fits
    _, lpub = llama
    lay = dict(LLAMA_PUB, zero=1, recompute="full", schedule="interleaved-1f1b", v=4)
    one = planner.evaluate("llama-3.1-405b", **LLAMA, **lay, recompute_layers=1)
    every = planner.evaluate("llama-3.1-405b", **LLAMA, **lay)
    assert one.time["recompute"] == pytest.approx(every.time["recompute"] / 8, rel=1e-12)
    assert one.memory_bytes < lpub.iloc[0].memory_bytes and every.memory_bytes < one.memory_bytes


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
    monkeypatch.setattr(memory.stages, "stage_layers", lambda L, pp, split=None: (L // pp,) * pp)
    b = memory.estimate(cfg, TrainConfig(pp=16, dp=1, seq_len=8192), stage=1)
    assert not (b.layers == 8 and b.n_params_rank == pytest.approx(sum(per_layer[7:15])))


# ---- calibration on published runs (data/published_runs.yaml) --------------------------------
RUNS = planner.published_runs()
FIT_RUNS = planner.published_runs("fit")


def _megatron_eq3(B, s, L, h, V):
    return 96 * B * s * L * h**2 * (1 + s / (6 * h) + V / (16 * L * h))  # Narayanan et al. 2021, eq. 3


def _korthikanti_eq7(B, s, L, h, V):
    return 72 * B * L * s * h**2 * (1 + s / (6 * h) + V / (12 * h * L))  # Korthikanti et al. 2022, eq. 7


def test_published_runs_are_complete_and_transcribed_consistently():
    assert len(FIT_RUNS) >= 6 and {planner.generation(r["gpu"]) for r in FIT_RUNS} == {"ampere", "hopper"}
    for r in RUNS:
        lay, cfg = r["layout"], r["config"]
        assert lay.dp * lay.tp * lay.pp * lay.cp == r["gpus"] and "arXiv:" in r["source"]
        assert r["global_batch"] % (lay.dp * lay.micro_batch) == 0
        rep = r["reported"]
        B, s_, L, h, V = r["global_batch"], r["seq_len"], cfg.n_layers, cfg.hidden, cfg.vocab_size
        if r["counts"] == "megatron-eq3":  # the printed % of peak is the printed TFLOP/s over 312
            assert rep["tflops_per_gpu"] / 312 == pytest.approx(rep["peak_fraction"], abs=0.006)
        if r["counts"] == "korthikanti-eq7":  # the printed MFU is eq. 7 over the printed iteration time
            mfu = _korthikanti_eq7(B, s_, L, h, V) / (r["gpus"] * 312e12 * rep["step_s"])
            assert mfu == pytest.approx(rep["mfu"], abs=0.006), r["name"]
        if r["role"] == "fit":
            assert 0.2 < r["reported_mfu"] < 0.6  # this kit's model FLOPs over the reported step


def test_reported_step_uses_the_papers_flop_count():
    """A run counted with eq. 3 (recomputation included) implies a longer step than the same TFLOP/s
    counted as model FLOPs: about 4/3 x (the recomputed forward)."""
    r = next(r for r in FIT_RUNS if r["name"] == "megatron-1t")
    cfg = r["config"]
    F = _megatron_eq3(r["global_batch"], 2048, cfg.n_layers, cfg.hidden, cfg.vocab_size)
    assert r["reported_step_s"] == pytest.approx(F / (3072 * 163e12), rel=1e-12)
    model = flops.flops_per_token(cfg, 2048) * r["global_batch"] * 2048
    assert F / model == pytest.approx(4 / 3, rel=0.03)


@pytest.fixture(scope="module")
def fit():
    return planner.calibrate(n_boot=20)


def test_stored_calibration_is_the_fit(fit):
    stored, fresh = planner.fitted_calibration(), fit.calibration
    for k in planner.PARAMS:
        assert getattr(stored, k) == pytest.approx(getattr(fresh, k), rel=1e-4, abs=1e-4), k
    for k in planner.FITTED:  # each stored value lies in its bootstrap interval
        lo, hi = fit.intervals[k]
        assert lo - 1e-4 <= getattr(stored, k) <= hi + 1e-4, k


def test_fast_prediction_is_evaluate(fit):
    """calibrate's vectorised prediction equals evaluate's step for every run (one formula, assemble_step)."""
    pieces = planner.fitting.run_pieces(FIT_RUNS)
    pred = planner.fitting.predict_step_s(pieces, fit.calibration.as_tuple())
    for r, p in zip(FIT_RUNS, pred):
        if r.get("sequence_parallel", True):
            plan = planner.evaluate(r["config"], r["layout"], **r["setup"], calibration=fit.calibration)
            assert plan.step_s == pytest.approx(p, rel=1e-12), r["name"]


def test_heldout_runs_are_predicted_within_20_percent(fit):
    """Leave-one-out: each run predicted by a fit on the others, all 15 within 20 % (the worst: Megatron's
    18B, about -15 %, and Korthikanti's 22B, about +13 %; 22B was +28 % before the fixed time per layer)."""
    err = fit.table.set_index("run")["heldout_error"]
    assert err.abs().max() < 0.20, err
    uncal = []
    for r in FIT_RUNS:  # the uncalibrated model (datasheet peaks) on the same layouts: far off
        plan = planner.evaluate(r["config"], r["layout"], **r["setup"], calibration=None)
        uncal.append(plan.mfu / r["reported_mfu"] - 1)
    assert min(uncal) > 0.15 and sorted(uncal)[len(uncal) // 2] > 0.45 and err.abs().median() < 0.06


def test_heldout_check_fails_when_a_term_is_broken(monkeypatch):
    """The held-out check catches a model that forgets the recomputed forward (Megatron's runs recompute every
    layer, Korthikanti's only the attention core: one efficiency cannot serve both, Korthikanti's 22B then
    misses by about 24 %). It does not catch every broken term: backward charged as one forward, a forgotten
    bubble, DP traffic left out or TP charged on the network are absorbed by the other parameters in the fit
    (all held-out errors stay within 20 %; the ranking test below catches TP on the network)."""
    real = planner.model.assemble_step

    def recompute_forgotten(p, *a):
        t = real(p, *a)
        return {**t, "recompute": 0.0 * t["recompute"]}

    monkeypatch.setattr(planner.model, "assemble_step", recompute_forgotten)
    err = planner.calibrate().table.set_index("run")["heldout_error"]
    assert err.abs().max() >= 0.20


def test_heldout_check_fails_without_the_fixed_time_per_layer():
    """Held at 0, the fixed time per layer and micro-batch (layer_s) leaves small models too fast: Korthikanti's
    22B on one node (48 layers of width 6,144 split 8 ways) is then predicted about 28 % fast."""
    err = planner.calibrate(fixed={**planner.FIXED, "layer_s": 0.0}).table.set_index("run")["heldout_error"]
    assert err.abs().max() >= 0.20 and err["korthikanti-22b"] > 0.20


def test_hfu_over_mfu_is_the_recomputed_share():
    """HFU/MFU = 1 + recomputed forward / (3 x forward): 4/3 less the LM head for full recomputation
    (eq. 3 over eq. 7 is exactly 4/3 with the head); no recomputation: HFU = MFU."""
    r = next(r for r in FIT_RUNS if r["name"] == "megatron-1t")
    plan = planner.evaluate(r["config"], r["layout"], **r["setup"])
    assert plan.hfu / plan.mfu == pytest.approx(4 / 3, rel=0.025) and plan.hfu / plan.mfu < 4 / 3
    k = next(r for r in FIT_RUNS if r["name"] == "korthikanti-530b")
    sel = planner.evaluate(k["config"], k["layout"], **k["setup"])
    assert 1.0 < sel.hfu / sel.mfu < k["reported"]["hfu"] / k["reported"]["mfu"] + 0.01


@pytest.fixture(scope="module")
def ranked():
    """Two published runs, each searched with no constraint beyond GPUs, GPU type, batch and sequence."""
    out = {}
    for r in FIT_RUNS:
        if r["name"] in ("llama3-405b-128k", "korthikanti-175b"):
            out[r["name"]] = (r, planner.search(r["config"], **r["setup"], top=200))
    return out


def _distinct_rank(df, lay):
    d = df.drop_duplicates(["dp", "tp", "pp", "cp", "ep"]).reset_index(drop=True)
    return planner.rank_of(d, dp=lay.dp, tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep)


def test_published_layouts_in_the_top_10(ranked):
    """Llama 3 405B's long-context stage (TP8 CP16 PP16 DP8) and Korthikanti's 175B (TP8 PP8) among the
    10 best distinct (dp, tp, pp, cp, ep) layouts. Not met for Llama 3's 8K stages (test above)."""
    for name, (r, df) in ranked.items():
        rank = _distinct_rank(df, r["layout"])
        assert rank is not None and rank < 10, name


def test_tp_on_the_network_pushes_the_published_layout_out(monkeypatch, ranked):
    r, _ = ranked["korthikanti-175b"]
    real = planner.traffic.group_link

    def tp_on_network(ctx, stride, size):
        return (ctx.network, *ctx.net_ab) if stride == 1 and size > 1 else real(ctx, stride, size)

    monkeypatch.setattr(planner.traffic, "group_link", tp_on_network)
    rank = _distinct_rank(planner.search(r["config"], **r["setup"], top=200), r["layout"])
    assert rank is None or rank >= 10


def test_compare_splits_the_difference_by_component():
    a = planner.evaluate("llama-3-8b", **SMALL, dp=16, pp=4, zero=1, schedule="1f1b")
    b = planner.evaluate("llama-3-8b", **SMALL, dp=64, zero=1)
    cmp = planner.compare(a, b)
    assert cmp["b - a"].sum() == pytest.approx(b.step_s - a.step_s, rel=1e-9)
    assert cmp.loc["bubble", "a"] > 0 and cmp.loc["bubble", "b"] == 0
    want = max(cmp.index, key=lambda k: (b.time[k] - a.time[k]) * (1 if b.step_s > a.step_s else -1))
    assert cmp.attrs["decides"] == want


def test_calibration_inputs_are_checked():
    with pytest.raises(ValueError, match="eff_ampere"):
        planner.Calibration(eff_ampere=1.5, eff_hopper=0.8, attn_eff=1.0, overlap=0.0, elem_bytes=10.0)
    with pytest.raises(ValueError, match="V100"):
        planner.evaluate(
            "llama-3-8b", gpus=8, gpu="V100-SXM2-32GB", global_batch_tokens=64 * 4096, seq_len=4096, dp=8, dtype="fp16"
        )
    with pytest.raises(ValueError, match="calibration"):
        planner.search("llama-3-8b", **SMALL, calibration="best")
    with pytest.raises(ValueError, match="runs"):
        planner.calibrate(FIT_RUNS[:3], loo=False)


# ---- the target (3): the best layout close to the published one, or beaten by a cited term ----
TARGET3 = ("llama3-405b-8k-16384", "llama3-405b-128k", "korthikanti-175b", "korthikanti-530b")
COLS = tuple(planner.Layout.__dataclass_fields__)


def _best_and_published(r):
    """Plans of the unconstrained best layout and of the fastest fitting variant of the published degrees."""
    lay = r["layout"]
    best = planner.search(r["config"], **r["setup"], top=1).iloc[0]
    pub = planner.search(r["config"], **r["setup"], tp=lay.tp, pp=lay.pp, cp=lay.cp, ep=lay.ep, top=None)
    pub = pub[pub.dp == lay.dp].iloc[0]
    return tuple(
        planner.evaluate(r["config"], planner.Layout(**{k: row[k] for k in COLS}), **r["setup"]) for row in (best, pub)
    )


def _target3(r):
    """(best step / published step, deciding term, its source); met when the ratio is >= 0.9 or the
    term that decides has a published source."""
    best, pub = _best_and_published(r)
    cmp = planner.compare(best, pub)
    ratio = best.step_s / pub.step_s
    return ratio, cmp.attrs["decides"], cmp.attrs["source"], ratio >= 0.9 or "arXiv:" in (cmp.attrs["source"] or "")


def test_best_layout_close_to_published_or_wins_by_a_cited_term():
    """Korthikanti's 175B and 530B and Llama 3's 128K stage: the planner's best is within 10 % of the published
    step (128K: 1 %, TP8 CP16 PP8 DP16, by half the PP sends). Llama 3's 8K stage on 16,384 GPUs: within 6 %
    (it was 13 % before the fixed time per layer and the one-layer chunks): the best (TP4 CP4 PP8 DP128) wins by
    the bubble (CP 4 cuts each rank's micro-batch, PP 8 halves the stages), a cited term (TERM_SOURCES)."""
    runs = {r["name"]: r for r in FIT_RUNS if r["name"] in TARGET3}
    got = {name: _target3(r) for name, r in runs.items()}
    for name, (ratio, decides, source, met) in got.items():
        assert met, (name, ratio, decides, source)
    assert all(ratio >= 0.9 for ratio, *_ in got.values()), got
    assert got["llama3-405b-8k-16384"][1] == "bubble"


def test_target3_fails_when_an_uncited_term_decides(monkeypatch):
    """A made-up per-stage cost with no source (0.2 s per pipeline stage) makes deep pipelines lose by
    it: the check above then fails for Llama 3's 8K stage."""
    real = planner.model.assemble_step

    def with_fudge(p, *a):
        t = real(p, *a)
        t["stage overhead"] = 0.2 * p.get("stages", 1)
        return t

    real_pieces = planner.model.step_pieces

    def with_stages(ctx, lay):
        p = real_pieces(ctx, lay)
        return None if p is None else {**p, "stages": lay.pp}

    monkeypatch.setattr(planner.model, "step_pieces", with_stages)
    monkeypatch.setattr(planner.model, "assemble_step", with_fudge)
    r = next(r for r in FIT_RUNS if r["name"] == "llama3-405b-8k-16384")
    ratio, decides, source, met = _target3(r)
    assert decides == "stage overhead" and source is None and not met


def _sensitivity_vs_search(fit, intervals):
    """(rank from sensitivity(), rank from a full search with the moved calibration) per moved parameter."""
    r = next(r for r in FIT_RUNS if r["name"] == "llama3-405b-128k")
    sens = planner.sensitivity(planner.Fit(fit.calibration, fit.table, intervals, None), [r], top=100)
    assert set(sens.parameter) == {"eff_hopper", "overlap", "elem_bytes", "layer_s"}  # eff_ampere: not an H100 run
    out, ranks = [], {}
    for row in sens.itertuples():
        moved = planner.Calibration(
            **{**{k: getattr(fit.calibration, k) for k in planner.PARAMS}, row.parameter: row.value}
        )
        if moved not in ranks:  # one search per distinct calibration
            df = planner.search(r["config"], **r["setup"], calibration=moved, top=100)
            ranks[moved] = _distinct_rank(df, r["layout"])
        want = ranks[moved]
        got = None if row.rank is None or row.rank != row.rank else int(row.rank)  # None/NaN: not seen
        out.append((got, None if want is None else want + 1))
    return out


def test_sensitivity_ranks_equal_a_search_with_the_moved_parameter(fit):
    """sensitivity() re-times the fit's 100 best rows under each parameter moved to an end of its
    bootstrap interval; a full search with that calibration gives the same ranks."""
    pairs = _sensitivity_vs_search(fit, fit.intervals)
    assert all(got == want for got, want in pairs), pairs


def test_sensitivity_check_fails_for_moves_beyond_the_retimed_rows(fit):
    """Re-timing only the fit's best rows is exact for small moves, not for large ones: at the ends of
    each parameter's physical range (eff_hopper 0.3) layouts outside those rows move in, and the check
    above sees it."""
    at_fit = {k: (getattr(fit.calibration, k),) * 2 for k in planner.FITTED}
    pairs = _sensitivity_vs_search(fit, {**at_fit, "eff_hopper": planner.BOUNDS["eff_hopper"]})
    assert any(got != want for got, want in pairs), pairs


def test_goodput_is_mfu_times_effective_time():
    frac, source = planner.effective_training_time()
    assert frac == 0.90 and "arXiv:2407.21783" in source
    assert planner.goodput_mfu(0.41, frac) == pytest.approx(0.369)
    with pytest.raises(ValueError, match="effective_time"):
        planner.goodput_mfu(0.41, 1.5)


def test_cp_cost_is_what_keeps_llama_8k_out(monkeypatch):
    """Charging CP 30 x its modelled all-gather traffic brings Llama 3's 8K layout (TP8 CP1 PP16 DP128) into
    the top 10 distinct layouts (it is 16th at 1 x, test_llama3_405b_layout...): what keeps it out is how cheap
    the model finds CP (Llama 3's all-gather of GQA's few K/V heads) against the bubble it saves."""
    real = planner.model.step_pieces

    def cp_times_30(ctx, lay):
        p = real(ctx, lay)
        return None if p is None else {**p, "cp": 30 * p["cp"]}

    monkeypatch.setattr(planner.model, "step_pieces", cp_times_30)
    rank = _distinct_rank(planner.search("llama-3.1-405b", **LLAMA, top=400), planner.Layout(**LLAMA_PUB))
    assert rank is not None and rank < 10
