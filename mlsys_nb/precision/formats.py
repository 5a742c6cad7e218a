"""Floating-point formats from their bit layout, and rounding to them (real casts and a simulation).

A binary float with ``e`` exponent bits, ``m`` mantissa bits and bias ``b`` stores
``(-1)^s · 2^(E - b) · (1 + M / 2^m)`` for a stored exponent ``E`` in ``[1, top]`` (normal numbers) and
``(-1)^s · 2^(1 - b) · (M / 2^m)`` for ``E = 0`` (subnormals). What the all-ones exponent means is the
format's *special-value rule*:

- ``"ieee"`` (fp32, tf32, bf16, fp16, fp8 e5m2): all-ones exponent is inf/NaN, so the top normal
  exponent is ``2^e - 2``;
- ``"fn"`` (fp8 e4m3, OCP / torch ``float8_e4m3fn``): no infinities; only all-ones exponent with all-ones
  mantissa is NaN, so the top exponent is ``2^e - 1`` and its largest mantissa is ``2^m - 2``;
- ``"none"`` (fp4 e2m1, OCP MX): every bit pattern is a number: no inf, no NaN.

Everything in ``FormatInfo`` is derived from ``(e, m, b, rule)`` by one formula each (``largest``,
``min_normal``, ``min_subnormal``, ``machine_eps``) and checked in ``tests/test_precision.py`` against
``torch.finfo`` and against every value of torch's real fp8 dtypes.

``round_to_format(x, name)`` rounds to the format's grid (round to nearest, ties to even) in float64 and handles
overflow as the real cast does: inf for the IEEE rule, saturation to ``±max`` for e4m3 (torch's CPU cast
saturates, unlike the NaN-on-overflow many texts state) and for fp4. It equals torch's casts bit for bit
for bf16, fp16 and both fp8 formats (tested on random inputs); tf32 and fp4 have no CPU cast, so for them
this simulation is the cast (labelled "simulated"). ``cast(x, name)`` uses torch's real cast where there is
one and the simulation otherwise.

Block formats (OCP Microscaling v1.0, 2023; NVIDIA's NVFP4), simulated: ``block_quantize(x, "mxfp8" |
"mxfp4" | "nvfp4")``. MX: blocks of 32 along the last dimension share an e8m0 (power-of-two) scale
``2^(floor(log2(amax)) - emax_elem)``; NVFP4: blocks of 16 share an e4m3 scale ``amax / 6`` under a
per-tensor fp32 scale that keeps the block scales inside e4m3's range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ArgumentError, check_choice, check_int, check_number

SPECIAL_RULES = ("ieee", "fn", "none")


@dataclass(frozen=True)
class FormatInfo:
    """A float format's layout and the numbers derived from it (all floats, unitless values).

    ``max``: largest finite value; ``min_normal``: smallest positive normal; ``min_subnormal``: smallest
    positive value; ``eps``: gap between 1 and the next value (``2^-m``); ``has_inf``: whether overflow
    can produce inf; ``torch_dtype``: the name of torch's dtype with this layout (``None``: simulated only)."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    bias: int
    special: str
    max: float
    min_normal: float
    min_subnormal: float
    eps: float
    has_inf: bool
    torch_dtype: str | None

    @property
    def bits(self) -> int:
        """Bits per value: sign + exponent + mantissa."""
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def emax(self) -> int:
        """Unbiased exponent of the largest normal binade."""
        return top_exponent(self.exponent_bits, self.special) - self.bias

    @property
    def emin(self) -> int:
        """Unbiased exponent of the smallest normal binade (``1 - bias``); subnormals share its spacing."""
        return 1 - self.bias


def top_exponent(exponent_bits: int, special: str) -> int:
    """Largest stored exponent field that holds finite numbers: ``2^e - 2`` under the IEEE rule (all-ones
    means inf/NaN), ``2^e - 1`` under the ``fn`` and ``none`` rules."""
    return (1 << exponent_bits) - (2 if special == "ieee" else 1)


