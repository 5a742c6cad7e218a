"""Context parallelism (CP): attention over a sequence split across ranks, in one readable file.

Each of the ``cp`` ranks holds ``s/cp`` tokens of every sequence: their queries, keys and values
(and every other activation of the layer, which is why CP divides activation memory by ``cp``).
Attention is the only operation that mixes tokens, so it is the only place ranks talk. Two ways:

**Ring attention** (Liu et al. 2023, arXiv:2310.01889): K/V blocks travel around the ring
``r → r+1``. At each of ``cp`` steps a rank posts the ``isend`` of the block it holds and the
``irecv`` of the next one, computes its queries against the block it holds *while the bytes
travel*, merges the partial result with the online softmax (log-sum-exp:
``lse = log(e^lse_a + e^lse_b)``, ``o = e^(lse_a−lse)·o_a + e^(lse_b−lse)·o_b``, Dao et al. 2022,
arXiv:2205.14135), then waits. It never holds more than two K/V blocks.

**All-gather KV** (Llama 3, Dubey et al. 2024, arXiv:2407.21783, Sec. 3.3.2): all-gather K and V
once, then attend locally. Same bytes, simpler, overlap harder, and each rank holds the whole
sequence's K/V (cheap with GQA: ``n_kv`` heads only).

    variant       forward                                  backward
    ring          (cp−1) × isend/irecv of the local K|V    (cp−1) × isend/irecv of K|V (overlapped)
                  (overlapped with block compute)          + cp × isend/irecv of the dK|dV accumulator
                                                           (after each block; it ends on its owner)
    all-gather    all_gather of K|V along the sequence     reduce_scatter of dK|dV along the sequence

Bytes per rank per layer, forward: ``(cp−1)·2·b·(s/cp)·n_kv·d`` elements either way.

**Causal masking and zig-zag.** With contiguous chunks (``layout="contiguous"``: rank r holds
``[r·s/cp, (r+1)·s/cp)``) the last rank's queries see every block and the first rank's only its own:
the work per rank grows as ``r+1``. ``layout="zigzag"`` cuts the sequence into ``2·cp`` chunks and
gives rank r chunks ``r`` and ``2cp−1−r``: every rank then computes ``2cp+1`` chunk-blocks (the
assignment of Llama 3's context parallelism, arXiv:2407.21783, Sec. 3.3.2; striped attention,
Brandon et al. 2023, arXiv:2311.09431, balances with a round-robin token assignment instead). Blocks
that the mask hides completely are skipped; ``stats["work"]`` counts the score entries each rank
really computed (query-key pairs, per sequence and head) and ``stats["compute_s"]`` the time it spent on them.

Tensors are ``[b, heads, s_local, d]``; K and V have ``n_kv`` heads (grouped-query attention:
``heads % n_kv == 0``; the blocks travel *unrepeated*). Positions of the local tokens:
``positions(seq_len, cp, rank, layout)``; ``shard_sequence`` cuts a full tensor the same way.
All collectives are ``torch.distributed`` functions looked up at call time (``CommCounter`` counts them);
the all-gather variant's is ``mlsys_nb.parallel.functional.gather_from`` along the sequence.

**Memory, measured.** ``LiveBytes`` measures what a call really holds: the bytes of the distinct
tensor storages created inside it that are alive at the same time (peak), every operation seen
through PyTorch's dispatcher and every storage followed until it is freed. How many K/V blocks
each variant holds (ring: the block in use and the one arriving; all-gather: all ``cp``) is a
*model*; ``kv_held_growth`` is the measurement that tests it (the ring's peak stays flat as
``cp`` grows at fixed local tokens, the all-gather's grows by at least one K/V block per rank).
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ..config import check_choice, check_divides, check_int, check_multiple, dtype_bytes
from ..kernels.attention import merge_partials  # the one online-softmax merge (FlashAttention)
from ..runtime.peak_memory import LiveBytes  # the meter of what a call holds (one home for the peak meters)
from ..runtime.timing import Timer
from .functional import gather_from

LAYOUTS = ("contiguous", "zigzag")
SEQ = 2  # [b, heads, s, d]


def check_cp_args(
    seq_len: int, cp: int, *, layout: str = "zigzag", n_heads: int | None = None, n_kv_heads: int | None = None
) -> None:
    """Raise ``ArgumentError`` (a ``ValueError``) naming the parameter (call before starting ranks)."""
    check_choice("layout", layout, LAYOUTS)
    check_int("cp", cp, 1)
    # zig-zag cuts the sequence into 2·cp chunks (rank r holds chunks r and 2cp-1-r), contiguous into cp
    if layout == "zigzag":
        check_multiple("seq_len", seq_len, 2 * cp, "2·cp")
    else:
        check_multiple("seq_len", seq_len, cp, "cp")
    if n_heads is not None and n_kv_heads is not None:
        check_divides("n_kv_heads", n_kv_heads, n_heads, "n_heads")


def pieces(seq_len: int, cp: int, rank: int, layout: str) -> list[tuple[int, int]]:
    """The [start, end) position ranges this rank holds, in local order."""
    if layout == "contiguous":
        c = seq_len // cp
        return [(rank * c, (rank + 1) * c)]
    c = seq_len // (2 * cp)
    return [(rank * c, (rank + 1) * c), ((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]


def positions(seq_len: int, cp: int, rank: int, layout: str = "zigzag") -> torch.Tensor:
    """Global positions of this rank's local tokens (a LongTensor of length s/cp)."""
    return torch.cat([torch.arange(a, b) for a, b in pieces(seq_len, cp, rank, layout)])


