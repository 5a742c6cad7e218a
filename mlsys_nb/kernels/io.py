"""What FlashAttention saves, counted and measured: HBM bytes of a tiled forward, and peak memory.

- ``IOCounter``: an instrumented slow memory ("HBM"). An algorithm written against it calls
  ``io.load(t)`` for every block it brings into fast memory ("SRAM") and ``io.store(dst, idx, t)`` for
  every block it writes back; the counter adds the real ``numel × element_size`` of each, so the
  totals are a count of what the code moved, not a formula.
- ``naive_forward_io``: standard attention as the paper's Algorithm 0: ``S = QKᵀ`` written to HBM,
  read back for ``P = softmax(S)``, written, read back for ``O = PV``: Θ(s·d + s²) bytes.
- ``flash_forward_io``: FlashAttention's Algorithm 1 (Dao et al. 2022, arXiv:2205.14135): block sizes
  from the SRAM size ``M`` (in elements) as the paper chooses them, ``B_c = ceil(M / 4d)``,
  ``B_r = min(B_c, d)``; the outer loop over K/V blocks, the inner over Q blocks, which reload
  ``Q_i``, ``O_i`` and the row statistics every time: Θ(s²·d²/M) bytes (the paper's Theorem 2).
- ``peak_forward_bytes(fn, *args)``: the peak live bytes while ``fn(*args)`` runs, read from the
  profiler's memory timeline (``runtime.peak_memory``, the home of the kit's peak-memory meters).
"""

from __future__ import annotations

import math

import torch

from ..config import check_int
from ..runtime.peak_memory import peak_forward_bytes  # re-exported: notebook 21 and the tests read it here
from .attention import merge_partials, tile_partial

__all__ = [
    "IOCounter",
    "paper_block_sizes",
    "naive_forward_io",
    "flash_forward_io",
    "flash_io_bytes",
    "score_matrix_bytes",
    "peak_forward_bytes",
]


class IOCounter:
    """Bytes moved between slow memory (HBM) and fast memory (SRAM): ``read`` and ``written`` (bytes)."""

    def __init__(self):
        self.read = 0
        self.written = 0

    def load(self, t: torch.Tensor) -> torch.Tensor:
        """Bring ``t`` into fast memory: counts its bytes as read and returns a copy."""
        self.read += t.numel() * t.element_size()
        return t.clone()

    def store(self, dst: torch.Tensor, idx, t: torch.Tensor) -> None:
        """Write ``t`` to ``dst[idx]`` in slow memory: counts its bytes as written."""
        dst[idx] = t
        self.written += t.numel() * t.element_size()

    @property
    def total(self) -> int:
        """Bytes read plus bytes written."""
        return self.read + self.written


def paper_block_sizes(sram_elements: int, head_dim: int) -> tuple[int, int]:
    """FlashAttention's block sizes for an SRAM of ``sram_elements`` elements (Algorithm 1, line 1):
    ``(B_r, B_c) = (min(ceil(M / 4d), d), ceil(M / 4d))``: a Q, K, V and O block of ``B × d`` each fit in ``M``."""
    m = check_int("sram_elements", sram_elements, 4)
    d = check_int("head_dim", head_dim, 1)
    bc = math.ceil(m / (4 * d))
    return min(bc, d), bc


def _check_2d(q, k, v):
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 2:
            raise ValueError(f"{name} must be a 2-d tensor [seq, head_dim] (one head), got {tuple(t.shape)}")


def naive_forward_io(q, k, v, io: IOCounter) -> torch.Tensor:
    """Standard attention of one head (``[s, d]`` tensors) with every intermediate in slow memory."""
    _check_2d(q, k, v)
    s_mat = torch.empty(q.shape[0], k.shape[0], dtype=q.dtype)
    io.store(s_mat, slice(None), io.load(q) @ io.load(k).T / math.sqrt(q.shape[1]))
    p_mat = torch.empty_like(s_mat)
    io.store(p_mat, slice(None), torch.softmax(io.load(s_mat), dim=-1))
    out = torch.empty_like(q)
    io.store(out, slice(None), io.load(p_mat) @ io.load(v))
    return out


def flash_forward_io(q, k, v, io: IOCounter, *, sram_elements: int) -> torch.Tensor:
    """FlashAttention's forward of one head (``[s, d]`` tensors) in the paper's loop order, every block
    moved through ``io``; the online softmax is ``attention.merge_partials`` in log-sum-exp form."""
    _check_2d(q, k, v)
    br, bc = paper_block_sizes(sram_elements, q.shape[1])
    s, scale = q.shape[0], 1.0 / math.sqrt(q.shape[1])
    out = torch.zeros_like(q)
    lse = torch.full((s,), float("-inf"), dtype=q.dtype)
    io.store(out, slice(None), out.clone())  # line 2: O and the statistics initialised in HBM
    io.store(lse, slice(None), lse.clone())
    for ka in range(0, k.shape[0], bc):
        ks = slice(ka, ka + bc)
        kj, vj = io.load(k[ks]), io.load(v[ks])
        for qa in range(0, s, br):
            qs = slice(qa, qa + br)
            qi, oi, li = io.load(q[qs]), io.load(out[qs]), io.load(lse[qs])
            oi, li = merge_partials(oi, li, *tile_partial(qi, kj, vj, scale))
            io.store(out, qs, oi)
            io.store(lse, qs, li)
    return out


def flash_io_bytes(seq: int, head_dim: int, sram_elements: int, *, elem_bytes: float = 4) -> float:
    """Bytes ``flash_forward_io`` moves for one head of ``seq`` tokens (a formula pinned by the count in
    tests): ``O`` and ``lse`` initialised (``s·(d+1)``), K and V read once (``2·s·d``), and for each of the
    ``T_c = ceil(s / B_c)`` key blocks every query block's ``Q_i``, ``O_i``, ``lse_i`` read and ``O_i``,
    ``lse_i`` written (``s·(3d+2)``). For ``B_c << s`` this is ``≈ 12·s²·d²/M`` elements: Θ(s²d²/M)."""
    s, d = check_int("seq", seq, 1), check_int("head_dim", head_dim, 1)
    _, bc = paper_block_sizes(sram_elements, d)
    t_c = math.ceil(s / bc)
    return float(elem_bytes * (s * (d + 1) + 2 * s * d + t_c * s * (3 * d + 2)))


def score_matrix_bytes(batch: int, heads: int, s_q: int, s_k: int, *, elem_bytes: float = 4) -> float:
    """Bytes of the ``[batch, heads, s_q, s_k]`` score (or probability) matrix that standard attention
    materialises and FlashAttention never does (it keeps ``batch·heads·s_q`` log-sum-exp values instead)."""
    for name, v in (("batch", batch), ("heads", heads), ("s_q", s_q), ("s_k", s_k)):
        check_int(name, v, 1)
    return float(batch * heads * s_q * s_k * elem_bytes)
