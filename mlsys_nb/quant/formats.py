"""Weight-only quantization from scratch: absmax int8, group-wise int4 with zero points, NF4 (QLoRA).

``quantize(w, scheme, *, group_size=None, double_quant=False)`` returns a ``QuantizedTensor`` holding exactly
what would be stored: the codes (int4 and NF4 packed two per byte), the scales and the zero points;
``.dequantize()`` rebuilds a float32 tensor shaped like ``w`` and ``.nbytes`` counts the stored bytes.

Conventions (``group_size``; groups run along the last dimension, the input features of an ``nn.Linear``):

- ``"int8"``: symmetric absmax, ``q = round(w / s)`` in [-127, 127], ``s = absmax / 127`` in fp32.
  ``group_size=None``: one scale per tensor; ``-1``: one per row (output channel); ``g > 0``: per group of g.
- ``"int4"``: asymmetric, ``s = (max - min) / 15``, zero point ``z = round(-min / s)`` in [0, 15],
  ``q = clamp(round(w / s) + z, 0, 15)``, ``w ≈ (q - z) · s``; scale and zero point stored in fp16 each
  (as AWQ's kernels keep them): 4 + 32/g bits per weight, 4.25 at g = 128 (the default; ``-1`` = per row).
- ``"nf4"``: QLoRA's NormalFloat4 (Dettmers et al. 2023, arXiv:2305.14314): blocks of ``group_size``
  (default 64) consecutive elements of the flattened tensor, ``w / absmax`` rounded to the nearest of the
  16 values of ``nf4_codebook()``, absmax in fp32 (4.5 bits per weight at 64). ``double_quant=True``
  quantizes the absmax values again (QLoRA's double quantization): their mean is subtracted and they are
  stored in 8 bits with one fp32 scale per 256 scales, 4 + 8/64 + 32/(64·256) ≈ 4.127 bits per weight.
  (QLoRA stores them as 8-bit floats, bitsandbytes' dynamic 8-bit code; this kit rounds them with absmax int8:
  the same bytes, another grid.)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import ArgumentError, check_choice, check_int

SCHEMES = ("int8", "int4", "nf4")
DEFAULT_GROUP = {"int8": None, "int4": 128, "nf4": 64}
DOUBLE_QUANT_BLOCK = 256  # absmax values per second-level scale (QLoRA)
NF4_OFFSET = 0.9677083  # QLoRA's quantile offset: (1 - 1/(2·15) + 1 - 1/(2·16)) / 2


def bits_per_weight(scheme: str, group_size: int | None = None, double_quant: bool = False) -> float:
    """Stored bits per weight of ``quantize(w, scheme, group_size=...)`` for a large tensor (codes + scales +
    zero points; the per-tensor constants vanish)."""
    check_choice("scheme", scheme, SCHEMES)
    g = DEFAULT_GROUP[scheme] if group_size is None else group_size
    if g is None:
        return 8.0
    check_int("group_size", g, 1)
    if scheme == "int8":
        return 8 + 32 / g
    if scheme == "int4":
        return 4 + (16 + 16) / g
    if double_quant:
        return 4 + 8 / g + 32 / (DOUBLE_QUANT_BLOCK * g)
    return 4 + 32 / g


# QLoRA's published NF4 values (Dettmers et al. 2023, arXiv:2305.14314, appendix E; the float32 table of its
# reference implementation, bitsandbytes), ascending.
NF4_PUBLISHED = (
    -1.0,
    -0.6961928009986877,
    -0.5250730514526367,
    -0.39491748809814453,
    -0.28444138169288635,
    -0.18477343022823334,
    -0.09105003625154495,
    0.0,
    0.07958029955625534,
    0.16093020141124725,
    0.24611230194568634,
    0.33791524171829224,
    0.44070982933044434,
    0.5626170039176941,
    0.7229568362236023,
    1.0,
)


def nf4_codebook() -> torch.Tensor:
    """The 16 NF4 values as stored (float32, ascending, in [-1, 1]): QLoRA's published table, which
    ``nf4_from_quantiles()`` re-derives from normal quantiles to within 3e-7 (tested)."""
    return torch.tensor(NF4_PUBLISHED, dtype=torch.float32)


def nf4_from_quantiles() -> torch.Tensor:
    """NF4's 16 values derived from normal quantiles (float64, ascending), as QLoRA builds them.

    8 positive values: ``ndtri(p)`` for p on ``linspace(offset, 0.5, 9)`` without its last point; 7 negative ones:
    ``-ndtri(p)`` for p on ``linspace(offset, 0.5, 8)`` without its last point; plus an exact 0; all divided by the
    largest. (Asymmetric so that 0 is a code and both ±1 are.)"""
    pos = torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, 9, dtype=torch.float64)[:-1])
    neg = -torch.special.ndtri(torch.linspace(NF4_OFFSET, 0.5, 8, dtype=torch.float64)[:-1])
    v = torch.cat([pos, torch.zeros(1, dtype=torch.float64), neg]).sort().values
    return v / v.max()


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Pack 4-bit codes (uint8 in [0, 15], any shape; flattened, padded with 0 to even length) two per byte,
    the first of each pair in the high nibble (bitsandbytes' order). Returns uint8 of ceil(n/2) bytes."""
    if codes.numel():
        check_int("codes (their largest value)", int(codes.max()), 0, 15)
        check_int("codes (their smallest value)", int(codes.min()), 0, 15)
    flat = codes.reshape(-1).to(torch.uint8)
    if flat.numel() % 2:
        flat = torch.cat([flat, flat.new_zeros(1)])
    return (flat[0::2] << 4) | flat[1::2]


