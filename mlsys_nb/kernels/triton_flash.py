"""FlashAttention forward and backward in Triton, written the way fast kernels are (FlashAttention-2).

``triton_kernels.triton_attention`` is the first lesson: the online softmax over key tiles, in fp32 with IEEE
products, 16-row tiles, and a causal loop that visits every key tile and masks what it must not see. Correct, and
on an H100 the GPU pack measured it 13-89x slower than SDPA. This module runs the same algorithm (Dao 2023,
arXiv:2307.08691, Alg. 1 and 2) with the four changes that make it fast:

1. **Tensor cores.** bf16/fp16 inputs go into ``tl.dot`` at its default precision: the matrix units multiply
   half-precision tiles and accumulate in fp32 (scores, row sums, the output accumulator stay fp32; ``P`` is cast
   to the input dtype before ``P·V``, as FlashAttention does). fp32 inputs take ``input_precision="ieee"`` (exact
   products, on CUDA cores): the path the interpreter's exactness checks use.
2. **Big tiles, chosen by timing.** On a GPU each kernel is wrapped in ``triton.autotune``: a short list of
   (block_q, block_k, num_warps, num_stages) configurations is timed once per (head_dim, causal, dtype,
   power-of-two length bucket) and the fastest kept. Under the interpreter the tiles are fixed at 16 x 16.
3. **The causal loop stops at the diagonal.** Bottom-right aligned causal (offset ``off = s_k - s_q``): query
   row ``i`` sees key ``j`` iff ``j <= i + off``. Query tile ``[m0, m0 + BM)`` therefore sees no key at or past
   ``m0 + BM + off`` and its loop ends there (``key_range``): over all query tiles about half the key tiles are
   visited (``key_tiles_visited``; the kernel counts its own iterations to check it). The key tiles every row of
   the tile sees entirely, those below ``m0 + off + 1``, need no mask: only the diagonal tiles (and a ragged last
   tile) pay for one, so each kernel runs two loops, unmasked then masked.
4. **Base-2 exponentials.** Scores are scaled once by ``log2(e)/sqrt(d)`` and the softmax runs in base 2
   (``exp2`` is the GPU's instruction; ``exp`` is ``exp2`` of a product). The saved log-sum-exp is converted
   back to natural log: ``lse = log Σ_j exp(q·k_j / sqrt(d))`` per query row, in fp32.

**Backward.** Saved: ``q, k, v, o`` and ``lse``. First ``D = rowsum(dO ∘ O)``, the softmax Jacobian's row
term, by a small kernel of its own (``flash_row_term``: one read of dO and O, fp32 sums). Then two kernels, each
recomputing ``P = exp(S - lse)`` tile by tile instead of storing it: one program per key tile accumulates
``dV += Pᵀ dO`` and ``dK += dSᵀ Q`` with ``dS = P ∘ (dP - D)``, ``dP = dO Vᵀ``, over every query tile that sees it
and over the query heads that share its KV head under GQA (so no atomics); one program per query tile accumulates
``dQ += dS K``. ``dQ`` and ``dK`` are scaled by ``1/sqrt(d)`` once at the end. ``flash_attention_triton`` wraps
forward and backward in an ``autograd.Function``.

Shapes as ``attention.flash_attention``: ``q [batch, heads, s_q, d]``, ``k, v [batch, kv_heads, s_k, d]``, GQA,
any lengths (the ragged edges are masked), ``d <= 256``. CPU tensors under ``TRITON_INTERPRET=1`` (set by
``mlsys_nb.kernels`` without a GPU: slow, so the tests' sizes are tiny), CUDA tensors when compiled.
"""

from __future__ import annotations

import math

import torch

from ..config import check_int
from .attention import check_shapes
from .triton_kernels import INTERPRETED, tl, triton

