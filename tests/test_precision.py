"""mlsys_nb.precision against independent references: torch.finfo, torch's real casts and fp8 bit patterns,
integer bit rounding (tf32), the OCP fp4 table, torch.amp.GradScaler, casts + an fp32 matmul. Each key check is
shown once to fail when its idea is broken (a wrong exponent bias, a scaler that never backs off, per-tensor
scales on activations with outliers)."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from mlsys_nb.config import PRECISIONS, ArgumentError, TrainConfig, tiny_config
from mlsys_nb.memory import estimate
from mlsys_nb.models import Transformer
from mlsys_nb.precision import (
    BLOCK_FORMATS,
    FORMATS,
    DelayedScaling,
    REAL_RECIPES,
    RECIPES,
    Fp8Blocks,
    LossScaler,
    RecipeAdam,
    activations_with_outliers,
    block_bits_per_element,
    block_quantize,
    block_scale,
    bytes_mismatch,
    calculator_bytes,
    cast,
    check_autocast_tracks_fp32,
    check_loss_scale_restores,
    flat_grads,
    format_info,
    fp8_scale_bytes,
    linear_output_dtypes,
    make_format,
    measure_optimizer_bytes,
    measure_recipe,
    round_to_format,
    quantize_tensor,
    quantize_tiles,
    relative_matmul_error,
    representable_values,
    scaler_trajectory,
    small_grad_error,
    stochastic_round,
    tensor_matmul,
    tile_matmul,
)

TORCH = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
TORCH_FP8 = {"fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}
OCP_FP4_VALUES = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # OCP MX v1.0, the FP4 E2M1 table


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


def _matches_finfo(f, dtype) -> bool:
    fi = torch.finfo(dtype)
    return (
        f.max == fi.max
        and f.min_normal == fi.smallest_normal
        and f.eps == fi.eps
        and f.exponent_bits + f.mantissa_bits + 1 == fi.bits
    )


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
def test_format_info_matches_torch_finfo(name):
    f = format_info(name)
    assert _matches_finfo(f, {**TORCH, **TORCH_FP8}[name])
    if name in TORCH:  # the smallest subnormal is a real value of the dtype and half of it rounds to 0
        sub = torch.tensor(f.min_subnormal, dtype=torch.float64)
        assert float(sub.to(TORCH[name])) == f.min_subnormal and float((sub / 2).to(TORCH[name])) == 0.0


def test_a_wrong_exponent_bias_fails_the_finfo_check():
    for name, dtype in {**TORCH, **TORCH_FP8}.items():
        f = format_info(name)
        wrong = make_format(name, f.exponent_bits, f.mantissa_bits, bias=f.bias + 1, special=f.special)
        assert not _matches_finfo(wrong, dtype), name
        wrong_rule = make_format(name, f.exponent_bits, f.mantissa_bits, special="ieee" if f.special == "fn" else "fn")
        assert not _matches_finfo(wrong_rule, dtype), name


def test_published_ranges_and_the_simulated_formats():
    assert (format_info("fp8_e4m3").max, format_info("fp8_e5m2").max, format_info("fp4_e2m1").max) == (448, 57344, 6)
    assert not format_info("fp8_e4m3").has_inf and format_info("fp8_e5m2").has_inf
    tf32 = format_info("tf32")
    assert (tf32.exponent_bits, tf32.mantissa_bits, tf32.eps, tf32.min_normal) == (8, 10, 2.0**-10, 2.0**-126)
    assert representable_values("fp4_e2m1").tolist() == OCP_FP4_VALUES
    assert [f.bits for f in FORMATS.values()] == [32, 19, 16, 16, 8, 8, 4]


@pytest.mark.parametrize("name", list(TORCH_FP8))
def test_every_fp8_value_from_the_bit_layout_is_a_value_of_torchs_dtype(name):
    every = torch.arange(256, dtype=torch.uint8).view(TORCH_FP8[name]).double()
    finite = every[torch.isfinite(every) & (every >= 0)].unique().sort().values
    assert torch.equal(representable_values(name), finite)


def _random_inputs(name, n=50_000, seed=0):
    """Random magnitudes over the format's whole range and beyond, every exact tie between neighbours,
    zeros, infinities and NaN."""
    f = format_info(name)
    g = torch.Generator().manual_seed(seed)
    lo, hi = math.floor(math.log2(f.min_subnormal)) - 2, math.ceil(math.log2(f.max)) + 2
    mags = torch.exp2(torch.empty(n, dtype=torch.float64).uniform_(max(lo, -140), min(hi, 127), generator=g))
    x = (mags * torch.randn(n, generator=g, dtype=torch.float64).sign()).float()
    v = representable_values(name).float()
    ties = (v[1:] + v[:-1]) / 2
    return torch.cat([x, ties, -ties, torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, f.max * 1.02])])


@pytest.mark.parametrize("name", ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
@pytest.mark.parametrize("seed", [0, 1])
def test_quantize_equals_torchs_real_cast_bit_for_bit(name, seed):
    if name == "bf16":  # 8 exponent bits: every tie would be 2^16 values; sample them instead
        g = torch.Generator().manual_seed(seed)
        bits = torch.randint(0, 2**16, (50_000,), generator=g, dtype=torch.int32) << 16
        x = torch.cat([_random_inputs("fp8_e5m2", seed=seed), (bits | 0x8000).view(torch.float32)])  # exact ties
    else:
        x = _random_inputs(name, seed=seed)
    real = x.to({**TORCH, **TORCH_FP8}[name]).float()
    sim = round_to_format(x, name).float()
    assert torch.equal(sim.isnan(), real.isnan())
    ok = ~real.isnan()
    assert torch.equal(sim[ok].view(torch.int32), real[ok].view(torch.int32))  # bit for bit, signed zeros too


def test_tf32_simulation_equals_integer_rounding_of_the_fp32_bits():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(100_000, generator=g) * torch.exp2(torch.randint(-60, 60, (100_000,), generator=g).float())
    b = x.view(torch.int32).to(torch.int64)
    rounded = (b + 0xFFF + ((b >> 13) & 1)) & ~0x1FFF  # round to nearest even at mantissa bit 13
    ref = rounded.to(torch.int32).view(torch.float32)
    assert torch.equal(cast(x, "tf32"), ref)


def test_fp4_simulation_is_the_nearest_value_of_the_ocp_table_ties_to_even():
    grid = torch.tensor(OCP_FP4_VALUES, dtype=torch.float64)
    g = torch.Generator().manual_seed(4)
    x = torch.cat([torch.empty(20_000, dtype=torch.float64).uniform_(-8, 8, generator=g), (grid[1:] + grid[:-1]) / 2])
    d = (x.abs()[:, None] - grid[None, :]).abs()
    best = d.min(1, keepdim=True).values
    cand = (d == best) & True
    even = torch.tensor([i % 2 == 0 for i in range(8)])  # codes 0..7: an even code has mantissa bit 0
    pick = torch.where((cand & even).any(1, keepdim=True), cand & even, cand).float().argmax(1)
    ref = torch.where(x.abs() > 6, torch.full_like(x, 6.0), grid[pick]) * x.sign()
    assert torch.equal(round_to_format(x, "fp4_e2m1"), ref)


def test_e4m3_saturates_and_e5m2_overflows_to_inf():
    big = torch.tensor([500.0, 1e6, math.inf])
    assert cast(big, "fp8_e4m3").tolist() == [448.0] * 3 == round_to_format(big, "fp8_e4m3").tolist()
    assert cast(big, "fp8_e5m2").tolist()[1:] == [math.inf] * 2 == round_to_format(big, "fp8_e5m2").tolist()[1:]


def _mx_reference(x, elem, block):
    """OCP MX v1.0 §6.3, one block at a time in Python floats: X = 2^(floor(log2 amax) - emax_elem)."""
    f = format_info(elem)
    out = []
    for row in x.double().reshape(-1, block).tolist():
        amax = max(abs(v) for v in row)
        s = 2.0 ** (math.floor(math.log2(amax)) - f.emax) if amax > 0 else 1.0
        vals = representable_values(elem).tolist()
        for v in row:
            a = min(abs(v) / s, f.max)
            best = min(vals, key=lambda w: (abs(w - a), vals.index(w) % 2))  # ties: the even code
            out.append(math.copysign(best * s, v))
    return torch.tensor(out).reshape(x.shape).float()


@pytest.mark.parametrize("name", ["mxfp4", "mxfp8"])
def test_mx_block_quantize_follows_the_spec(name):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4, 64, generator=g) * torch.exp2(torch.randint(-8, 8, (4, 1), generator=g).float())
    elem, block, _ = BLOCK_FORMATS[name]
    assert torch.equal(block_quantize(x, name), _mx_reference(x, elem, block))


def test_nvfp4_block_quantize_follows_its_two_level_scales():
    """Per tensor g = amax / (448 · 6); per block of 16 an e4m3 scale (torch's real cast) of amax_block / 6 / g;
    elements the nearest OCP fp4 value of x / (scale · g), ties to the even code, saturating at 6."""
    g = torch.Generator().manual_seed(10)
    x = torch.randn(4, 64, generator=g) * torch.exp2(
        torch.randint(-6, 6, (4, 4, 1), generator=g).float()
    ).repeat_interleave(16, 1).squeeze(-1)
    gs = float(x.abs().max()) / (448 * 6)
    out = []
    for row in x.double().reshape(-1, 16).tolist():
        amax = max(abs(v) for v in row)
        s = float(torch.tensor(amax / 6 / gs, dtype=torch.float32).to(torch.float8_e4m3fn).float()) * gs
        for v in row:
            a = min(abs(v) / s, 6.0)
            best = min(OCP_FP4_VALUES, key=lambda w: (abs(w - a), OCP_FP4_VALUES.index(w) % 2))
            out.append(math.copysign(best * s, v))
    assert torch.allclose(block_quantize(x, "nvfp4"), torch.tensor(out).reshape(x.shape).float(), rtol=1e-6, atol=0)


def test_ties_away_from_zero_would_fail_the_cast_comparison():
    """The random inputs include exact ties, so rounding half away from zero (not to even) is caught."""
    x = _random_inputs("fp16")
    f = format_info("fp16")
    a = x.double().abs()
    _, exp = torch.frexp(a)
    ulp = torch.ldexp(torch.ones_like(a), (exp - 1).clamp(min=f.emin) - f.mantissa_bits)
    away = torch.copysign(torch.floor(a / ulp + 0.5) * ulp, x.double()).float()
    ok = torch.isfinite(x) & (away.abs() <= f.max)
    assert not torch.equal(away[ok], x.to(torch.float16).float()[ok])
    assert torch.equal(round_to_format(x, "fp16").float()[ok], x.to(torch.float16).float()[ok])


def test_nvfp4_smaller_blocks_and_finer_scales_beat_mxfp4():
    g = torch.Generator().manual_seed(6)
    x = torch.randn(64, 256, generator=g) * torch.exp(torch.randn(64, 256, generator=g))
    err = {n: float((block_quantize(x, n) - x).norm() / x.norm()) for n in ("mxfp4", "nvfp4", "mxfp8")}
    assert err["mxfp8"] < err["nvfp4"] < err["mxfp4"], err
    with pytest.raises(ArgumentError, match="multiple of the block size 16"):
        block_quantize(torch.ones(2, 24), "nvfp4")


# ---- loss scaling -----------------------------------------------------------------------------------
SCALER_SETTINGS = [dict(), dict(init_scale=2.0**24, growth_interval=3), dict(init_scale=4.0, growth_interval=2)]


@pytest.mark.parametrize("kw", SCALER_SETTINGS)
def test_loss_scaler_equals_torch_gradscaler(kw):
    ref = scaler_trajectory(torch.amp.GradScaler("cpu", **kw), n_steps=30, seed=1)
    mine = scaler_trajectory(LossScaler(**kw), n_steps=30, seed=1)
    assert mine[0] == ref[0] and mine[1] == ref[1]
    assert torch.equal(mine[2], ref[2])
    assert any(ref[1]) and len(set(ref[0])) > 2  # the run does skip steps and move the scale


def test_a_scaler_that_never_backs_off_fails_the_comparison():
    kw = dict(init_scale=2.0**24, growth_interval=3)
    ref = scaler_trajectory(torch.amp.GradScaler("cpu", **kw), n_steps=30, seed=1)
    broken = scaler_trajectory(LossScaler(**kw, backoff_factor=1.0), n_steps=30, seed=1)
    assert broken[0] != ref[0] and broken[1] != ref[1] and all(broken[1])  # stuck at an overflowing scale


def test_scaler_rejects_bad_arguments():
    with pytest.raises(ArgumentError, match="backoff_factor"):
        LossScaler(backoff_factor=2.0)
    with pytest.raises(ArgumentError, match="growth_interval"):
        LossScaler(growth_interval=0)


# ---- fp8 scaling ------------------------------------------------------------------------------------
def test_scaled_mm_matmuls_equal_casts_and_an_fp32_matmul():
    g = torch.Generator().manual_seed(7)
    a, b = torch.randn(64, 256, generator=g) * 3, torch.randn(256, 128, generator=g) * 0.1
    qa, sa = quantize_tensor(a)
    qb, sb = quantize_tensor(b)
    ref = (qa.float() / sa) @ (qb.float() / sb)
    assert torch.allclose(tensor_matmul(a, b), ref, rtol=1e-5, atol=1e-5)
    qa, sa = quantize_tiles(a, (1, 128))
    qb, sb = quantize_tiles(b, (128, 128))
    ra = qa.float() / sa.repeat_interleave(128, 1)
    rb = qb.float() / sb.repeat_interleave(128, 0).repeat_interleave(128, 1)
    assert torch.allclose(tile_matmul(a, b), ra @ rb, rtol=1e-5, atol=1e-4)
    exact = a.double() @ b.double()
    assert relative_matmul_error(tensor_matmul(a, b), exact) < 0.05  # e4m3: about 2^-4 / sqrt(3) per element


def test_tile_scaling_beats_per_tensor_scaling_on_outliers_and_not_without():
    g = torch.Generator().manual_seed(8)
    w = torch.randn(512, 256, generator=g) * 0.05
    for seed in range(3):
        a = activations_with_outliers(256, 512, 1e-3, 1e3, seed=seed)
        exact = a.double() @ w.double()
        assert relative_matmul_error(tile_matmul(a, w), exact) < 0.85 * relative_matmul_error(
            tensor_matmul(a, w), exact
        )
    plain = activations_with_outliers(256, 512, 0.0, 1.0, seed=0)  # no outliers: the advantage vanishes
    exact = plain.double() @ w.double()
    e_tile, e_tensor = (
        relative_matmul_error(tile_matmul(plain, w), exact),
        relative_matmul_error(tensor_matmul(plain, w), exact),
    )
    assert e_tile > 0.9 * e_tensor


def test_delayed_scaling_uses_the_history_and_saturates_a_new_spike():
    ds = DelayedScaling(history=2)
    x = torch.ones(8)
    _, s0 = ds.quantize(x)  # first step: its own amax
    assert float(s0) == 448.0
    _, s1 = ds.quantize(x * 100)  # the spike is not in the history yet: it saturates
    assert float(s1) == 448.0
    q, s2 = ds.quantize(x)
    assert float(s2) == pytest.approx(4.48)  # now the spike's amax sets the scale
    ds.quantize(x)
    _, s4 = ds.quantize(x)
    assert float(s4) == pytest.approx(448.0)  # the spike left the 2-step history
    cur, _ = quantize_tensor(x * 100)
    assert cur.float().max() == 448.0


def test_fp8_arguments_are_checked():
    with pytest.raises(ArgumentError, match="fmt"):
        DelayedScaling(fmt="fp16")
    with pytest.raises(ArgumentError, match="history"):
        DelayedScaling(history=0)
    with pytest.raises(ArgumentError, match="name"):
        format_info("fp6")
    with pytest.raises(ArgumentError, match=r"x.shape\[1\] must be a multiple of tile\[1\]=128"):
        quantize_tiles(torch.ones(4, 100), (1, 128))


def test_stochastic_rounding_picks_a_neighbour_and_is_unbiased():
    grid = representable_values("fp8_e4m3")
    g = torch.Generator().manual_seed(9)
    x = torch.empty(20_000, dtype=torch.float64).uniform_(0.001, 400, generator=g)
    r = stochastic_round(x, "fp8_e4m3", generator=torch.Generator().manual_seed(1))
    i = torch.searchsorted(grid, x, right=True)
    assert bool(((r == grid[i - 1]) | (r == grid[i.clamp(max=len(grid) - 1)])).all())
    one = torch.full((200_000,), 1.0 + 2.0**-10, dtype=torch.float64)  # 1/8 of an e4m3 ulp above 1
    mean = float(stochastic_round(one, "fp8_e4m3", generator=torch.Generator().manual_seed(2)).mean())
    p = 1 / 8  # P(round up); the mean's standard error is 0.125 · sqrt(p(1-p)/n)
    assert abs(mean - (1 + 2.0**-10)) < 5 * 0.125 * math.sqrt(p * (1 - p) / one.numel())
    assert float(round_to_format(one, "fp8_e4m3").mean()) == 1.0  # round to nearest loses it every time


# ---- the memory calculator's recipes, measured where torch builds them -----------------------------------
RECIPE_CFG = tiny_config()


@pytest.fixture(scope="module")
def real_runs():
    """fp32 and bf16-mixed built from torch's parts (torch.optim.AdamW), one real step each, bytes measured."""
    return {p: measure_optimizer_bytes(RECIPE_CFG, p, seed=2) for p in REAL_RECIPES}


@pytest.mark.parametrize("precision", REAL_RECIPES)
def test_torch_allocates_the_calculators_bytes_per_parameter(real_runs, precision):
    m = real_runs[precision]
    assert bytes_mismatch(m, precision) == {}, bytes_mismatch(m, precision)
    assert m["n_params"] == estimate(RECIPE_CFG, TrainConfig(precision=precision)).n_params_total
    assert m["state_dtypes"] == {"step": "float32", "exp_avg": "float32", "exp_avg_sq": "float32"}
    assert m["step_counters"] == 4 * m["n_tensors"]  # one 0-d fp32 step per tensor, outside the per-param model
    assert m["moved"] > 0.5  # the step ran
    if precision == "bf16-mixed":  # the fp32 copies of the gradients the update read, alive during the step
        assert m["master_grads_at_step"] == 4 * m["n_params"] and m["master"] == 4 * m["n_params"]


def test_a_bf16_build_without_its_master_fails_the_bytes_comparison():
    broken = measure_optimizer_bytes(RECIPE_CFG, "bf16-mixed", master=False, seed=2)
    miss = bytes_mismatch(broken, "bf16-mixed")
    assert set(miss) == {"master", "optimizer", "total"}, miss  # torch's moments follow the bf16 weights
    assert broken["state_dtypes"]["exp_avg_sq"] == "bfloat16" and broken["total"] == 8 * broken["n_params"]


def test_an_optimizer_without_adams_second_moment_fails_the_bytes_comparison():
    broken = measure_optimizer_bytes(RECIPE_CFG, "fp32", optimizer="sgd-momentum", seed=2)
    assert set(bytes_mismatch(broken, "fp32")) == {"optimizer", "total"}
    assert bytes_mismatch(broken, "fp32", optimizer="sgd-momentum") == {}  # it is what the calculator says for SGD


def test_measure_optimizer_bytes_runs_only_what_a_cpu_builds_for_real():
    for precision in ("bf16-nomaster", "fp8-te", "fp8-dsv3"):
        with pytest.raises(ArgumentError, match="precision"):
            measure_optimizer_bytes(RECIPE_CFG, precision)
    with pytest.raises(ArgumentError, match="optimizer"):
        measure_optimizer_bytes(RECIPE_CFG, "fp32", optimizer="adafactor")


def test_recipe_storage_is_read_off_the_calculator():
    # the dtypes RecipeAdam holds add up to the calculator's bytes per parameter (no second table to drift)
    for precision, r in RECIPES.items():
        size = {name: getattr(torch, name).itemsize for name in ("float32", "bfloat16", "float8_e4m3fn")}
        total = size[r["weight"]] + size[r["grad"]] + 4 * r["accum"] + 4 * r["master"] + 2 * size[r["moments"]]
        assert total == calculator_bytes(1, precision)["total"], precision
    assert RECIPES["fp8-dsv3"] == dict(
        weight="float8_e4m3fn", grad="bfloat16", master=True, moments="bfloat16", accum=True
    )


# ---- notebook 22's checks on real runs, and the broken ideas that must fail them ------------------------
NB22_CFG = tiny_config(hidden=64, ffn_hidden=128, vocab_size=128, seq_len=32)


def _autocast_losses(base, seqs, enabled, dtype=torch.bfloat16):
    model = copy.deepcopy(base)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    with linear_output_dtypes(model) as dtypes:
        for x in seqs:
            opt.zero_grad()
            with torch.autocast("cpu", dtype=dtype, enabled=enabled):
                loss = model(x[:, :-1], targets=x[:, 1:])
            losses.append(float(loss.detach()))
            loss.backward()
            opt.step()
    return losses, dtypes


@pytest.fixture(scope="module")
def autocast_runs():
    torch.manual_seed(0)
    base = Transformer(NB22_CFG)
    g = torch.Generator().manual_seed(5)
    seqs = (torch.randint(0, 128, (12, 8, 1), generator=g) + torch.arange(NB22_CFG.seq_len + 1)) % 128
    return {k: _autocast_losses(base, seqs, enabled=k != "fp32") for k in ("fp32", "bf16")} | {
        "off": _autocast_losses(base, seqs, enabled=False)
    }


def test_the_autocast_check_passes_a_real_bf16_run(autocast_runs):
    (ref, ref_dtypes), (run, dtypes) = autocast_runs["fp32"], autocast_runs["bf16"]
    assert dtypes == {torch.bfloat16} and ref_dtypes == {torch.float32}
    gap = check_autocast_tracks_fp32(ref, run, dtypes, torch.bfloat16, fp32_dtypes=ref_dtypes)
    assert 1e-4 < gap < 0.05


def test_the_autocast_check_fails_when_autocast_is_switched_off(autocast_runs):
    (ref, ref_dtypes), (off, off_dtypes) = autocast_runs["fp32"], autocast_runs["off"]
    assert off == ref  # enabled=False repeats fp32 exactly: the old "gap < 0.05" alone passed it
    with pytest.raises(AssertionError, match="linear layer"):  # the dtypes it recorded give it away
        check_autocast_tracks_fp32(ref, off, off_dtypes, torch.bfloat16, fp32_dtypes=ref_dtypes)
    with pytest.raises(AssertionError, match="changed nothing"):  # and so does the gap's lower bound
        check_autocast_tracks_fp32(ref, off, {torch.bfloat16}, torch.bfloat16)


def test_the_loss_scale_check_runs_on_real_fp16_backwards_and_fails_when_the_scale_does_nothing():
    torch.manual_seed(0)
    base = Transformer(NB22_CFG)
    batch = torch.randint(0, 128, (16, NB22_CFG.seq_len + 1), generator=torch.Generator().manual_seed(0))
    g32 = flat_grads(base, batch)
    limit = format_info("fp16").min_normal
    half = copy.deepcopy(base).half()
    unscaled = small_grad_error(g32, flat_grads(half, batch, 1.0), limit)
    scaled = small_grad_error(g32, flat_grads(half, batch, 2.0**10), limit)
    assert check_loss_scale_restores(unscaled, scaled) > 3
    with pytest.raises(AssertionError, match="did not restore"):  # a "scale" that does nothing: S = 1 twice
        check_loss_scale_restores(unscaled, small_grad_error(g32, flat_grads(half, batch, 1.0), limit))
    with pytest.raises(AssertionError):  # a backward that never ran in fp16 (the old check's cast of fp32): 0 / 0
        check_loss_scale_restores(small_grad_error(g32, g32, limit), small_grad_error(g32, g32, limit))


@pytest.fixture(scope="module")
def recipe_runs():
    """Each recipe trained 3 steps of 2 micro-batches on the tiny transformer, bytes measured at the last step."""
    return {p: measure_recipe(RECIPE_CFG, p, steps=3, micro_batches=2, seed=3) for p in PRECISIONS}


def _model_bytes(precision):
    """The calculator's params + grads + optimizer + master bytes (memory.estimate) for RECIPE_CFG."""
    b = estimate(RECIPE_CFG, TrainConfig(precision=precision, seq_len=RECIPE_CFG.seq_len))
    return dict(params=b.params, grads=b.grads, optimizer=b.optimizer, master=b.master)


@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_recipe_adam_holds_the_calculators_bytes_and_trains(recipe_runs, precision):
    # a consistency check (RecipeAdam's dtypes come from the calculator): it catches an extra or missing copy in
    # RecipeAdam, and shows each recipe trains with that storage
    run = recipe_runs[precision]
    held, model = run["held"], _model_bytes(precision)
    shapes = [tuple(p.shape) for p in Transformer(RECIPE_CFG).parameters()]
    scales = fp8_scale_bytes(shapes) if precision == "fp8-dsv3" else 0  # the 1 B/param leaves the scales out
    assert held["scales"] == scales
    assert held["params"] == model["params"] + scales
    assert (held["grads"], held["optimizer"], held["master"]) == (model["grads"], model["optimizer"], model["master"])
    assert run["n_params"] == estimate(RECIPE_CFG, TrainConfig(precision=precision)).n_params_total
    assert run["losses"][-1] < run["losses"][0] - 0.05, f"{precision} did not train: {run['losses']}"


def test_a_recipe_that_forgets_the_master_copy_fails_the_bytes_check():
    broken = measure_recipe(RECIPE_CFG, "bf16-mixed", steps=1, micro_batches=1, master=False)
    assert broken["held"]["master"] == 0 and broken["held"]["total"] != sum(_model_bytes("bf16-mixed").values())


def test_fp32_recipe_steps_equal_torch_adamw():
    torch.manual_seed(0)
    base = Transformer(RECIPE_CFG)
    ref = copy.deepcopy(base)
    opt = torch.optim.AdamW(ref.parameters(), lr=3e-3, weight_decay=0.1)
    mine = RecipeAdam(copy.deepcopy(base), "fp32", lr=3e-3, weight_decay=0.1)
    g = torch.Generator().manual_seed(4)
    for _ in range(3):
        x = torch.randint(0, RECIPE_CFG.vocab_size, (4, RECIPE_CFG.seq_len + 1), generator=g)
        opt.zero_grad()
        ref(x[:, :-1], x[:, 1:]).backward()
        opt.step()
        mine.loss(x[:, :-1], x[:, 1:])
        mine.step()
    for n, p in ref.named_parameters():
        assert torch.allclose(p.detach(), mine.weights[n], rtol=0, atol=1e-6), n


def test_bf16_without_master_loses_updates_below_half_an_ulp():
    torch.manual_seed(0)
    base = Transformer(RECIPE_CFG)
    x = (torch.arange(4)[:, None] + torch.arange(RECIPE_CFG.seq_len + 1)) % RECIPE_CFG.vocab_size
    moved = {}
    for p in ("bf16-nomaster", "bf16-mixed"):
        opt = RecipeAdam(copy.deepcopy(base), p, lr=1e-6)
        before = {n: w.detach().float().clone() for n, w in opt.weights.items()}
        for _ in range(2):
            opt.loss(x[:, :-1], x[:, 1:])
            opt.step()
        after = opt.master if p == "bf16-mixed" else opt.weights
        moved[p] = sum(int((after[n].float() != before[n]).sum()) for n in before) / opt.n_params()
    assert moved["bf16-nomaster"] < 0.1 and moved["bf16-mixed"] > 0.99, moved


def test_fp8_blocks_round_trip_within_e4m3_precision_and_count_their_scales():
    g = torch.Generator().manual_seed(5)
    w = torch.randn(200, 300, generator=g) * torch.exp(torch.randn(200, 1, generator=g))
    b = Fp8Blocks(w)
    assert b.codes.dtype == torch.float8_e4m3fn and b.scales.shape == (2, 3)
    back = b.dequantize(torch.float32)
    rel = ((back - w).abs() / w.abs())[w.abs() > w.abs().max() * 2.0**-6]  # e4m3 normals within each block
    assert float(rel.max()) <= format_info("fp8_e4m3").eps / 2 + 1e-6
    assert fp8_scale_bytes([(200, 300), (64,)]) == 4 * 6 + 4 == b.scales.untyped_storage().nbytes() + 4


def test_the_recipe_takes_over_the_weights_so_the_module_holds_nothing_uncounted():
    model = Transformer(RECIPE_CFG)
    opt = RecipeAdam(model, "bf16-mixed")
    assert all(p.is_meta for p in model.parameters())  # no fp32 copy left behind outside held_bytes
    assert opt.held_bytes()["params"] == 2 * opt.n_params() == 2 * model.num_parameters()


def test_recipe_arguments_are_checked():
    with pytest.raises(ArgumentError, match="precision"):
        RecipeAdam(Transformer(RECIPE_CFG), "fp16")
    with pytest.raises(ArgumentError, match="lr"):
        RecipeAdam(Transformer(RECIPE_CFG), "fp32", lr=-1.0)
    with pytest.raises(ArgumentError, match="step"):
        RecipeAdam(Transformer(RECIPE_CFG), "fp32").step()


def test_block_format_bits_and_mx_scale_follow_the_published_layouts():
    # NVIDIA's NVFP4: 4-bit elements + an 8-bit e4m3 scale per 16 = 4.5 bits; OCP MX: + an 8-bit scale per 32
    assert block_bits_per_element("fp4_e2m1", 16, "fp8_e4m3") == 4.5
    assert block_bits_per_element("fp4_e2m1", 32, "e8m0") == 4.25
    assert block_bits_per_element("fp8_e4m3", 32, "e8m0") == 8.25
    g = torch.Generator().manual_seed(11)
    for amax in torch.exp2(torch.empty(200).uniform_(-20, 20, generator=g)).tolist():
        s = block_scale(amax, "fp4_e2m1")
        assert math.log2(s).is_integer() and 4 <= amax / s < 8  # amax lands in e2m1's top binade [4, 8)
        block = torch.full((1, 32), amax / 3)
        block[0, 0] = amax
        assert float(block_quantize(block, "mxfp4")[0, 0]) == float(round_to_format(amax / s, "fp4_e2m1")) * s
    with pytest.raises(ArgumentError, match="amax"):
        block_scale(0.0)
    with pytest.raises(ArgumentError, match="scale"):
        block_bits_per_element("fp4_e2m1", 32, "e5m2")