def shard_sequence(x: torch.Tensor, cp: int, rank: int, layout: str = "zigzag", dim: int = SEQ) -> torch.Tensor:
    """This rank's tokens of a full tensor ``x`` (sequence along ``dim``)."""
    check_cp_args(x.shape[dim], cp, layout=layout)
    return x.index_select(dim, positions(x.shape[dim], cp, rank, layout).to(x.device))


def _repeat_kv(x, group):
    return x if group == 1 else x.repeat_interleave(group, dim=1)


def _blocks(q_pieces, k_pieces, causal):
    """(q local slice, k local slice, masked?) for every block that is not entirely hidden."""
    out, qo = [], 0
    for qa, qb in q_pieces:
        ko = 0
        for ka, kb in k_pieces:
            if not (causal and ka >= qb):  # all keys after all queries: skip
                out.append((slice(qo, qo + qb - qa), slice(ko, ko + kb - ka), causal and kb > qa))
            ko += kb - ka
        qo += qb - qa
    return out


def _diag_mask(n, device):
    return torch.ones(n, n, dtype=torch.bool, device=device).tril()  # pieces are aligned: a diagonal block


def _block_forward(q, k, v, masked, scale):
    s = (q @ k.transpose(-2, -1)) * scale
    if masked:
        s = s.masked_fill(~_diag_mask(s.shape[-1], s.device), float("-inf"))
    lse = s.logsumexp(dim=-1)
    return torch.exp(s - lse.unsqueeze(-1)) @ v, lse


class RingExchange:
    """Post the ring exchange of ``buf``: send to rank+1, receive from rank−1 (no wait)."""

    def __init__(self, buf, group):
        r, n = dist.get_rank(group), dist.get_world_size(group)
        glob = (lambda i: i) if group is None else (lambda i: dist.get_global_rank(group, i))
        self.recv = torch.empty_like(buf)
        self.works = [
            dist.isend(buf.contiguous(), glob((r + 1) % n), group=group),
            dist.irecv(self.recv, glob((r - 1) % n), group=group),
        ]

    def wait(self):
        for w in self.works:
            w.wait()
        return self.recv