__all__ = [
    "flash_attention_triton",
    "flash_forward",
    "flash_backward",
    "key_range",
    "key_tiles_visited",
    "flash_row_term",
    "dot_precision",
    "INTERPRETED_TILE",
]

INTERPRETED_TILE = 16  # block_q = block_k under the interpreter (and the smallest tile tl.dot accepts)
_LOG2E = tl.constexpr(1.4426950408889634)  # log2(e): exp(x) = exp2(x · log2(e))
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _configs(rows):
    return [triton.Config({"BM": bm, "BN": bn}, num_warps=w, num_stages=s) for bm, bn, w, s in rows]


# (block_q, block_k, num_warps, num_stages), from the shapes Triton's fused-attention tutorial tunes over on Hopper;
# each compiles for sm_90a at head_dim 64 and 128 with at most 60 bytes of register spill (ptxas -v on Triton 3.9's
# PTX, compiled without a GPU): the dK/dV kernel holds two fp32 [block_k, d] accumulators, so its tiles are small.
FWD_CONFIGS = _configs([(128, 128, 8, 3), (128, 64, 8, 4), (128, 32, 4, 4), (64, 64, 4, 3)])
DKDV_CONFIGS = _configs([(32, 64, 8, 3), (32, 128, 8, 3), (64, 64, 8, 3), (16, 64, 4, 3)])
DQ_CONFIGS = _configs([(128, 64, 8, 3), (128, 32, 8, 3), (64, 64, 8, 3)])


def _tuned(configs, kernel):
    """On a GPU: ``kernel`` autotuned over ``configs`` per (head dim, causal, dtypes, length bucket)."""
    return kernel if INTERPRETED else triton.autotune(configs, key=["D", "CAUSAL", "BUCKET"])(kernel)


@triton.jit
def _mma(a, b, PREC: tl.constexpr):
    """``a @ b`` accumulated in fp32. PREC "ieee": fp32 products on CUDA cores; "tf32": Triton's default, which
    for bf16/fp16 tiles is the tensor cores' MMA; "upcast" (the interpreter, half inputs): the tiles converted to
    fp32 first, because Triton's interpreter keeps bf16 as raw uint16 bits and multiplies those (it does not
    support bf16 dots, triton-lang/triton#11584): exact products of the same half values, as a tensor core's."""
    if PREC == "upcast":
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PREC)