def largest(exponent_bits: int, mantissa_bits: int, bias: int, special: str) -> float:
    """Largest finite value: ``2^(top - bias) · (1 + M_max / 2^m)`` with ``M_max = 2^m - 1``, except under the
    ``fn`` rule where the all-ones pattern is NaN, so ``M_max = 2^m - 2``."""
    m_max = (1 << mantissa_bits) - (2 if special == "fn" else 1)
    return math.ldexp(1 + m_max / (1 << mantissa_bits), top_exponent(exponent_bits, special) - bias)


def min_normal(bias: int) -> float:
    """Smallest positive normal value ``2^(1 - bias)``."""
    return math.ldexp(1.0, 1 - bias)


def min_subnormal(mantissa_bits: int, bias: int) -> float:
    """Smallest positive (subnormal) value ``2^(1 - bias - m)``."""
    return math.ldexp(1.0, 1 - bias - mantissa_bits)


def machine_eps(mantissa_bits: int) -> float:
    """Gap between 1 and the next representable value, ``2^-m`` (twice the largest relative rounding error)."""
    return math.ldexp(1.0, -mantissa_bits)


def make_format(
    name: str, exponent_bits: int, mantissa_bits: int, bias: int | None = None, special: str = "ieee", torch_dtype=None
) -> FormatInfo:
    """A ``FormatInfo`` from a bit layout; ``bias=None`` takes the standard ``2^(e-1) - 1``."""
    check_int("exponent_bits", exponent_bits, 1, 11)
    check_int("mantissa_bits", mantissa_bits, 0, 52)
    check_choice("special", special, SPECIAL_RULES)
    if special == "fn":
        check_int("mantissa_bits", mantissa_bits, 1, 52)  # the fn rule's NaN takes the all-ones mantissa
    b = (1 << (exponent_bits - 1)) - 1 if bias is None else check_int("bias", bias, -1000, 1000)
    return FormatInfo(
        name=name,
        exponent_bits=exponent_bits,
        mantissa_bits=mantissa_bits,
        bias=b,
        special=special,
        max=largest(exponent_bits, mantissa_bits, b, special),
        min_normal=min_normal(b),
        min_subnormal=min_subnormal(mantissa_bits, b),
        eps=machine_eps(mantissa_bits),
        has_inf=special == "ieee",
        torch_dtype=torch_dtype,
    )


FORMATS = {
    f.name: f
    for f in (
        make_format("fp32", 8, 23, torch_dtype="float32"),
        make_format("tf32", 8, 10),  # a tensor-core matmul mode of fp32 tensors: no dtype
        make_format("bf16", 8, 7, torch_dtype="bfloat16"),
        make_format("fp16", 5, 10, torch_dtype="float16"),
        make_format("fp8_e4m3", 4, 3, special="fn", torch_dtype="float8_e4m3fn"),
        make_format("fp8_e5m2", 5, 2, torch_dtype="float8_e5m2"),
        make_format("fp4_e2m1", 2, 1, special="none"),  # torch has the dtype but no CPU cast: simulated
    )
}


def format_info(name) -> FormatInfo:
    """The layout and derived range of format ``name`` (one of ``FORMATS``), or ``name`` itself when it is
    already a ``FormatInfo`` (e.g. one built with ``make_format``)."""
    if isinstance(name, FormatInfo):
        return name
    return FORMATS[check_choice("name", name, FORMATS)]


