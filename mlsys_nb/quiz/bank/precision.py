"""Families of the topic ``precision``: a format's range and rounding error from its bit layout, the loss scale a
gradient needs, the dynamic scaler's trajectory, model-state bytes per recipe, an FP8 scale from amax, the error
of a cast.

Answer keys: ``mlsys_nb.precision`` (``make_format``, ``format_info``, ``round_to_format``, ``LossScaler``,
``amax_scale``) and ``memory.bytes_per_param``, the functions notebook 22 runs.
"""

from __future__ import annotations

import math

from ... import memory
from ...precision import (
    BLOCK_FORMATS,
    LossScaler,
    amax_scale,
    block_bits_per_element,
    block_scale,
    format_info,
    make_format,
    round_to_format,
)
from ..core import family
from ._util import pick

SEC_FORMATS = "notebooks/22_number_formats_and_mixed_precision.ipynb, §1 A format is its bit layout"
SEC_WRONG = "notebooks/22_number_formats_and_mixed_precision.ipynb, §2 Where it goes wrong"
SEC_MIXED = "notebooks/22_number_formats_and_mixed_precision.ipynb, §3 Mixed-precision training that works"
SEC_FP8 = "notebooks/22_number_formats_and_mixed_precision.ipynb, §4 FP8, simulated honestly"
REF_FP8 = "docs/references.md#fp8 (Micikevicius et al. 2022, arXiv:2209.05433, §3)"
REF_MP = "docs/references.md#mixed-precision (Micikevicius et al. 2018, arXiv:1710.03740, §3.2)"
REF_BF16 = "docs/references.md#bf16 (Kalamkar et al. 2019, arXiv:1905.12322)"
REF_DSV3 = "docs/references.md#deepseek-v3 (arXiv:2412.19437, §3.3)"
REF_MX = "docs/references.md#ocp-mx (OCP Microscaling Formats (MX) Specification v1.0, 2023)"
RULES = {"ieee": "the all-ones exponent is inf/NaN (IEEE)", "fn": "no inf; only all-ones exponent and mantissa is NaN"}


@family("precision.format_max", "precision", section=SEC_FORMATS, reference=REF_FP8)
def _format_max(rng):
    e, m = pick(rng, [(4, 3), (5, 2), (3, 4), (5, 10), (8, 7), (6, 1)])
    rule = pick(rng, list(RULES))
    f = make_format("q", e, m, special=rule)
    return dict(
        text=f"A float format has {e} exponent bits, {m} mantissa bits and bias 2^(e-1) - 1 = {f.bias}; {RULES[rule]}. "
        "What is its largest finite value?",
        params={"e": e, "m": m, "rule": rule},
        answer=f.max,
        unit="ratio",
        hints=[
            "Top normal exponent field: 2^e - 2 if all-ones is reserved, 2^e - 1 otherwise; subtract the bias.",
            "Mantissa: all ones (1 + (2^m - 1)/2^m), or one less when all-ones is NaN.",
        ],
        solution=[
            f"Largest exponent: {f.emax} (field {f.emax + f.bias} minus bias {f.bias}).",
            f"Largest mantissa {'1 + (2^m - 2)/2^m' if rule == 'fn' else '1 + (2^m - 1)/2^m'}; max = {f.max:g} "
            "(precision.make_format).",
        ],
        diagnostics=[(2 ** (1 if rule == "fn" else -1), "check which bit patterns the special-value rule reserves")],
    )