class RingAttention(torch.autograd.Function):
    """Ring attention's autograd function (``ring_attention`` calls it): forward circulates K|V blocks and
    merges each block's partial output by its log-sum-exp; backward circulates them again, with each
    block's dK|dV accumulator travelling beside it back to its owner."""

    @staticmethod
    def forward(ctx, q, k, v, causal, layout, seq_len, group, stats, overlap):
        r, n = dist.get_rank(group), dist.get_world_size(group)
        g, scale = q.shape[1] // k.shape[1], 1.0 / math.sqrt(q.shape[-1])
        mine = pieces(seq_len, n, r, layout)
        out = torch.zeros_like(q)
        lse = torch.full(q.shape[:-1], float("-inf"), dtype=q.dtype, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        work, compute, wait = 0.0, Timer(), Timer()
        for step in range(n):
            src = (r - step) % n
            ring = RingExchange(kv, group) if step < n - 1 else None  # next block travels during compute
            if ring is not None and not overlap:  # for comparison: wait for the bytes first
                with wait:
                    nxt = ring.wait()
            with compute:
                kk, vv = _repeat_kv(kv[0], g), _repeat_kv(kv[1], g)
                for qs, ks, masked in _blocks(mine, pieces(seq_len, n, src, layout), causal):
                    bo, bl = _block_forward(q[:, :, qs], kk[:, :, ks], vv[:, :, ks], masked, scale)
                    out[:, :, qs], lse[:, :, qs] = merge_partials(out[:, :, qs], lse[:, :, qs], bo, bl)
                    work += (qs.stop - qs.start) * (ks.stop - ks.start)
            if ring is not None:
                with wait:
                    kv = ring.wait() if overlap else nxt
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.layout, ctx.seq_len, ctx.group = causal, layout, seq_len, group
        if stats is not None:
            kv_bytes = k.numel() * k.element_size() * 2
            stats.update(work=work, compute_s=sum(compute.samples), wait_s=sum(wait.samples), kv_block_bytes=kv_bytes)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group, causal, layout, seq_len = ctx.group, ctx.causal, ctx.layout, ctx.seq_len
        r, n = dist.get_rank(group), dist.get_world_size(group)
        b, kvh, sk, d = k.shape
        g, scale = q.shape[1] // kvh, 1.0 / math.sqrt(d)
        mine = pieces(seq_len, n, r, layout)
        delta = (dout * out).sum(-1)  # D = rowsum(dO ∘ O)
        dq = torch.zeros_like(q)
        kv = torch.stack([k, v]).contiguous()
        dkv = torch.zeros_like(kv)  # the accumulator of the block's owner travels with the block
        for step in range(n):
            src = (r - step) % n
            ring = RingExchange(kv, group) if step < n - 1 else None
            kk, vv = _repeat_kv(kv[0], g), _repeat_kv(kv[1], g)
            dk_rep, dv_rep = torch.zeros_like(kk), torch.zeros_like(vv)
            for qs, ks, masked in _blocks(mine, pieces(seq_len, n, src, layout), causal):
                qb, kb, vb, dob = q[:, :, qs], kk[:, :, ks], vv[:, :, ks], dout[:, :, qs]
                s = (qb @ kb.transpose(-2, -1)) * scale
                if masked:
                    s = s.masked_fill(~_diag_mask(s.shape[-1], s.device), float("-inf"))
                p = torch.exp(s - lse[:, :, qs].unsqueeze(-1))
                dv_rep[:, :, ks] += p.transpose(-2, -1) @ dob
                ds = p * (dob @ vb.transpose(-2, -1) - delta[:, :, qs].unsqueeze(-1))
                dq[:, :, qs] += (ds @ kb) * scale
                dk_rep[:, :, ks] += (ds.transpose(-2, -1) @ qb) * scale
            dkv = dkv + torch.stack([dk_rep.view(b, kvh, g, sk, d).sum(2), dv_rep.view(b, kvh, g, sk, d).sum(2)])
            dkv = RingExchange(dkv, group).wait()  # pass the accumulator on; after the last step it is home
            if ring is not None:
                kv = ring.wait()
        return dq, dkv[0], dkv[1], None, None, None, None, None, None


def ring_attention(
    q,
    k,
    v,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    seq_len: int | None = None,
    group=None,
    stats: dict | None = None,
    overlap: bool = True,
):
    """Attention of this rank's queries over the whole sequence, K/V circulating on a ring.

    q [b, heads, s/cp, d], k and v [b, n_kv, s/cp, d]: this rank's tokens in ``layout`` order
    (``shard_sequence``). Returns [b, heads, s/cp, d] (differentiable). ``stats`` (a dict) is
    filled with the work (score entries computed), compute and wait seconds and the bytes of this
    rank's K|V block (``kv_block_bytes``; what it holds is measured with ``LiveBytes``).
    ``overlap=False`` waits for each next block before computing on the current one (the same
    result, to measure what the overlap hides)."""
    n = dist.get_world_size(group)
    seq_len = seq_len or q.shape[SEQ] * n
    check_cp_args(seq_len, n, layout=layout, n_heads=q.shape[1], n_kv_heads=k.shape[1])
    return RingAttention.apply(q, k, v, causal, layout, seq_len, group, stats, overlap)


def allgather_attention(
    q,
    k,
    v,
    *,
    causal: bool = True,
    layout: str = "zigzag",
    seq_len: int | None = None,
    group=None,
    stats: dict | None = None,
):
    """The all-gather-KV variant (Llama 3): gather K|V of every rank, attend locally with the mask
    built from global positions. Same arguments and result as ``ring_attention``."""
    r, n = dist.get_rank(group), dist.get_world_size(group)
    seq_len = seq_len or q.shape[SEQ] * n
    check_cp_args(seq_len, n, layout=layout, n_heads=q.shape[1], n_kv_heads=k.shape[1])
    kv = gather_from(torch.cat([k, v], dim=1), SEQ, group)  # one message: K and V heads side by side
    kf, vf = kv.split(k.shape[1], dim=1)
    g = q.shape[1] // k.shape[1]
    qpos = positions(seq_len, n, r, layout).to(q.device)
    kpos = torch.cat([positions(seq_len, n, j, layout) for j in range(n)]).to(q.device)
    mask = (qpos[:, None] >= kpos[None, :]) if causal else None
    with Timer() as t:
        y = F.scaled_dot_product_attention(q, _repeat_kv(kf, g), _repeat_kv(vf, g), attn_mask=mask)
    if stats is not None:
        kv_bytes = k.numel() * k.element_size() * 2
        stats.update(work=q.shape[SEQ] * seq_len, compute_s=t.seconds, kv_block_bytes=kv_bytes)
    return y


def full_attention(q, k, v, *, causal: bool = True):
    """The unsharded reference: PyTorch's SDPA on the whole sequence (K/V heads repeated for GQA)."""
    g = q.shape[1] // k.shape[1]
    return F.scaled_dot_product_attention(q, _repeat_kv(k, g), _repeat_kv(v, g), is_causal=causal)


def causal_work(seq_len: int, cp: int, layout: str) -> list[int]:
    """Score entries each rank computes with causal masking when fully hidden blocks are skipped
    (the closed form of ``stats["work"]``): contiguous ``(r+1)·c²`` with ``c = s/cp``; zig-zag
    ``(2cp+1)·c²`` with ``c = s/(2cp)`` on every rank."""
    if layout == "contiguous":
        c = seq_len // cp
        return [(r + 1) * c * c for r in range(cp)]
    c = seq_len // (2 * cp)
    return [(2 * cp + 1) * c * c] * cp


def ring_bytes_per_layer(b: int, seq_len: int, cp: int, n_kv_heads: int, head_dim: int, dtype="bf16") -> dict:
    """Bytes one rank sends per attention layer on the ring: forward ``(cp−1)`` K|V blocks; backward
    ``(cp−1)`` K|V blocks + ``cp`` dK|dV accumulators. A K|V block is ``2·b·(s/cp)·n_kv·d`` elements."""
    blk = 2 * b * seq_len // cp * n_kv_heads * head_dim * dtype_bytes(dtype)
    return {"forward": (cp - 1) * blk, "backward": (2 * cp - 1) * blk, "kv_block": blk}


def nested_groups(sizes) -> dict:
    """``{cp: process group}``: for each ``cp`` in ``sizes`` (each dividing the world size), this
    rank's group among the consecutive blocks of ``cp`` ranks (the world itself for ``cp`` = world
    size). Every rank must call it with the same ``sizes`` (``new_group`` is collective)."""
    r, n = dist.get_rank(), dist.get_world_size()
    out = {}
    for cp in sorted(set(sizes)):
        check_divides("each cp of sizes", cp, n, "world_size")
        if cp == n:
            out[cp] = None
            continue
        for start in range(0, n, cp):
            g = dist.new_group(list(range(start, start + cp)))
            if start <= r < start + cp:
                out[cp] = g
    return out


def cp_peak_bytes(fn, q, k, v, *, group=None, **kwargs) -> int:
    """Measured peak bytes (``LiveBytes``) that one forward of ``fn`` (``ring_attention`` or
    ``allgather_attention``, no autograd graph) holds on this rank beyond its inputs."""
    with torch.no_grad(), LiveBytes() as lb:
        y = fn(q, k, v, group=group, **kwargs)
        del y
    return lb.peak


def kv_held_growth(fn, q, k, v, groups: dict, **kwargs) -> dict:
    """Measured: ``{cp: cp_peak_bytes(...) on groups[cp]}`` for the same local q, k, v (this
    rank's ``s_local`` tokens) in groups of ``cp`` ranks, so the peaks differ only by what the
    variant holds because more ranks take part. ``groups``: cp -> the process group of that size
    this rank belongs to (call on every rank of every group). Divide the differences by
    ``2·k.numel()·k.element_size()`` (one K|V block) to count blocks."""
    out = {}
    for cp, g in sorted(groups.items()):
        seq_len = q.shape[SEQ] * cp
        out[cp] = cp_peak_bytes(fn, q, k, v, group=g, seq_len=seq_len, **kwargs)
    return out
