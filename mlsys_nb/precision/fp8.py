"""FP8 matmuls with their scaling recipes, on CPU: torch's real fp8 casts and ``torch._scaled_mm``.

An fp8 value has 3 (e4m3) or 2 (e5m2) mantissa bits and a narrow range (e4m3: ±448, smallest subnormal
2^-9), so a tensor is multiplied by a scale before the cast and the matmul's fp32 result is divided by it.
The recipes differ in what one scale covers:

- **per-tensor, current** (``quantize_tensor``): ``scale = fmax / amax(x)`` from the tensor being cast;
- **per-tensor, delayed** (``DelayedScaling``, Transformer Engine's default): the scale comes from the
  largest amax of the last ``history`` steps, so it is known before the tensor is (no extra pass over it);
  values above that amax saturate;
- **fine-grained tiles** (``quantize_tiles``; DeepSeek-V3, arXiv:2412.19437 §3.3): one scale per 1×128
  tile of activations and per 128×128 block of weights, so one outlier only coarsens its own tile; the
  matmul adds the fp32 partial products of each 128-wide slice of K (``tile_matmul``).

Every matmul here runs ``torch._scaled_mm`` (it takes fp8 operands and fp32 scales on CPU: tensor-wise, or
row-wise as an (M, 1) and a (1, N) vector) and is checked in ``tests/test_precision.py`` against casts +
an fp32 matmul. The numerics are emulated on the CPU (no fp8 tensor cores here): the errors are those of the
formats, not the speed.
"""

from __future__ import annotations

from collections import deque

from ..config import check_choice, check_int, check_multiple, check_number, check_probability
from .formats import format_info

FP8 = ("fp8_e4m3", "fp8_e5m2")


def amax_scale(amax, fmt: str = "fp8_e4m3", margin: int = 0):
    """The scale that maps ``amax`` to the format's max: ``fmax / amax / 2^margin`` (a float or tensor;
    1 where amax is 0). ``x · scale`` is cast; the product of two casts is divided by both scales."""
    import torch

    check_choice("fmt", fmt, FP8)
    check_int("margin", margin, 0, 30)
    amax = torch.as_tensor(amax, dtype=torch.float32)
    s = format_info(fmt).max / amax / 2.0**margin
    return torch.where(amax > 0, s, torch.ones_like(s))


def _cast(x, fmt):
    import torch

    return x.to(getattr(torch, format_info(fmt).torch_dtype))


def quantize_tensor(x, fmt: str = "fp8_e4m3", amax=None):
    """``(q, scale)``: ``x`` cast to fp8 after multiplying by one per-tensor scale (from ``amax``, default
    the current ``amax(|x|)``); values beyond ``amax`` saturate (e4m3) or overflow (e5m2)."""
    import torch

    x = torch.as_tensor(x, dtype=torch.float32)
    scale = amax_scale(x.abs().max() if amax is None else amax, fmt)
    return _cast(x * scale, fmt), scale


def tensor_matmul(a, b, fmt_a: str = "fp8_e4m3", fmt_b: str = "fp8_e4m3", amax_a=None, amax_b=None):
    """``a @ b`` (float32 (M, K) and (K, N)) through fp8 with one scale per tensor (current scaling, or the
    given amaxes), on ``torch._scaled_mm``; returns float32 (M, N)."""
    import torch

    qa, sa = quantize_tensor(a, fmt_a, amax_a)
    qb, sb = quantize_tensor(b, fmt_b, amax_b)
    one = torch.tensor(1.0)
    return torch._scaled_mm(qa, qb.t().contiguous().t(), scale_a=one / sa, scale_b=one / sb, out_dtype=torch.float32)