def round_to_format(x, name):
    """``x`` (a tensor or number) rounded to format ``name``'s grid, returned as a float64 tensor.

    Round to nearest, ties to even, gradual underflow through the subnormals; overflow gives ``±inf`` under
    the IEEE rule and saturates to ``±max`` under the ``fn`` and ``none`` rules (as torch's e4m3 cast does);
    NaN stays NaN. A simulation: equal to torch's real casts where they exist (tests/test_precision.py)."""
    import torch

    f = format_info(name)
    x = torch.as_tensor(x).to(torch.float64)
    a = x.abs()
    _, exp = torch.frexp(a)  # a = mant · 2^exp, mant in [0.5, 1): floor(log2 a) = exp - 1
    e = torch.clamp(exp - 1, min=f.emin)  # subnormals share the spacing of the lowest normal binade
    ulp = torch.ldexp(torch.ones_like(a), (e - f.mantissa_bits).to(torch.int32))
    q = torch.round(a / ulp) * ulp  # torch.round: half to even; a / ulp is exact (power-of-two scaling)
    big = q > f.max
    q = torch.where(big, torch.tensor(math.inf if f.has_inf else f.max, dtype=torch.float64), q)
    q = torch.where(torch.isinf(a) & ~torch.tensor(f.has_inf), torch.tensor(f.max, dtype=torch.float64), q)
    q = torch.where(torch.isnan(a), a, q)
    return torch.copysign(q, x)


def stochastic_round(x, name, generator=None):
    """``x`` rounded to format ``name``'s grid **stochastically** (float64 tensor): to the upper neighbour with
    probability ``(x - lower) / (upper - lower)``, else to the lower, so the expected result is ``x`` (an
    update below half an ulp survives on average). Overflow as in ``round_to_format``. ``generator``: a
    ``torch.Generator`` for reproducible draws."""
    import torch

    f = format_info(name)
    x = torch.as_tensor(x).to(torch.float64)
    a = x.abs()
    _, exp = torch.frexp(a)
    ulp = torch.ldexp(torch.ones_like(a), (torch.clamp(exp - 1, min=f.emin) - f.mantissa_bits).to(torch.int32))
    low = torch.floor(a / ulp)
    up = torch.rand(a.shape, generator=generator, dtype=torch.float64) < (a / ulp - low)
    q = (low + up.to(torch.float64)) * ulp
    q = torch.where(q > f.max, torch.tensor(math.inf if f.has_inf else f.max, dtype=torch.float64), q)
    q = torch.where(torch.isinf(a) | torch.isnan(a), round_to_format(a, f), q)
    return torch.copysign(q, x)


def cast(x, name):
    """``x`` rounded to format ``name`` and returned as float32 (float64 for fp32 inputs is kept float32):
    torch's real cast (``x.to(dtype).float()``) when torch has the dtype, ``round_to_format`` otherwise (tf32, fp4)."""
    import torch

    f = format_info(name)
    x = torch.as_tensor(x, dtype=torch.float32)
    if f.torch_dtype is not None:
        return x.to(getattr(torch, f.torch_dtype)).float()
    return round_to_format(x, f).float()


def representable_values(name):
    """Every finite non-negative value of format ``name`` (exponent bits <= 8 and mantissa bits <= 10),
    ascending, enumerated from the bit patterns (float64 tensor)."""
    import torch

    f = format_info(name)
    if f.exponent_bits > 8 or f.mantissa_bits > 10:
        raise ArgumentError(f"representable_values: {f.name} has too many values; use a format of at most 19 bits")
    vals = []
    for E in range(0, top_exponent(f.exponent_bits, f.special) + 1):
        for M in range(1 << f.mantissa_bits):
            if f.special == "fn" and E == top_exponent(f.exponent_bits, f.special) and M == (1 << f.mantissa_bits) - 1:
                continue  # the NaN pattern
            frac = M / (1 << f.mantissa_bits)
            vals.append(math.ldexp(frac if E == 0 else 1 + frac, max(E, 1) - f.bias))
    return torch.tensor(vals, dtype=torch.float64)


# ---- block-scaled formats (simulated) ------------------------------------------------------------
# name -> (element format, block size, scale format)
BLOCK_FORMATS = {
    "mxfp8": ("fp8_e4m3", 32, "e8m0"),
    "mxfp4": ("fp4_e2m1", 32, "e8m0"),
    "nvfp4": ("fp4_e2m1", 16, "fp8_e4m3"),
}


