"""Fused RMSNorm (with the residual add) and SwiGLU in Triton, forward and backward (``autograd.Function``s).

Both are memory-bound: a few FLOPs per element, so their time is the bytes they move. Eager PyTorch runs
``h = x + residual`` and RMSNorm's steps as separate kernels, each reading its input from HBM and writing its
output back; a fused kernel reads each input row once and writes each output once:

- ``fused_rms_norm(x, weight, eps, residual=None)``: ``h = x + residual`` (when given), then
  ``y = h / sqrt(mean(h²) + eps) · weight`` over the last dimension (``nn.RMSNorm``, the kit's model norm).
  One program per row: reads x (and residual), writes y (and h, the residual stream the next block adds to)
  and one fp32 ``rstd`` per row (4 bytes a row: all the backward needs besides h).
  Backward, with n = h · rstd and g = dy · weight: ``dh = rstd · (g - n · mean(g · n)) + dh_out``, where
  ``dh_out`` is the gradient arriving on the returned h (the residual stream's own path); ``dx = dresidual = dh``;
  ``dweight = Σ_rows dy · n``, summed per program and then over programs.
- ``swiglu(gate, up)``: ``silu(gate) · up`` (the kit's MLP: ``F.silu(gate_proj(x)) * up_proj(x)``), reading gate
  and up once and writing y once (eager writes and re-reads ``silu(gate)``); the backward recomputes the
  sigmoid from gate instead of saving it: ``dup = dy · silu(gate)``,
  ``dgate = dy · up · σ(gate) · (1 + gate · (1 - σ(gate)))``.

Arithmetic in fp32 whatever the input dtype (bf16, fp16, fp32); outputs in the input's dtype. ``mistake`` (tests
only): ``"eps_outside_sqrt"`` computes ``1 / (sqrt(mean(h²)) + eps)``, ``"no_residual_grad"`` drops ``dh_out``
from the backward; the tests show each is caught. Under Triton's interpreter (CPU) the same kernels run on
numpy; on a GPU, ``num_warps`` follows the row width.
"""

from __future__ import annotations

import torch

from ..config import ArgumentError, check_choice, check_number
from .triton_kernels import INTERPRETED, tl, triton  # Triton, with TRITON_INTERPRET=1 set first where no CUDA

__all__ = ["MISTAKES", "RMSNormFunction", "SwiGLUFunction", "fused_rms_norm", "swiglu"]

MISTAKES = (None, "eps_outside_sqrt", "no_residual_grad")  # None: the right kernels; the others: for tests
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
ELEMENTWISE_BLOCK = 1024  # elements per SwiGLU program


def _row_launch(width: int) -> dict:
    """BLOCK (the row width rounded up to a power of two) and num_warps for a one-row-per-program kernel."""
    block = triton.next_power_of_2(width)
    return {"BLOCK": block, "num_warps": 4 if block <= 2048 else 8 if block <= 8192 else 16}


