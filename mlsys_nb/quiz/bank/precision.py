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
from ._util import numeric_family, pick, picks

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


def _layout(rng) -> dict:
    e, m = pick(rng, [(4, 3), (5, 2), (3, 4), (5, 10), (8, 7), (6, 1)])
    return {"e": e, "m": m, "rule": pick(rng, list(RULES))}


def _made(p):
    """The format of the layout ``p`` (``precision.make_format``)."""
    return make_format("q", p["e"], p["m"], special=p["rule"])


numeric_family(
    family("precision.format_max", section=SEC_FORMATS, reference=REF_FP8),
    draw=_layout,
    calc=_made,
    key=lambda f: f.max,
    unit="ratio",
    fields=lambda p, result: {
        "bias": _made(p).bias,
        "rule_words": RULES[p["rule"]],
        "field": result.emax + result.bias,
        "top_mantissa": "1 + (2^m - 2)/2^m" if p["rule"] == "fn" else "1 + (2^m - 1)/2^m",
    },
    text=(
        "A float format has {e} exponent bits, {m} mantissa bits and bias 2^(e-1) - 1 = {bias}; {rule_words}. "
        "What is its largest finite value?"
    ),
    hints=[
        "Top normal exponent field: 2^e - 2 if all-ones is reserved, 2^e - 1 otherwise; subtract the bias.",
        "Mantissa: all ones (1 + (2^m - 1)/2^m), or one less when all-ones is NaN.",
    ],
    solution=[
        "Largest exponent: {result.emax} (field {field} minus bias {result.bias}).",
        "Largest mantissa {top_mantissa}; max = {result.max:g} (precision.make_format).",
    ],
    diagnostics=lambda p, f: [
        (2 ** (1 if p["rule"] == "fn" else -1), "check which bit patterns the special-value rule reserves")
    ],
)