SCALE_BITS = {"e8m0": 8, "fp8_e4m3": 8, "bf16": 16, "fp32": 32}  # bits of one stored block scale


def block_bits_per_element(element: str, block: int, scale: str) -> float:
    """Storage bits per element of a block-scaled format: the element format's bits plus one ``scale`` (its bits in
    ``SCALE_BITS``) shared by ``block`` elements, ``bits(element) + bits(scale) / block`` (MXFP4: 4 + 8/32 = 4.25;
    NVFP4: 4 + 8/16 = 4.5; NVFP4's one fp32 scale per tensor is left out)."""
    check_int("block", block, 1)
    check_choice("scale", scale, SCALE_BITS)
    return format_info(element).bits + SCALE_BITS[scale] / block


def block_scale(amax: float, element: str = "fp4_e2m1") -> float:
    """The shared e8m0 scale of an MX block whose largest magnitude is ``amax`` (> 0):
    ``2^(floor(log2 amax) - emax)``, ``emax`` the element format's largest normal exponent (OCP MX v1.0)."""
    a = check_number("amax", float(amax), 0, lo_open=True)  # float(): amax may be a 0-d tensor
    return math.ldexp(1.0, math.floor(math.log2(a)) - format_info(element).emax)


def block_quantize(x, name: str):
    """``x`` (a float tensor whose last dimension is a multiple of the block size) stored in block format
    ``name`` and read back (float32), simulated: the rounding the format does, with no packing.

    ``mxfp8`` / ``mxfp4`` (OCP MX v1.0): each block of 32 shares the scale ``2^(floor(log2 amax) - emax)``
    (``emax``: the element format's largest normal exponent, 8 for e4m3 and 2 for e2m1), an e8m0 power of two
    clamped to ``2^±127``; elements ``x / scale`` are rounded to the element format, saturating.
    ``nvfp4``: each block of 16 shares an e4m3 scale ``amax / 6`` (rounded to e4m3), under a per-tensor fp32
    scale ``amax_tensor / (448 · 6)`` so that the block scales fit e4m3's range."""
    import torch

    check_choice("name", name, BLOCK_FORMATS)
    elem, block, scale_fmt = BLOCK_FORMATS[name]
    fe = format_info(elem)
    x = torch.as_tensor(x, dtype=torch.float32)
    if x.ndim == 0 or x.shape[-1] % block:
        raise ArgumentError(f"x's last dimension must be a multiple of the block size {block} of {name}, got {x.shape}")
    xb = x.double().reshape(*x.shape[:-1], -1, block)
    amax = xb.abs().amax(-1, keepdim=True)
    if scale_fmt == "e8m0":
        _, exp = torch.frexp(amax)  # floor(log2 amax) = exp - 1: block_scale, for a whole tensor of blocks
        scale = torch.ldexp(torch.ones_like(amax), torch.clamp(exp - 1 - fe.emax, -127, 127).to(torch.int32))
        scale = torch.where(amax > 0, scale, torch.ones_like(scale))
    else:
        g = float(x.abs().max()) / (format_info(scale_fmt).max * fe.max)
        g = g if g > 0 else 1.0
        scale = round_to_format(amax / fe.max / g, scale_fmt) * g
        scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return (round_to_format(xb / scale, fe) * scale).reshape(x.shape).float()


def relative_error(x, y):
    """Elementwise ``|y - x| / |x|`` (float64 tensor; 0 where both are 0): the relative rounding error of
    storing ``x`` as ``y``."""
    import torch

    x, y = torch.as_tensor(x).double(), torch.as_tensor(y).double()
    err = (y - x).abs() / x.abs()
    return torch.where((x == 0) & (y == 0), torch.zeros_like(err), err)