@triton.jit
def _rms_fwd_kernel(
    x_ptr, r_ptr, w_ptr, y_ptr, h_ptr, rstd_ptr, H, eps,
    BLOCK: tl.constexpr, HAS_RES: tl.constexpr, EPS_IN_SQRT: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    h = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:  # h is rounded to its stored dtype first: the next block adds to the stored h
        h = (h + tl.load(r_ptr + row * H + cols, mask=mask, other=0.0).to(tl.float32)).to(h_ptr.dtype.element_ty)
        tl.store(h_ptr + row * H + cols, h, mask=mask)
        h = h.to(tl.float32)
    ms = tl.sum(h * h, axis=0) / H
    if EPS_IN_SQRT:
        rstd = 1.0 / tl.sqrt(ms + eps)
    else:  # the mistake: eps outside the root
        rstd = 1.0 / (tl.sqrt(ms) + eps)
    tl.store(rstd_ptr + row, rstd)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + row * H + cols, (h * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rms_bwd_kernel(
    dy_ptr, dh_ptr, h_ptr, w_ptr, rstd_ptr, dx_ptr, dw_ptr, rows, H, rows_per_program,
    BLOCK: tl.constexpr, HAS_DRES: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    dw = tl.zeros((BLOCK,), dtype=tl.float32)  # this program's share of dweight
    first = pid * rows_per_program
    for row in range(first, tl.minimum(first + rows_per_program, rows)):
        off = row * H + cols
        dy = tl.load(dy_ptr + off, mask=mask, other=0.0).to(tl.float32)
        rstd = tl.load(rstd_ptr + row)
        n = tl.load(h_ptr + off, mask=mask, other=0.0).to(tl.float32) * rstd
        g = dy * w
        dh = rstd * (g - n * (tl.sum(g * n, axis=0) / H))
        if HAS_DRES:  # the gradient on the returned residual stream h
            dh += tl.load(dh_ptr + off, mask=mask, other=0.0).to(tl.float32)
        tl.store(dx_ptr + off, dh.to(dx_ptr.dtype.element_ty), mask=mask)
        dw += dy * n
    tl.store(dw_ptr + pid * H + cols, dw, mask=mask)


def _check(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype not in DTYPES or t.numel() == 0:
        raise ArgumentError(f"{name} must be a non-empty bf16, fp16 or fp32 tensor, got {getattr(t, 'dtype', t)}")
    if like is not None and (t.shape != like.shape or t.dtype != like.dtype):
        raise ArgumentError(f"{name} must match {tuple(like.shape)} {like.dtype}, got {tuple(t.shape)} {t.dtype}")


class RMSNormFunction(torch.autograd.Function):
    """``(x, weight, residual or None, eps, mistake)`` -> y, or (y, h) with a residual; see the module docstring."""

    @staticmethod
    def forward(ctx, x, weight, residual, eps, mistake):
        H = x.shape[-1]
        x2 = x.reshape(-1, H).contiguous()
        rows = x2.shape[0]
        y = torch.empty_like(x2)
        h = torch.empty_like(x2) if residual is not None else x2
        r2 = residual.reshape(-1, H).contiguous() if residual is not None else x2
        rstd = torch.empty(rows, dtype=torch.float32, device=x.device)
        _rms_fwd_kernel[(rows,)](
            x2, r2, weight.contiguous(), y, h, rstd, H, eps,
            HAS_RES=residual is not None, EPS_IN_SQRT=mistake != "eps_outside_sqrt", **_row_launch(H),
        )  # fmt: skip
        ctx.save_for_backward(h, weight, rstd)
        ctx.has_res, ctx.mistake = residual is not None, mistake
        if residual is None:
            return y.view(x.shape)
        return y.view(x.shape), h.view(x.shape)

    @staticmethod
    def backward(ctx, dy, dh_out=None):
        h, weight, rstd = ctx.saved_tensors
        rows, H = h.shape
        dy2 = dy.reshape(rows, H).contiguous()
        has_dres = ctx.has_res and dh_out is not None and ctx.mistake != "no_residual_grad"
        dh2 = dh_out.reshape(rows, H).contiguous() if has_dres else dy2
        programs = min(rows, 4 if INTERPRETED else 4 * torch.cuda.get_device_properties(h.device).multi_processor_count)
        per = triton.cdiv(rows, programs)
        programs = triton.cdiv(rows, per)
        dx = torch.empty_like(h)
        dw_part = torch.empty(programs, H, dtype=torch.float32, device=h.device)
        _rms_bwd_kernel[(programs,)](
            dy2, dh2, h, weight.contiguous(), rstd, dx, dw_part, rows, H, per, HAS_DRES=has_dres, **_row_launch(H)
        )
        dx = dx.view(dy.shape)
        return dx, dw_part.sum(0).to(weight.dtype), (dx if ctx.has_res else None), None, None


def fused_rms_norm(x, weight, eps: float = 1e-5, residual=None, *, mistake: str | None = None):
    """RMSNorm of ``x`` [..., H] (plus ``residual``, same shape, when given) with gain ``weight`` [H] over the
    last dimension; returns y, or ``(y, h)`` with ``h = x + residual`` (the new residual stream). Differentiable
    in x, weight and residual. ``eps`` > 0; ``mistake``: one of ``MISTAKES`` (tests only)."""
    _check("x", x)
    if residual is not None:
        _check("residual", residual, x)
    if not isinstance(weight, torch.Tensor) or weight.shape != (x.shape[-1],) or weight.dtype not in DTYPES:
        got = getattr(weight, "shape", weight)
        raise ArgumentError(f"weight must be a bf16, fp16 or fp32 tensor of shape ({x.shape[-1]},), got {got}")
    check_number("eps", eps, 0, 1, lo_open=True)
    check_choice("mistake", mistake, MISTAKES)
    return RMSNormFunction.apply(x, weight, residual, float(eps), mistake)


@triton.jit
def _swiglu_fwd_kernel(g_ptr, u_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + offs, (g * tl.sigmoid(g) * u).to(y_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(g_ptr, u_ptr, dy_ptr, dg_ptr, du_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(u_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(dy_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    sig = tl.sigmoid(g)  # recomputed, not saved
    tl.store(du_ptr + offs, (dy * g * sig).to(du_ptr.dtype.element_ty), mask=mask)
    tl.store(dg_ptr + offs, (dy * u * sig * (1.0 + g * (1.0 - sig))).to(dg_ptr.dtype.element_ty), mask=mask)


class SwiGLUFunction(torch.autograd.Function):
    """``(gate, up)`` -> ``silu(gate) · up``, saving only gate and up for the backward."""

    @staticmethod
    def forward(ctx, gate, up):
        g, u = gate.contiguous(), up.contiguous()
        y = torch.empty_like(g)
        _swiglu_fwd_kernel[(triton.cdiv(g.numel(), ELEMENTWISE_BLOCK),)](g, u, y, g.numel(), BLOCK=ELEMENTWISE_BLOCK)
        ctx.save_for_backward(g, u)
        return y

    @staticmethod
    def backward(ctx, dy):
        g, u = ctx.saved_tensors
        dg, du = torch.empty_like(g), torch.empty_like(u)
        grid = (triton.cdiv(g.numel(), ELEMENTWISE_BLOCK),)
        _swiglu_bwd_kernel[grid](g, u, dy.contiguous(), dg, du, g.numel(), BLOCK=ELEMENTWISE_BLOCK)
        return dg, du


def swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) · up`` elementwise (same shape and dtype), fused, differentiable in both."""
    _check("gate", gate)
    _check("up", up, gate)
    return SwiGLUFunction.apply(gate, up)
