"""Second routes of the topic ``precision``: torch's real casts and ``torch.finfo``, bit patterns enumerated by
hand, the scaler's rule walked by hand and the recipes' byte table from the papers, without
``mlsys_nb.precision`` or ``memory.bytes_per_param``."""

from __future__ import annotations

from .registry import register_route

_DTYPES = {
    "fp32": "float32",
    "bf16": "bfloat16",
    "fp16": "float16",
    "fp8_e4m3": "float8_e4m3fn",
    "fp8_e5m2": "float8_e5m2",
}
_MANTISSA = {"fp32": 23, "tf32": 10, "bf16": 7, "fp16": 10, "fp8_e4m3": 3, "fp8_e5m2": 2}


@register_route("precision.format_max")
def _(p):
    e, m, bias = p["e"], p["m"], 2 ** (p["e"] - 1) - 1
    best = 0.0
    for E in range(1, 2**e):  # every normal bit pattern, keeping those the rule leaves finite
        for M in range(2**m):
            if p["rule"] == "ieee" and E == 2**e - 1:
                continue
            if p["rule"] == "fn" and E == 2**e - 1 and M == 2**m - 1:
                continue
            best = max(best, 2.0 ** (E - bias) * (1 + M / 2**m))
    return best


@register_route("precision.rounding_error_bound")
def _(p):
    import torch

    name = p["name"]
    if name in _DTYPES:
        return torch.finfo(getattr(torch, _DTYPES[name])).eps / 2
    return 2.0 ** -(_MANTISSA[name] + 1)


@register_route("precision.loss_scale_for_gradient")
def _(p):
    import torch

    tiny = torch.finfo(torch.float16).smallest_normal
    s = 1.0
    while p["g"] * s < tiny:
        s *= 2
    return s


@register_route("precision.dynamic_scale_after_steps")
def _(p):
    s, good = p["init"], 0
    for k in range(p["n"]):
        if k in p["bad"]:
            s, good = s / 2, 0
        else:
            good += 1
            if good == p["interval"]:
                s, good = s * 2, 0
    return s


# bytes per parameter: weights, gradients, fp32 master, AdamW's two moments (Micikevicius et al. 2018;
# DeepSeek-V3 §3.3: fp8 weights, bf16 + fp32 gradients, fp32 master, bf16 moments)
_RECIPE_BYTES = {
    "fp32": 4 + 4 + 0 + 2 * 4,
    "bf16-mixed": 2 + 2 + 4 + 2 * 4,
    "bf16-nomaster": 2 + 2 + 0 + 2 * 4,
    "fp8-dsv3": 1 + (2 + 4) + 4 + 2 * 2,
}


@register_route("precision.state_bytes_saved")
def _(p):
    return _RECIPE_BYTES[p["b"]]


@register_route("precision.fp8_scale_from_amax")
def _(p):
    import torch

    return torch.finfo(getattr(torch, _DTYPES[p["fmt"]])).max / p["amax"]


@register_route("precision.cast_error")
def _(p):
    import torch

    x = torch.tensor(p["x"], dtype=torch.float64)
    return abs(float(x.float().to(getattr(torch, _DTYPES[p["name"]])).double()) - p["x"])


# block formats by hand: element bits 1 + e + m, the scale's bits (OCP MX v1.0; NVIDIA's NVFP4 takes an e4m3 scale)
_ELEMENT_BITS = {"fp4_e2m1": 1 + 2 + 1, "fp8_e4m3": 1 + 4 + 3, "fp8_e5m2": 1 + 5 + 2}
_SCALE_BITS = {"e8m0": 8, "fp8_e4m3": 8, "bf16": 16, "fp32": 32}


@register_route("precision.block_format_bytes")
def _(p):
    n = p["rows"] * p["cols"]
    blocks = p["rows"] * (p["cols"] // p["block"])
    return (n * _ELEMENT_BITS[p["elem"]] + blocks * _SCALE_BITS[p["scale"]]) / 8


@register_route("precision.mxfp4_stored_value")
def _(p):
    s = 1.0
    while p["amax"] / s >= 8:  # the power of two that puts amax in [4, 8): fp4's top binade
        s *= 2
    while p["amax"] / s < 4:
        s /= 2
    grid = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]  # every non-negative e2m1 value (OCP MX v1.0 table)
    v = min(grid, key=lambda g: abs(abs(p["x"]) / s - g))
    return (v if p["x"] >= 0 else -v) * s