# ---- which tiles a program visits ---------------------------------------------------------------------------
@triton.jit
def key_range(m0, sq, sk, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    """Key tiles of query tile ``[m0, m0 + BM)``: ``[0, full)`` are seen whole by every row (no mask),
    ``[full, end)`` need a mask (the diagonal, a ragged last tile); keys from ``end`` on are never seen."""
    if CAUSAL:
        end = tl.minimum(m0 + BM + (sk - sq), sk)  # past the tile's last row's horizon
        full = tl.minimum((m0 + (sk - sq) + 1) // BN * BN, sk // BN * BN)  # within its first row's horizon
    else:
        end = sk + 0 * m0
        full = sk // BN * BN + 0 * m0
    return full, end


@triton.jit
def _query_range(n0, sq, sk, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr):
    """Query tiles that see key tile ``[n0, n0 + BN)``: ``[lo, full)`` partly (masked), ``[full, s_q)`` whole."""
    if CAUSAL:
        lo = tl.maximum(n0 - (sk - sq), 0) // BM * BM  # the first row that sees key n0
        full = tl.cdiv(tl.maximum(n0 + BN - 1 - (sk - sq), 0), BM) * BM  # from here rows see key n0 + BN - 1
    else:
        lo = 0 * n0
        full = 0 * n0
    return lo, full


def key_tiles_visited(s_q: int, s_k: int, block_q: int, block_k: int, causal: bool) -> list[int]:
    """Key tiles each query tile's forward loop visits (``key_range`` in Python): ``ceil(end / block_k)``,
    ``end = min(s_k, m0 + block_q + s_k - s_q)`` under causal, else ``s_k``. Causal visits about half."""
    out = []
    for m0 in range(0, s_q, block_q):
        end = min(s_k, m0 + block_q + s_k - s_q) if causal else s_k
        out.append(-(-end // block_k))
    return out


@triton.jit
def _tile(rows, n, rd, D: tl.constexpr, BD: tl.constexpr):
    """Element offsets of a ``[len(rows), BD]`` tile of a row-major ``[n, D]`` matrix, and its mask: rows past
    ``n`` off, and the padded columns ``D..BD`` only where the head dim is not a power of two. A mask that is
    constant along a row keeps each row's load one wide vector: with ``BD == D`` it masks rows only."""
    if BD == D:
        return rows[:, None] * D + rd[None, :], rows[:, None] < n
    else:
        return rows[:, None] * D + rd[None, :], (rows[:, None] < n) & (rd[None, :] < D)


@triton.jit
def _query_tile(sq, sk, H, G, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    """Where a program that owns query tile ``program_id(0)`` of query head ``program_id(1)`` (= batch · heads +
    head) reads: first row ``m0``, head ``bh``, rows ``rm``, columns ``rd``, the element offsets of its Q head and
    of the KV head it reads (GQA: query head h reads KV head h // G), and its tile's offsets and mask."""
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    kv_bh = (bh // H) * (H // G) + (bh % H) // G
    rm = m0 + tl.arange(0, BM)
    rd = tl.arange(0, BD)
    q_tile, q_mask = _tile(rm, sq, rd, D, BD)
    return m0, bh, rm, rd, bh.to(tl.int64) * sq * D + q_tile, kv_bh.to(tl.int64) * sk * D, q_mask


# ---- forward ------------------------------------------------------------------------------------------------
@triton.jit
def _fwd_tiles(acc, l_i, m_i, visits, q, k_ptr, v_ptr, rm, rd, lo, hi, sq, sk, qk_scale,
               D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
               PREC: tl.constexpr):  # fmt: skip
    """The online softmax over key tiles ``[lo, hi)``: the running max ``m_i`` and sum ``l_i`` (base 2) and the
    unnormalised output ``acc`` rescaled by ``alpha`` whenever the max grows."""
    for n0 in range(lo, hi, BN):
        rn = n0 + tl.arange(0, BN)
        kv_tile, kv_mask = _tile(rn, sk, rd, D, BD)
        k = tl.load(k_ptr + kv_tile, mask=kv_mask, other=0.0)
        s = _mma(q, tl.trans(k), PREC) * qk_scale  # [BM, BN] scores, log2 units
        if MASK:
            seen = rn[None, :] < sk
            if CAUSAL:
                seen = seen & (rn[None, :] <= rm[:, None] + (sk - sq))
            s = tl.where(seen, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))  # finite: every row sees a key of its first tile
        p = tl.math.exp2(s - m_new[:, None])
        alpha = tl.math.exp2(m_i - m_new)
        v = tl.load(v_ptr + kv_tile, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + _mma(p.to(v.dtype), v, PREC)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        m_i = m_new
        visits += 1
    return acc, l_i, m_i, visits


@triton.jit
def _fwd_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, count_ptr, sq, sk, H, G, qk_scale, BUCKET,
                D: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr, COUNT: tl.constexpr,
                BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """One program: query tile ``program_id(0)`` of query head ``program_id(1)`` (= batch · heads + head)."""
    m0, bh, rm, rd, q_tile, kv_off, q_mask = _query_tile(sq, sk, H, G, D, BD, BM)
    q = tl.load(q_ptr + q_tile, mask=q_mask, other=0.0)
    acc = tl.zeros((BM, BD), tl.float32)
    l_i = tl.zeros((BM,), tl.float32)
    m_i = tl.full((BM,), -float("inf"), tl.float32)
    full, end = key_range(m0, sq, sk, BM, BN, CAUSAL)
    visits = 0
    acc, l_i, m_i, visits = _fwd_tiles(acc, l_i, m_i, visits, q, k_ptr + kv_off, v_ptr + kv_off, rm, rd, 0, full,
                                       sq, sk, qk_scale, D, BD, BN, False, CAUSAL, PREC)  # fmt: skip
    acc, l_i, m_i, visits = _fwd_tiles(acc, l_i, m_i, visits, q, k_ptr + kv_off, v_ptr + kv_off, rm, rd, full, end,
                                       sq, sk, qk_scale, D, BD, BN, True, CAUSAL, PREC)  # fmt: skip
    out = (acc / l_i[:, None]).to(o_ptr.dtype.element_ty)  # normalised once, at the end
    tl.store(o_ptr + q_tile, out, mask=q_mask)
    tl.store(lse_ptr + bh * sq + rm, (m_i + tl.math.log2(l_i)) / _LOG2E, mask=rm < sq)  # natural log
    if COUNT:
        tl.store(count_ptr + bh * tl.num_programs(0) + tl.program_id(0), visits)


_fwd_tuned = _tuned(FWD_CONFIGS, _fwd_kernel)


# ---- backward -----------------------------------------------------------------------------------------------
@triton.jit
def _row_term_kernel(o_ptr, do_ptr, delta_ptr, n_rows, D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr):
    """``D = rowsum(dO ∘ O)`` of ``BM`` rows (every head's rows, one after another), summed in fp32."""
    rows = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    tile, mask = _tile(rows, n_rows, tl.arange(0, BD), D, BD)
    o = tl.load(o_ptr + tile, mask=mask, other=0.0).to(tl.float32)
    do = tl.load(do_ptr + tile, mask=mask, other=0.0).to(tl.float32)
    tl.store(delta_ptr + rows, tl.sum(o * do, axis=1), mask=rows < n_rows)


@triton.jit
def _dkdv_tiles(dk, dv, k, v, q_ptr, do_ptr, lse_ptr, delta_ptr, rn, rd, lo, hi, sq, sk, qk_scale,
                D: tl.constexpr, BD: tl.constexpr, BM: tl.constexpr, MASK: tl.constexpr,
                PREC: tl.constexpr):  # fmt: skip
    """dV and dK of one key tile from query tiles ``[lo, hi)`` of one query head, transposed (keys as rows)."""
    for m0 in range(lo, hi, BM):
        rm = m0 + tl.arange(0, BM)
        q_tile, q_mask = _tile(rm, sq, rd, D, BD)  # rows past s_q load 0 and contribute 0
        q = tl.load(q_ptr + q_tile, mask=q_mask, other=0.0)
        do = tl.load(do_ptr + q_tile, mask=q_mask, other=0.0)
        lse = tl.load(lse_ptr + rm, mask=rm < sq, other=0.0) * _LOG2E
        delta = tl.load(delta_ptr + rm, mask=rm < sq, other=0.0)
        pt = tl.math.exp2(_mma(k, tl.trans(q), PREC) * qk_scale - lse[None, :])  # Pᵀ [BN, BM]
        if MASK:
            pt = tl.where(rn[:, None] <= rm[None, :] + (sk - sq), pt, 0.0)
        dv += _mma(pt.to(do.dtype), do, PREC)
        dpt = _mma(v, tl.trans(do), PREC)  # dPᵀ = V dOᵀ
        dst = pt * (dpt - delta[None, :])  # dSᵀ = Pᵀ ∘ (dPᵀ − D)
        dk += _mma(dst.to(q.dtype), q, PREC)
    return dk, dv


@triton.jit
def _dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dk_ptr, dv_ptr, sq, sk, H, G, qk_scale, sm_scale,
                 BUCKET, D: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
                 BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """One program: key tile ``program_id(0)`` of KV head ``program_id(1)``, over the G query heads that read it."""
    n0 = tl.program_id(0) * BN
    kv_bh = tl.program_id(1)
    rn = n0 + tl.arange(0, BN)
    rd = tl.arange(0, BD)
    kv_tile, kv_mask = _tile(rn, sk, rd, D, BD)
    kv_tile += kv_bh.to(tl.int64) * sk * D
    k = tl.load(k_ptr + kv_tile, mask=kv_mask, other=0.0)
    v = tl.load(v_ptr + kv_tile, mask=kv_mask, other=0.0)
    dk = tl.zeros((BN, BD), tl.float32)
    dv = tl.zeros((BN, BD), tl.float32)
    lo, full = _query_range(n0, sq, sk, BM, BN, CAUSAL)
    for g in range(G):
        bh = (kv_bh // (H // G)) * H + (kv_bh % (H // G)) * G + g
        q_off = bh.to(tl.int64) * sq * D
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptr + q_off, do_ptr + q_off, lse_ptr + bh * sq, delta_ptr + bh * sq,
                             rn, rd, lo, tl.minimum(full, sq), sq, sk, qk_scale, D, BD, BM, True, PREC)  # fmt: skip
        dk, dv = _dkdv_tiles(dk, dv, k, v, q_ptr + q_off, do_ptr + q_off, lse_ptr + bh * sq, delta_ptr + bh * sq,
                             rn, rd, full, sq, sq, sk, qk_scale, D, BD, BM, False, PREC)  # fmt: skip
    tl.store(dk_ptr + kv_tile, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(dv_ptr + kv_tile, dv.to(dv_ptr.dtype.element_ty), mask=kv_mask)


@triton.jit
def _dq_tiles(dq, q, do, lse, delta, k_ptr, v_ptr, rm, rd, lo, hi, sq, sk, qk_scale,
              D: tl.constexpr, BD: tl.constexpr, BN: tl.constexpr, MASK: tl.constexpr, CAUSAL: tl.constexpr,
              PREC: tl.constexpr):  # fmt: skip
    """dQ of one query tile from key tiles ``[lo, hi)``: ``dQ += dS K``."""
    for n0 in range(lo, hi, BN):
        rn = n0 + tl.arange(0, BN)
        kv_tile, kv_mask = _tile(rn, sk, rd, D, BD)
        k = tl.load(k_ptr + kv_tile, mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + kv_tile, mask=kv_mask, other=0.0)
        p = tl.math.exp2(_mma(q, tl.trans(k), PREC) * qk_scale - lse[:, None])
        if MASK:
            seen = rn[None, :] < sk
            if CAUSAL:
                seen = seen & (rn[None, :] <= rm[:, None] + (sk - sq))
            p = tl.where(seen, p, 0.0)
        ds = p * (_mma(do, tl.trans(v), PREC) - delta[:, None])  # dS = P ∘ (dO Vᵀ − D)
        dq += _mma(ds.to(k.dtype), k, PREC)
    return dq


@triton.jit
def _dq_kernel(q_ptr, k_ptr, v_ptr, do_ptr, lse_ptr, delta_ptr, dq_ptr, sq, sk, H, G, qk_scale, sm_scale, BUCKET,
               D: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, PREC: tl.constexpr,
               BM: tl.constexpr, BN: tl.constexpr):  # fmt: skip
    """One program: dQ of query tile ``program_id(0)`` of query head ``program_id(1)``; the forward's key range."""
    m0, bh, rm, rd, q_tile, kv_off, q_mask = _query_tile(sq, sk, H, G, D, BD, BM)
    q = tl.load(q_ptr + q_tile, mask=q_mask, other=0.0)
    do = tl.load(do_ptr + q_tile, mask=q_mask, other=0.0)
    lse = tl.load(lse_ptr + bh * sq + rm, mask=rm < sq, other=0.0) * _LOG2E
    delta = tl.load(delta_ptr + bh * sq + rm, mask=rm < sq, other=0.0)
    dq = tl.zeros((BM, BD), tl.float32)
    full, end = key_range(m0, sq, sk, BM, BN, CAUSAL)
    dq = _dq_tiles(dq, q, do, lse, delta, k_ptr + kv_off, v_ptr + kv_off, rm, rd, 0, full, sq, sk, qk_scale,
                   D, BD, BN, False, CAUSAL, PREC)  # fmt: skip
    dq = _dq_tiles(dq, q, do, lse, delta, k_ptr + kv_off, v_ptr + kv_off, rm, rd, full, end, sq, sk, qk_scale,
                   D, BD, BN, True, CAUSAL, PREC)  # fmt: skip
    tl.store(dq_ptr + q_tile, (dq * sm_scale).to(dq_ptr.dtype.element_ty), mask=q_mask)


_dkdv_tuned = _tuned(DKDV_CONFIGS, _dkdv_kernel)
_dq_tuned = _tuned(DQ_CONFIGS, _dq_kernel)


# ---- the Python side ----------------------------------------------------------------------------------------
def _check(q, k, v, causal, block):
    """Shapes, dtypes and devices; returns (group size, fixed tiles or None for autotuning)."""
    g = check_shapes(q, k, v, causal)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}")
    if q.dtype not in DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"q, k, v must share one dtype of {DTYPES}, got {q.dtype}, {k.dtype}, {v.dtype}")
    check_int("s_q (q.shape[2])", q.shape[2], 1)
    check_int("s_k (k.shape[2])", k.shape[2], 1)
    check_int("head_dim (q.shape[3])", q.shape[3], 1, 256)
    if not INTERPRETED and not (q.is_cuda and k.is_cuda and v.is_cuda):
        raise ValueError("q, k, v must be CUDA tensors when Triton compiles (TRITON_INTERPRET is not 1)")
    if block is not None:
        block = check_int("block", block, 16)
    elif INTERPRETED:
        block = INTERPRETED_TILE
    return g, block


def dot_precision(dtype: torch.dtype) -> str:
    """``_mma``'s PREC for inputs of ``dtype``: "ieee" for fp32, "tf32" (Triton's default: the tensor cores' MMA
    for half tiles) for bf16/fp16 when compiled, "upcast" for bf16/fp16 under the interpreter."""
    return "ieee" if dtype == torch.float32 else "upcast" if INTERPRETED else "tf32"


def _common(q, k, causal):
    """Launch arguments shared by the three kernels."""
    b, h, sq, d = q.shape
    scale = 1.0 / math.sqrt(d)
    return dict(
        sq=sq, sk=k.shape[2], H=h, G=h // k.shape[1], qk_scale=scale * 1.4426950408889634,
        BUCKET=triton.next_power_of_2(max(sq, k.shape[2])), D=d, BD=max(16, triton.next_power_of_2(d)),
        CAUSAL=causal, PREC=dot_precision(q.dtype),
    )  # fmt: skip


def flash_forward(q, k, v, *, causal: bool = False, block: int | None = None, count_tiles: bool = False):
    """FlashAttention's forward: ``(out, lse)``, ``out`` in q's dtype, ``lse [b, h, s_q]`` fp32 (natural log).

    ``block``: fixed ``block × block`` tiles (default: autotuned on a GPU, 16 under the interpreter).
    ``count_tiles``: also return an int32 ``[b·h, query tiles]`` tensor of the key tiles each program's loops
    visited (needs fixed tiles: ``block``, or the interpreter)."""
    _, block = _check(q, k, v, causal, block)
    if count_tiles and block is None:
        raise ValueError("count_tiles=True needs fixed tiles: pass block (an int >= 16)")
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    b, h, sq, _ = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(b, h, sq, dtype=torch.float32, device=q.device)
    counts = torch.zeros(b * h, triton.cdiv(sq, block), dtype=torch.int32, device=q.device) if count_tiles else None
    args = _common(q, k, causal)
    kernel, tiles = (_fwd_tuned, {}) if block is None else (_fwd_kernel, {"BM": block, "BN": block})
    grid = lambda meta: (triton.cdiv(sq, meta["BM"]), b * h)  # noqa: E731
    kernel[grid](q, k, v, out, lse, counts, COUNT=count_tiles, **args, **tiles)
    return (out, lse, counts) if count_tiles else (out, lse)


def flash_row_term(dout, out) -> torch.Tensor:
    """``D = rowsum(dO ∘ O)``: ``[..., s_q]`` fp32 for ``dout, out [..., s_q, d]`` (``attention.row_term`` in
    PyTorch), by ``_row_term_kernel``: each program sums about 8192 elements of each tensor, rows of ``d``."""
    if dout.shape != out.shape or dout.dim() < 2:
        raise ValueError(f"dout and out must have one shape [..., s_q, d], got {tuple(dout.shape)}, {tuple(out.shape)}")
    dout, out = dout.contiguous(), out.contiguous()
    d, n_rows = out.shape[-1], out.numel() // out.shape[-1]
    delta = torch.empty(out.shape[:-1], dtype=torch.float32, device=out.device)
    bd = max(16, triton.next_power_of_2(d))
    bm = INTERPRETED_TILE if INTERPRETED else max(16, 8192 // bd)
    _row_term_kernel[(triton.cdiv(n_rows, bm),)](out, dout, delta, n_rows, D=d, BD=bd, BM=bm)
    return delta


def flash_backward(dout, q, k, v, out, lse, *, causal: bool = False, block: int | None = None):
    """The three input gradients ``(dq, dk, dv)`` from the forward's ``out`` and ``lse``, in the inputs' dtype."""
    g, block = _check(q, k, v, causal, block)
    if dout.shape != q.shape or out.shape != q.shape or lse.shape != q.shape[:3]:
        raise ValueError(f"dout and out must be q's shape {tuple(q.shape)} and lse its first three dims")
    q, k, v, dout = (t.contiguous() for t in (q, k, v, dout))
    delta = flash_row_term(dout, out)
    b, h, sq, _ = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    args = _common(q, k, causal)
    tiles = {} if block is None else {"BM": block, "BN": block}
    dkdv = _dkdv_tuned if block is None else _dkdv_kernel
    dqk = _dq_tuned if block is None else _dq_kernel
    sm_scale = 1.0 / math.sqrt(q.shape[3])
    grid_k = lambda meta: (triton.cdiv(k.shape[2], meta["BN"]), b * k.shape[1])  # noqa: E731
    dkdv[grid_k](q, k, v, dout, lse, delta, dk, dv, sm_scale=sm_scale, **args, **tiles)
    grid_q = lambda meta: (triton.cdiv(sq, meta["BM"]), b * h)  # noqa: E731
    dqk[grid_q](q, k, v, dout, lse, delta, dq, sm_scale=sm_scale, **args, **tiles)
    return dq, dk, dv


class _FlashTriton(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, block):
        out, lse = flash_forward(q, k, v, causal=causal, block=block)
        ctx.save_for_backward(q, k, v, out, lse)  # O(s·d) and O(s): nothing s_q × s_k
        ctx.causal, ctx.block = causal, block
        return out

    @staticmethod
    def backward(ctx, dout):
        dq, dk, dv = flash_backward(dout, *ctx.saved_tensors, causal=ctx.causal, block=ctx.block)
        return dq, dk, dv, None, None


def flash_attention_triton(q, k, v, *, causal: bool = False, block: int | None = None):
    """``softmax(q kᵀ / sqrt(d)) v`` by the Triton kernels above, differentiable (``autograd.Function``): the
    same result as ``attention.flash_attention`` and SDPA (bottom-right causal, GQA, any lengths)."""
    return _FlashTriton.apply(q, k, v, causal, block)