def unpack_int4(packed: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` 4-bit codes (uint8) of a ``pack_int4`` byte array."""
    packed = packed.reshape(-1)
    return torch.stack([packed >> 4, packed & 15], dim=1).reshape(-1)[:n]


@dataclass
class QuantizedTensor:
    """What a quantized weight stores. ``codes``: int8 values (int8) or packed 4-bit codes (uint8);
    ``scales``: one per group (fp32 for int8 and NF4, fp16 for int4; int8 under NF4 double quantization);
    ``zeros``: int4's zero points (fp16) or None; ``scale_scales`` and ``scale_offset``: NF4 double
    quantization's fp32 second-level scales and the mean subtracted from the absmax values."""

    scheme: str
    shape: tuple
    group_size: int | None
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None = None
    scale_scales: torch.Tensor | None = None
    scale_offset: torch.Tensor | None = None
    codebook: torch.Tensor | None = None  # NF4's 16 values when not ``nf4_codebook()`` (an experiment's table)

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        """Bytes stored: packed values, scales, zero points (and double quantization's second level)."""
        parts = [self.codes, self.scales, self.zeros, self.scale_scales, self.scale_offset]
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def bits_per_weight(self) -> float:
        """8 · nbytes / number of weights."""
        return 8 * self.nbytes / self.numel

    def absmax(self) -> torch.Tensor:
        """NF4's per-block absmax in fp32 (undoing double quantization if it was applied)."""
        if self.scale_scales is None:
            return self.scales.float()
        s = self.scales.float().reshape(-1)
        n = s.numel()
        pad = (-n) % DOUBLE_QUANT_BLOCK
        s = torch.cat([s, s.new_zeros(pad)]).view(-1, DOUBLE_QUANT_BLOCK) * self.scale_scales[:, None]
        return s.reshape(-1)[:n] + self.scale_offset

    def dequantize(self) -> torch.Tensor:
        """A float32 tensor shaped like the original."""
        if self.scheme == "nf4":
            idx = unpack_int4(self.codes, self.numel).long()
            table = (nf4_codebook() if self.codebook is None else self.codebook).to(idx.device)
            v = table[idx].view(-1, self.group_size)
            return (v * self.absmax()[:, None]).reshape(self.shape)
        rows = _grouped_shape(self.shape, self.group_size)
        if self.scheme == "int8":
            return (self.codes.float().view(rows) * self.scales.float()[..., None]).reshape(self.shape)
        q = unpack_int4(self.codes, self.numel).float().view(rows)
        return ((q - self.zeros.float()[..., None]) * self.scales.float()[..., None]).reshape(self.shape)


def _grouped_shape(shape: tuple, group_size: int | None) -> tuple:
    """The [groups, group_size] view of a tensor of ``shape`` under the int8/int4 convention."""
    n = 1
    for d in shape:
        n *= d
    if group_size is None:
        return (1, n)
    last = shape[-1] if len(shape) else 1
    g = last if group_size == -1 else group_size
    if last % g:
        raise ArgumentError(f"group_size must divide the last dimension {last}, got {group_size}")
    return (n // g, g)


def int4_params(wg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point (both fp16-representable, returned as float32) of int4 groups ``wg`` [groups, g]:
    ``s = (max - min) / 15`` (min clipped to <= 0 and max to >= 0 so that 0 is exact), ``z = round(-min / s)``."""
    lo = wg.amin(dim=-1).clamp(max=0)
    hi = wg.amax(dim=-1).clamp(min=0)
    s = ((hi - lo) / 15).clamp(min=1e-8).half().float()
    z = torch.round(-lo / s).clamp(0, 15)
    return s, z


def int4_codes(wg: torch.Tensor, s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
    """Round-to-nearest int4 codes of ``wg`` under scale ``s`` and zero point ``z`` (broadcast on the last dim)."""
    return torch.clamp(torch.round(wg / s[..., None]) + z[..., None], 0, 15)


def quantize(
    w: torch.Tensor,
    scheme: str,
    *,
    group_size: int | None = None,
    double_quant: bool = False,
    codebook: torch.Tensor | None = None,
) -> QuantizedTensor:
    """Round-to-nearest weight quantization of ``w`` (any float tensor) to ``scheme`` ("int8", "int4", "nf4");
    see the module docstring for each scheme's scales and ``group_size``. Returns a ``QuantizedTensor``.
    ``codebook``: 16 ascending values replacing NF4's table (to show what a wrong table does)."""
    check_choice("scheme", scheme, SCHEMES)
    if not isinstance(w, torch.Tensor) or not w.is_floating_point() or w.numel() == 0:
        raise ArgumentError(f"w must be a non-empty floating-point tensor, got {type(w).__name__}")
    if double_quant and scheme != "nf4":
        raise ArgumentError(f"double_quant applies to scheme 'nf4' only, got scheme {scheme!r}")
    if group_size is None:
        group_size = DEFAULT_GROUP[scheme]
    if group_size is not None and group_size != -1:
        check_int("group_size", group_size, 1, 1 << 30)
    w = w.detach().float()
    shape = tuple(w.shape)
    if scheme == "nf4":
        if group_size == -1 or w.numel() % group_size:
            raise ArgumentError(f"group_size must divide the {w.numel()} weights for nf4, got {group_size}")
        blocks = w.reshape(-1, group_size)
        absmax = blocks.abs().amax(dim=1)
        normed = blocks * (1 / absmax.clamp(min=1e-38))[:, None]  # times the reciprocal, as bitsandbytes does
        table = (nf4_codebook() if codebook is None else codebook.float()).to(w.device)  # on the weights' device
        if table.shape != (16,):
            raise ArgumentError(f"codebook must hold 16 values, got shape {tuple(table.shape)}")
        # the nearest level: count the float32 midpoints between neighbouring levels below the value (a value on
        # a midpoint goes to the lower level), as bitsandbytes does
        idx = torch.bucketize(normed, (table[1:] + table[:-1]) / 2)
        qt = QuantizedTensor("nf4", shape, group_size, pack_int4(idx.to(torch.uint8)), absmax, codebook=codebook)
        if double_quant:
            offset = absmax.mean()
            centred = absmax - offset
            pad = (-centred.numel()) % DOUBLE_QUANT_BLOCK
            c = torch.cat([centred, centred.new_zeros(pad)]).view(-1, DOUBLE_QUANT_BLOCK)
            ss = (c.abs().amax(dim=1) / 127).clamp(min=1e-12)
            q8 = torch.round(c / ss[:, None]).clamp(-127, 127).to(torch.int8).reshape(-1)[: absmax.numel()]
            qt.scales, qt.scale_scales, qt.scale_offset = q8, ss, offset.reshape(1)
        return qt
    wg = w.reshape(_grouped_shape(shape, group_size))
    if scheme == "int8":
        s = (wg.abs().amax(dim=1) / 127).clamp(min=1e-12)
        q = torch.round(wg / s[:, None]).clamp(-127, 127).to(torch.int8)
        return QuantizedTensor("int8", shape, group_size, q, s)
    s, z = int4_params(wg)
    q = int4_codes(wg, s, z).to(torch.uint8)
    return QuantizedTensor("int4", shape, group_size, pack_int4(q), s.half(), z.half())


def from_int4_codes(shape: tuple, group_size: int, codes: torch.Tensor, s: torch.Tensor, z: torch.Tensor):
    """A ``QuantizedTensor`` from int4 codes [groups, g] chosen elsewhere (GPTQ), their scales and zero points."""
    return QuantizedTensor("int4", tuple(shape), group_size, pack_int4(codes.to(torch.uint8)), s.half(), z.half())