class DelayedScaling:
    """Per-tensor delayed scaling: the scale of step t comes from the largest amax of the ``history`` steps
    before it (``fmax / max(history)``), and this step's amax is recorded after the cast. The first step,
    with no history, uses its own amax."""

    def __init__(self, history: int = 16, fmt: str = "fp8_e4m3"):
        self.fmt = check_choice("fmt", fmt, FP8)
        self.amaxes = deque(maxlen=check_int("history", history, 1, 1024))

    def quantize(self, x):
        """``(q, scale)`` for this step's tensor ``x``; records ``amax(|x|)``."""
        import torch

        x = torch.as_tensor(x, dtype=torch.float32)
        amax = x.abs().max()
        scale = amax_scale(max(self.amaxes) if self.amaxes else amax, self.fmt)
        self.amaxes.append(float(amax))
        return _cast(x * scale, self.fmt), scale


def quantize_tiles(x, tile=(1, 128), fmt: str = "fp8_e4m3"):
    """``(q, scales)``: ``x`` (float32 (R, C), both multiples of the tile's sides) cast to fp8 with one scale
    per ``tile`` (1×128 for activations, 128×128 for weights in DeepSeek-V3); ``scales`` has shape
    ``(R / tile[0], C / tile[1])``."""
    import torch

    x = torch.as_tensor(x, dtype=torch.float32)
    tr, tc = (check_int("tile[0]", tile[0], 1), check_int("tile[1]", tile[1], 1))
    check_multiple("x.shape[0]", x.shape[0], tr, "tile[0]")
    check_multiple("x.shape[1]", x.shape[1], tc, "tile[1]")
    blocks = x.reshape(x.shape[0] // tr, tr, x.shape[1] // tc, tc)
    scales = amax_scale(blocks.abs().amax(dim=(1, 3)), fmt)
    q = _cast(blocks * scales[:, None, :, None], fmt).reshape(x.shape)
    return q, scales


def tile_matmul(a, b, block: int = 128, fmt: str = "fp8_e4m3"):
    """``a @ b`` with DeepSeek-V3's fine-grained scaling: ``a`` (M, K) in 1×``block`` tiles, ``b`` (K, N) in
    ``block``×``block`` tiles, one ``torch._scaled_mm`` per ``block``-wide slice of K with row-wise scales
    (``a``'s (M, 1), ``b``'s (1, N)), the slices' fp32 results summed in fp32. Returns float32 (M, N)."""
    import torch

    check_int("block", block, 1)
    qa, sa = quantize_tiles(a, (1, block), fmt)
    qb, sb = quantize_tiles(b, (block, block), fmt)
    out = torch.zeros(a.shape[0], b.shape[1])
    for k in range(a.shape[1] // block):
        sl = slice(k * block, (k + 1) * block)
        inv_a = (1.0 / sa[:, k : k + 1]).contiguous()  # (M, 1)
        inv_b = (1.0 / sb[k]).repeat_interleave(block)[None, :].contiguous()  # (1, N)
        bk = qb[sl].t().contiguous().t()  # column-major, as _scaled_mm wants its second operand
        out += torch._scaled_mm(qa[:, sl].contiguous(), bk, scale_a=inv_a, scale_b=inv_b, out_dtype=torch.float32)
    return out


def relative_matmul_error(approx, exact) -> float:
    """Frobenius relative error ``‖approx − exact‖ / ‖exact‖`` (unitless)."""
    import torch

    exact = torch.as_tensor(exact, dtype=torch.float64)
    return float(torch.linalg.norm(torch.as_tensor(approx, dtype=torch.float64) - exact) / torch.linalg.norm(exact))


def activations_with_outliers(
    m: int = 256, k: int = 512, outlier_frac: float = 0.001, magnitude: float = 1000.0, seed=0
):
    """Synthetic activations (float32 (m, k)): standard normal entries and a fraction ``outlier_frac`` of
    entries ``magnitude`` times larger, the sparse huge values LLM activations show (a model of them, not
    recorded activations)."""
    import torch

    frac = check_probability("outlier_frac", outlier_frac)
    check_number("magnitude", magnitude, 1)
    g = torch.Generator().manual_seed(int(seed))
    x = torch.randn(m, k, generator=g)
    mask = torch.rand(m, k, generator=g) < frac
    return torch.where(mask, x * magnitude, x)
