"""Four Triton kernels, from a vector add to FlashAttention's forward (Tillet, Kung, Cox 2019).

A Triton kernel is a Python function over *blocks*: each program instance (``tl.program_id``) loads a
block of elements with ``tl.load`` (a mask guards the ragged edge), computes on it as if it sat in
registers and shared memory, and writes back with ``tl.store``. The compiler maps blocks to a GPU's
threads, warps and shared memory. Without a GPU, Triton's interpreter (``TRITON_INTERPRET=1``) runs
the same kernels on CPU tensors with numpy: correct, slow, so the sizes here stay small. Importing this
module sets ``TRITON_INTERPRET=1`` when no CUDA device is present and the variable is unset (it must
be set before the first ``@triton.jit``). Only APIs present in Triton 3.6 and 3.9 are used.

- ``vector_add(x, y)``; ``softmax(x, subtract_max=True)`` (one row per program; ``subtract_max=False``
  is the idea broken on purpose: ``exp`` overflows on large logits); ``matmul(a, b)`` (tiled, ``tl.dot``
  accumulating in fp32); ``triton_attention(q, k, v, causal=False)``: FlashAttention's forward, one
  program per (batch·head, block of queries), the online softmax over key blocks, GQA and bottom-right
  causal as ``attention.flash_attention``.

That attention is the first lesson (fp32 products, 16-row tiles, every key block visited and masked); the one
written to be fast on a GPU, with its backward, is ``triton_flash`` (tensor cores, autotuned tiles, the causal
loop stopped at the diagonal).
"""

from __future__ import annotations

import math
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # before any kernel is decorated

try:
    import triton
    import triton.language as tl
except ImportError as e:  # pragma: no cover - depends on the install
    raise ImportError(
        "mlsys_nb.kernels.triton_kernels needs Triton: pip install -e .[kernels] (about 1 GB on disk)"
    ) from e

from ..config import check_int
from .attention import check_shapes

if os.environ.get("TRITON_INTERPRET") == "1" and type(tl.max).__name__ != "InterpretedFunction":
    raise ImportError(
        "Triton was imported before TRITON_INTERPRET=1 was set, so its library functions are compiled-mode: "
        "import mlsys_nb.kernels before anything that imports triton (torch.compile, torch.profiler)"
    )

__all__ = ["INTERPRETED", "vector_add", "softmax", "matmul", "triton_attention"]

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask), mask=mask)


def vector_add(x: torch.Tensor, y: torch.Tensor, *, block: int = 256) -> torch.Tensor:
    """``x + y`` for 1-d tensors of the same length, ``block`` elements per program."""
    if x.shape != y.shape or x.dim() != 1:
        raise ValueError(f"x and y must be 1-d of the same length, got {tuple(x.shape)} and {tuple(y.shape)}")
    block = check_int("block", block, 16)
    out = torch.empty_like(x)
    _add_kernel[(triton.cdiv(x.numel(), block),)](x, y, out, x.numel(), BLOCK=block)
    return out


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, n_cols, stride, BLOCK: tl.constexpr, SUBTRACT_MAX: tl.constexpr):
    row = tl.program_id(0)
    offs = tl.arange(0, BLOCK)
    mask = offs < n_cols
    x = tl.load(x_ptr + row * stride + offs, mask=mask, other=-float("inf"))
    if SUBTRACT_MAX:
        x = x - tl.max(x, axis=0)
    e = tl.exp(x)
    tl.store(out_ptr + row * stride + offs, e / tl.sum(e, axis=0), mask=mask)


def softmax(x: torch.Tensor, *, subtract_max: bool = True) -> torch.Tensor:
    """Row softmax of a 2-d fp32 tensor, fused: one read and one write of each row.
    ``subtract_max=False`` drops the max subtraction (wrong: ``exp`` overflows above ~88 in fp32)."""
    if x.dim() != 2:
        raise ValueError(f"x must be 2-d [rows, cols], got {tuple(x.shape)}")
    x = x.contiguous()
    out = torch.empty_like(x)
    block = max(16, triton.next_power_of_2(x.shape[1]))
    _softmax_kernel[(x.shape[0],)](x, out, x.shape[1], x.stride(0), BLOCK=block, SUBTRACT_MAX=subtract_max)
    return out


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & (rk[None, :] < K), other=0.0)
        b = tl.load(b_ptr + rk[:, None] * N + rn[None, :], mask=(rk[:, None] < K) & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b, input_precision="ieee")  # a BM×BK tile times a BK×BN tile (fp32, no tf32)
    tl.store(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def matmul(a: torch.Tensor, b: torch.Tensor, *, block: int = 32) -> torch.Tensor:
    """``a @ b`` for 2-d fp32 tensors, tiled ``block × block`` (each program one output tile)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[0]:
        raise ValueError(f"a [M, K] and b [K, N] must be 2-d with matching K, got {tuple(a.shape)}, {tuple(b.shape)}")
    block = check_int("block", block, 16)
    a, b = a.contiguous(), b.contiguous()
    M, K = a.shape
    N = b.shape[1]
    c = torch.empty(M, N, dtype=torch.float32, device=a.device)
    _matmul_kernel[(triton.cdiv(M, block), triton.cdiv(N, block))](a, b, c, M, N, K, BM=block, BN=block, BK=block)
    return c


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, sq, sk, H, G, scale,
    D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
):  # fmt: skip
    bh = tl.program_id(1)
    kv_bh = (bh // H) * (H // G) + (bh % H) // G  # GQA: query head h reads KV head h // G
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q = tl.load(
        q_ptr + bh * sq * D + rm[:, None] * D + rd[None, :], mask=(rm[:, None] < sq) & (rd[None, :] < D), other=0.0
    )
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    acc = tl.zeros((BM, BD), tl.float32)
    for n0 in range(0, sk, BN):
        rn = n0 + tl.arange(0, BN)
        kv_mask = (rn[:, None] < sk) & (rd[None, :] < D)
        k = tl.load(k_ptr + kv_bh * sk * D + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_bh * sk * D + rn[:, None] * D + rd[None, :], mask=kv_mask, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
        visible = rn[None, :] < sk
        if CAUSAL:
            visible = visible & (rn[None, :] <= rm[:, None] + (sk - sq))
        s = tl.where(visible, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == -float("inf"), 0.0, m_new)
        p = tl.exp(s - m_safe[:, None])
        alpha = tl.exp(m_i - m_safe)  # the rescale of what was accumulated so far
        l_i = alpha * l_i + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(o_ptr + bh * sq * D + rm[:, None] * D + rd[None, :], out, mask=(rm[:, None] < sq) & (rd[None, :] < D))


def triton_attention(q, k, v, *, causal: bool = False, block: int = 16) -> torch.Tensor:
    """FlashAttention's forward in Triton (fp32): shapes, GQA and the bottom-right causal rule as
    ``attention.flash_attention``; interpreted on CPU tensors, compiled on a GPU. Forward only."""
    g = check_shapes(q, k, v, causal)
    block = check_int("block", block, 16)
    b, h, sq, d = q.shape
    q, k, v = (t.contiguous().float() for t in (q, k, v))
    out = torch.empty_like(q)
    grid = (triton.cdiv(sq, block), b * h)
    _attn_fwd_kernel[grid](
        q, k, v, out, sq, k.shape[2], h, g, 1.0 / math.sqrt(d),
        D=d, BD=max(16, triton.next_power_of_2(d)), BM=block, BN=block, CAUSAL=causal,
    )  # fmt: skip
    return out