@family("precision.rounding_error_bound", "precision", section=SEC_FORMATS, reference=REF_BF16)
def _rounding_error(rng):
    name = pick(rng, ["fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
    f = format_info(name)
    return dict(
        text=f"Round to nearest into {name} ({f.exponent_bits} exponent bits, {f.mantissa_bits} mantissa bits). What "
        "is the largest relative rounding error |cast(x) - x| / |x| over the normal range?",
        params={"name": name, "m": f.mantissa_bits},
        answer=f.eps / 2,
        unit="ratio",
        hints=["Within a binade the spacing is 2^-m times its lowest value.", "Rounding moves at most half a spacing."],
        solution=[
            f"Spacing in [1, 2): eps = 2^-{f.mantissa_bits} = {f.eps:.4g}.",
            f"Half of it, relative to the smallest value of the binade: {f.eps / 2:.4g} (precision.format_info).",
        ],
        diagnostics=[(2.0, "that is the spacing (eps); rounding to nearest moves at most half of it")],
    )


@family("precision.loss_scale_for_gradient", "precision", difficulty=2, section=SEC_WRONG, reference=REF_MP)
def _loss_scale(rng):
    g = pick(rng, [3e-7, 1e-6, 4e-6, 2e-8, 5e-9, 1.5e-5])
    fmin = format_info("fp16").min_normal
    scale = 2.0 ** max(0, math.ceil(math.log2(fmin / g)))
    return dict(
        text=f"A gradient entry of magnitude {g:g} is computed in fp16. What is the smallest power-of-two loss scale "
        "S that makes S times it an fp16 *normal* number (full 11-bit precision)?",
        params={"g": g},
        answer=scale,
        unit="ratio",
        hints=["fp16's smallest normal is 2^-14 ≈ 6.1e-5.", "S = 2^ceil(log2(2^-14 / g))."],
        solution=[
            f"Need S·{g:g} ≥ 2^-14 = {fmin:.4g}: S ≥ {fmin / g:.4g}.",
            f"The next power of two: S = {scale:g} (precision.format_info('fp16').min_normal).",
        ],
        diagnostics=[(2.0**-10, "2^-24 is the smallest subnormal; subnormals keep fewer digits")],
    )


@family("precision.dynamic_scale_after_steps", "precision", difficulty=2, section=SEC_MIXED, reference=REF_MP)
def _dynamic_scale(rng):
    init = pick(rng, [2.0**16, 2.0**20, 2.0**24])
    interval = pick(rng, [2, 3, 5])
    n = pick(rng, [10, 12, 16])
    bad = sorted(rng.sample(range(n), pick(rng, [2, 3, 4])))
    s = LossScaler(init_scale=init, growth_interval=interval)
    for k in range(n):
        s.observe(k in bad)
    return dict(
        text=f"A dynamic loss scaler starts at S = {init:g}, halves S (and skips the step) when a gradient is inf, "
        f"and doubles S after {interval} consecutive good steps. Over {n} steps (0..{n - 1}) the gradients overflow at "
        f"steps {bad}. What is S after step {n - 1}?",
        params={"init": init, "interval": interval, "n": n, "bad": bad},
        answer=s.get_scale(),
        unit="ratio",
        hints=["An overflow halves S and resets the count of good steps.", "Count good steps since the last reset."],
        solution=[
            "Walk the steps: an overflow halves S and resets the counter; every run of "
            f"{interval} good steps doubles S and resets it.",
            f"S = {s.get_scale():g} (precision.LossScaler, equal to torch.amp.GradScaler's rule).",
        ],
    )


@family("precision.state_bytes_saved", "precision", section=SEC_MIXED, reference=REF_DSV3)
def _state_bytes(rng):
    a, b = pick(rng, [("bf16-mixed", "bf16-nomaster"), ("fp32", "bf16-mixed"), ("bf16-mixed", "fp8-dsv3")])
    opt = "adamw"
    parts = ("param", "grad", "master", "optimizer")
    tot = {r: sum(memory.bytes_per_param(r, opt, False, None)[k] for k in parts) for r in (a, b)}
    return dict(
        text=f"Model states (weights, gradients, fp32 master copy, AdamW's two moments) per parameter: how many bytes "
        f"does the recipe {b} use per parameter, against {a}'s {tot[a]:g}? (Give {b}'s bytes per parameter.)",
        params={"a": a, "b": b},
        answer=tot[b],
        unit="bytes",
        hints=[
            "bf16-mixed: 2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 4 + 4 (fp32 moments).",
            "fp8-dsv3: fp8 weights, bf16 and fp32 gradients, fp32 master, bf16 moments.",
        ],
        solution=[
            f"{b}: " + ", ".join(f"{k} {memory.bytes_per_param(b, opt, False, None)[k]:g}" for k in parts),
            f"Total {tot[b]:g} bytes per parameter (memory.bytes_per_param), against {tot[a]:g} for {a}.",
        ],
    )


@family("precision.fp8_scale_from_amax", "precision", section=SEC_FP8, reference=REF_FP8)
def _fp8_scale(rng):
    fmt = pick(rng, ["fp8_e4m3", "fp8_e5m2"])
    amax = pick(rng, [0.02, 0.7, 3.5, 12.0, 250.0, 1900.0])
    s = float(amax_scale(amax, fmt))
    return dict(
        text=f"Per-tensor current scaling: a tensor's largest magnitude is {amax:g}. What scale s (x·s is cast) "
        f"maps it onto the largest finite value of {fmt}?",
        params={"fmt": fmt, "amax": amax},
        answer=s,
        unit="ratio",
        hints=["e4m3's largest finite value is 448, e5m2's 57344.", "s = fmax / amax."],
        solution=[f"fmax({fmt}) = {format_info(fmt).max:g}.", f"s = {format_info(fmt).max:g} / {amax:g} = {s:.6g}."],
        diagnostics=[(amax**2 / format_info(fmt).max ** 2, "that is 1/s: the scale multiplies x before the cast")],
    )


@family("precision.cast_error", "precision", difficulty=2, section=SEC_FORMATS, reference=REF_BF16)
def _cast_error(rng):
    name = pick(rng, ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
    x = round(rng.uniform(1, 2) * 2.0 ** pick(rng, [-3, 0, 2, 5]), 6)
    err = abs(float(round_to_format(x, name)) - x)
    return dict(
        text=f"The value {x:g} is cast to {name} (round to nearest, ties to even). What is the absolute rounding "
        "error?",
        params={"name": name, "x": x},
        answer=err,
        unit="ratio",
        tolerance=0.01,
        hints=[
            "Find the binade [2^k, 2^(k+1)) of x; the spacing there is 2^(k-m).",
            "Round x to the nearest multiple of the spacing.",
        ],
        solution=[
            f"{name} has {format_info(name).mantissa_bits} mantissa bits; spacing near {x:g}: "
            f"{2.0 ** (math.floor(math.log2(x)) - format_info(name).mantissa_bits):g}.",
            f"cast({x:g}) = {float(round_to_format(x, name)):g}; error {err:.6g} (precision.round_to_format).",
        ],
    )


_NAMED_BLOCKS = {v: k.upper() for k, v in BLOCK_FORMATS.items()}


@family("precision.block_format_bytes", "precision", section=SEC_FORMATS, reference=REF_MX)
def _block_bytes(rng):
    elem, block, scale = pick(
        rng,
        [
            *BLOCK_FORMATS.values(),
            ("fp4_e2m1", 64, "e8m0"),
            ("fp8_e5m2", 32, "e8m0"),
            ("fp4_e2m1", 16, "bf16"),
            ("fp8_e4m3", 128, "fp32"),
        ],
    )
    rows, cols = pick(rng, [(4096, 4096), (1024, 4096), (8192, 1024), (512, 2048)])
    f = format_info(elem)
    bits = block_bits_per_element(elem, block, scale)
    answer = rows * cols * bits / 8
    named = _NAMED_BLOCKS.get((elem, block, scale))
    return dict(
        text=f"A {rows}×{cols} weight matrix is stored in a block-scaled format"
        + (f" ({named})" if named else "")
        + f": {elem} elements ({f.exponent_bits} exponent, {f.mantissa_bits} mantissa bits and a sign), every "
        f"{block} consecutive elements of a row sharing one {scale} scale. How many bytes does it take, scales "
        "included (no per-tensor scale)?",
        params={"elem": elem, "block": block, "scale": scale, "rows": rows, "cols": cols},
        answer=answer,
        unit="bytes",
        hints=[
            "Bits per element: the element's 1 + e + m, plus the scale's bits shared by the block.",
            "e8m0 and e4m3 scales are 8 bits, bf16 16, fp32 32.",
        ],
        solution=[
            f"{elem}: {f.bits} bits; one {scale} scale per {block} elements adds {bits - f.bits:g} bits per element.",
            f"{bits:g} bits × {rows * cols} elements / 8 = {answer:g} bytes (precision.block_bits_per_element).",
        ],
        diagnostics=[(f.bits / bits, "the block scales take bytes too")],
    )


@family("precision.mxfp4_stored_value", "precision", difficulty=2, section=SEC_FORMATS, reference=REF_MX)
def _mxfp4_value(rng):
    while True:  # a draw that is not a tie (the hand route then needs no tie rule) and is not stored as 0
        amax = round(rng.uniform(0.1, 40.0), 3)
        x = round(rng.uniform(-1.0, 1.0) * amax, 3)
        s = block_scale(amax, "fp4_e2m1")
        grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
        d = sorted(abs(abs(x) / s - g) for g in grid)
        stored = float(round_to_format(x / s, "fp4_e2m1")) * s
        if d[1] - d[0] > 1e-9 and stored != 0:
            break
    return dict(
        text=f"In MXFP4 (OCP MX: 32 fp4 e2m1 elements share a power-of-two e8m0 scale 2^(floor(log2 amax) - 2)), a "
        f"block's largest magnitude is {amax:g}. One of its elements is {x:g}. What value does the block store for it "
        "(round to nearest; beyond ±6 the element saturates)?",
        params={"amax": amax, "x": x},
        answer=stored,
        unit="ratio",
        tolerance=1e-6,
        hints=[
            "fp4 e2m1 holds 0, 0.5, 1, 1.5, 2, 3, 4, 6 (and their negatives); its largest normal exponent is 2.",
            "Scale: the power of two with amax / scale in [4, 8); then round x / scale to the grid, times the scale.",
        ],
        solution=[
            f"floor(log2 {amax:g}) = {math.floor(math.log2(amax))}: scale 2^{math.floor(math.log2(amax)) - 2} = {s:g}.",
            f"x / scale = {x / s:.4g} rounds to {stored / s:g}; stored {stored:g} "
            "(precision.block_scale, round_to_format).",
        ],
    )