def _named_format(rng) -> dict:
    name = pick(rng, ["fp32", "tf32", "bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
    return {"name": name, "m": format_info(name).mantissa_bits}


numeric_family(
    family("precision.rounding_error_bound", section=SEC_FORMATS, reference=REF_BF16),
    draw=_named_format,
    calc=lambda p: format_info(p["name"]).eps / 2,
    unit="ratio",
    fields=lambda p, result: {"exponent_bits": format_info(p["name"]).exponent_bits, "eps": format_info(p["name"]).eps},
    text=(
        "Round to nearest into {name} ({exponent_bits} exponent bits, {m} mantissa bits). What is the largest "
        "relative rounding error |cast(x) - x| / |x| over the normal range?"
    ),
    hints=["Within a binade the spacing is 2^-m times its lowest value.", "Rounding moves at most half a spacing."],
    solution=[
        "Spacing in [1, 2): eps = 2^-{m} = {eps:.4g}.",
        "Half of it, relative to the smallest value of the binade: {result:.4g} (precision.format_info).",
    ],
    diagnostics=[(2.0, "that is the spacing (eps); rounding to nearest moves at most half of it")],
)


def _loss_scale(g: float) -> float:
    """The smallest power of two S with S·g an fp16 normal (``precision.format_info('fp16').min_normal``)."""
    return 2.0 ** max(0, math.ceil(math.log2(format_info("fp16").min_normal / g)))


numeric_family(
    family("precision.loss_scale_for_gradient", difficulty=2, section=SEC_WRONG, reference=REF_MP),
    draw=lambda rng: picks(rng, g=[3e-7, 1e-6, 4e-6, 2e-8, 5e-9, 1.5e-5]),
    calc=lambda p: _loss_scale(p["g"]),
    unit="ratio",
    fields=lambda p, result: {
        "min_normal": format_info("fp16").min_normal,
        "min_scale": format_info("fp16").min_normal / p["g"],
    },
    text=(
        "A gradient entry of magnitude {g:g} is computed in fp16. What is the smallest power-of-two loss "
        "scale S that makes S times it an fp16 *normal* number (full 11-bit precision)?"
    ),
    hints=["fp16's smallest normal is 2^-14 ≈ 6.1e-5.", "S = 2^ceil(log2(2^-14 / g))."],
    solution=[
        "Need S·{g:g} ≥ 2^-14 = {min_normal:.4g}: S ≥ {min_scale:.4g}.",
        "The next power of two: S = {result:g} (precision.format_info('fp16').min_normal).",
    ],
    diagnostics=[(2.0**-10, "2^-24 is the smallest subnormal; subnormals keep fewer digits")],
)


def _overflows(rng) -> dict:
    init, interval, n = pick(rng, [2.0**16, 2.0**20, 2.0**24]), pick(rng, [2, 3, 5]), pick(rng, [10, 12, 16])
    return {"init": init, "interval": interval, "n": n, "bad": sorted(rng.sample(range(n), pick(rng, [2, 3, 4])))}


def _scale_after(p) -> float:
    """``precision.LossScaler``'s scale after the steps of ``p`` (overflows at ``p["bad"]``)."""
    s = LossScaler(init_scale=p["init"], growth_interval=p["interval"])
    for k in range(p["n"]):
        s.observe(k in p["bad"])
    return s.get_scale()


numeric_family(
    family("precision.dynamic_scale_after_steps", difficulty=2, section=SEC_MIXED, reference=REF_MP),
    draw=_overflows,
    calc=_scale_after,
    unit="ratio",
    fields=lambda p, result: {"n1": p["n"] - 1},
    text=(
        "A dynamic loss scaler starts at S = {init:g}, halves S (and skips the step) when a gradient is inf, "
        "and doubles S after {interval} consecutive good steps. Over {n} steps (0..{n1}) the gradients "
        "overflow at steps {bad}. What is S after step {n1}?"
    ),
    hints=["An overflow halves S and resets the count of good steps.", "Count good steps since the last reset."],
    solution=[
        (
            "Walk the steps: an overflow halves S and resets the counter; every run of {interval} good steps "
            "doubles S and resets it."
        ),
        "S = {result:g} (precision.LossScaler, equal to torch.amp.GradScaler's rule).",
    ],
)

STATE_PARTS = ("param", "grad", "master", "optimizer")


def _per_param(recipe: str) -> dict:
    """``memory.bytes_per_param`` of ``recipe`` with AdamW (no offload)."""
    return memory.bytes_per_param(recipe, "adamw", False, None)


def _state_total(recipe: str) -> float:
    return sum(_per_param(recipe)[k] for k in STATE_PARTS)


numeric_family(
    family("precision.state_bytes_saved", section=SEC_MIXED, reference=REF_DSV3),
    draw=lambda rng: dict(
        zip(
            ("a", "b"), pick(rng, [("bf16-mixed", "bf16-nomaster"), ("fp32", "bf16-mixed"), ("bf16-mixed", "fp8-dsv3")])
        )
    ),
    calc=lambda p: _state_total(p["b"]),
    unit="bytes",
    fields=lambda p, result: {
        "a_total": _state_total(p["a"]),
        "b_parts": ", ".join(f"{k} {_per_param(p['b'])[k]:g}" for k in STATE_PARTS),
    },
    text=(
        "Model states (weights, gradients, fp32 master copy, AdamW's two moments) per parameter: how many "
        "bytes does the recipe {b} use per parameter, against {a}'s {a_total:g}? (Give {b}'s bytes per "
        "parameter.)"
    ),
    hints=[
        "bf16-mixed: 2 (bf16 weights) + 2 (bf16 grads) + 4 (fp32 master) + 4 + 4 (fp32 moments).",
        "fp8-dsv3: fp8 weights, bf16 and fp32 gradients, fp32 master, bf16 moments.",
    ],
    solution=[
        "{b}: {b_parts}",
        "Total {result:g} bytes per parameter (memory.bytes_per_param), against {a_total:g} for {a}.",
    ],
)

numeric_family(
    family("precision.fp8_scale_from_amax", section=SEC_FP8, reference=REF_FP8),
    draw=lambda rng: picks(rng, fmt=["fp8_e4m3", "fp8_e5m2"], amax=[0.02, 0.7, 3.5, 12.0, 250.0, 1900.0]),
    calc=lambda p: float(amax_scale(p["amax"], p["fmt"])),
    unit="ratio",
    fields=lambda p, result: {"fmax": format_info(p["fmt"]).max},
    text=(
        "Per-tensor current scaling: a tensor's largest magnitude is {amax:g}. What scale s (x·s is cast) "
        "maps it onto the largest finite value of {fmt}?"
    ),
    hints=["e4m3's largest finite value is 448, e5m2's 57344.", "s = fmax / amax."],
    solution=["fmax({fmt}) = {fmax:g}.", "s = {fmax:g} / {amax:g} = {result:.6g}."],
    diagnostics=lambda p, s: [
        (p["amax"] ** 2 / format_info(p["fmt"]).max ** 2, "that is 1/s: the scale multiplies x before the cast")
    ],
)


def _cast_case(rng) -> dict:
    name = pick(rng, ["bf16", "fp16", "fp8_e4m3", "fp8_e5m2"])
    return {"name": name, "x": round(rng.uniform(1, 2) * 2.0 ** pick(rng, [-3, 0, 2, 5]), 6)}


def _cast(p) -> float:
    return float(round_to_format(p["x"], p["name"]))


def _spacing(p) -> float:
    """The spacing of ``p["name"]`` in the binade of ``p["x"]``."""
    return 2.0 ** (math.floor(math.log2(p["x"])) - format_info(p["name"]).mantissa_bits)


numeric_family(
    family("precision.cast_error", difficulty=2, section=SEC_FORMATS, reference=REF_BF16),
    draw=_cast_case,
    calc=lambda p: abs(_cast(p) - p["x"]),
    unit="ratio",
    tolerance=0.01,
    fields=lambda p, result: {
        "mantissa_bits": format_info(p["name"]).mantissa_bits,
        "spacing": _spacing(p),
        "cast": _cast(p),
    },
    text=("The value {x:g} is cast to {name} (round to nearest, ties to even). What is the absolute rounding error?"),
    hints=[
        "Find the binade [2^k, 2^(k+1)) of x; the spacing there is 2^(k-m).",
        "Round x to the nearest multiple of the spacing.",
    ],
    solution=[
        "{name} has {mantissa_bits} mantissa bits; spacing near {x:g}: {spacing:g}.",
        "cast({x:g}) = {cast:g}; error {result:.6g} (precision.round_to_format).",
    ],
)


_NAMED_BLOCKS = {v: k.upper() for k, v in BLOCK_FORMATS.items()}


BLOCK_CHOICES = [
    *BLOCK_FORMATS.values(),
    ("fp4_e2m1", 64, "e8m0"),
    ("fp8_e5m2", 32, "e8m0"),
    ("fp4_e2m1", 16, "bf16"),
    ("fp8_e4m3", 128, "fp32"),
]


def _block_case(rng) -> dict:
    elem, block, scale = pick(rng, BLOCK_CHOICES)
    rows, cols = pick(rng, [(4096, 4096), (1024, 4096), (8192, 1024), (512, 2048)])
    return {"elem": elem, "block": block, "scale": scale, "rows": rows, "cols": cols}


def _block_bits(p) -> float:
    return block_bits_per_element(p["elem"], p["block"], p["scale"])


def _block_words(p) -> str:
    named, f = _NAMED_BLOCKS.get((p["elem"], p["block"], p["scale"])), format_info(p["elem"])
    return (f" ({named})" if named else "") + (
        f": {p['elem']} elements ({f.exponent_bits} exponent, {f.mantissa_bits} mantissa bits and a sign), every "
        f"{p['block']} consecutive elements of a row sharing one {p['scale']} scale"
    )


numeric_family(
    family("precision.block_format_bytes", section=SEC_FORMATS, reference=REF_MX),
    draw=_block_case,
    calc=lambda p: p["rows"] * p["cols"] * _block_bits(p) / 8,
    unit="bytes",
    fields=lambda p, result: {
        "layout": _block_words(p),
        "elem_bits": format_info(p["elem"]).bits,
        "scale_bits": _block_bits(p) - format_info(p["elem"]).bits,
        "bits": _block_bits(p),
        "elements": p["rows"] * p["cols"],
    },
    text=(
        "A {rows}×{cols} weight matrix is stored in a block-scaled format{layout}. How many bytes does it "
        "take, scales included (no per-tensor scale)?"
    ),
    hints=[
        "Bits per element: the element's 1 + e + m, plus the scale's bits shared by the block.",
        "e8m0 and e4m3 scales are 8 bits, bf16 16, fp32 32.",
    ],
    solution=[
        ("{elem}: {elem_bits} bits; one {scale} scale per {block} elements adds {scale_bits:g} bits per element."),
        "{bits:g} bits × {elements} elements / 8 = {result:g} bytes (precision.block_bits_per_element).",
    ],
    diagnostics=lambda p, nbytes: [(format_info(p["elem"]).bits / _block_bits(p), "the block scales take bytes too")],
)


@family("precision.mxfp4_stored_value", difficulty=2, section=SEC_FORMATS, reference=REF_MX)
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
