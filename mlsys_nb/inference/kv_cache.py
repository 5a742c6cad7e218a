"""The KV cache: a protocol the model talks to, a contiguous implementation, and its size.

Why a cache: in a decoder, token t attends to the keys and values of tokens 0..t. Without a cache,
generating the next token recomputes K and V for the whole prefix (O(t) work per token and O(t²)
per sequence); with one, each step computes q, k, v for the NEW tokens only and reads the old K/V.

The protocol (``Transformer.forward(tokens, cache=cache)`` relies on exactly these four calls)
-----------------------------------------------------------------------------------------------
A cache holds several sequences, numbered ``0 .. n_seqs-1`` (the contiguous cache: rows of
preallocated tensors; the paged cache: block tables). ``cache.lengths`` is an int64 tensor
[n_seqs] of tokens cached per sequence. One forward step works on a batch ``tokens`` [b, s]:

``cache.plan(seq_ids=None, n_new=None) -> None``  (called by the CALLER, optional, before forward)
    Row i of the next batch belongs to sequence ``seq_ids[i]`` and carries ``n_new[i]`` new tokens
    (1 <= n_new[i] <= s) left-aligned in the row; positions ``j >= n_new[i]`` are padding. This is
    how one step mixes a chunk of one prompt (n_new = 64) with decodes of others (n_new = 1).
    Without ``plan``, row i is sequence i and every row carries s new tokens. Raises ValueError
    (naming the sequence, its length, the capacity) if a sequence would outgrow its capacity.
``cache.begin(b, s) -> positions``  (called by the MODEL once per forward, before layer 0)
    Validates the plan against the batch shape and returns int64 positions [b, s]: the absolute
    position of each new token, ``lengths[seq_ids[i]] + j`` (padding repeats the last valid one).
    The model rotates q and k with RoPE at these positions. A new ``begin`` discards a step that
    was begun but never committed (e.g. a forward that raised): nothing of it is visible.
``cache.attend(layer_idx, q, k, v) -> y``  (called by the MODEL in every layer)
    q [b, n_heads, s, head_dim], k and v [b, n_kv_heads, s, head_dim], already rotated. Stores k, v
    of the valid new tokens of layer ``layer_idx`` at positions ``lengths[seq] + j`` and returns
    y [b, n_heads, s, head_dim]: new query j of row i attends to cached positions
    ``0 .. lengths[seq_ids[i]] + j`` of its own sequence (causal; GQA: query head h reads KV head
    h // (n_heads / n_kv_heads)). Outputs at padding positions are finite and meaningless.
``cache.commit() -> None``  (called by the MODEL after the last layer)
    ``lengths[seq_ids] += n_new``; the plan is cleared (the next step defaults again).

Plus, for whoever owns the cache: ``reset(seq_ids=None)`` (forget sequences: length 0).
The caller reads the logits of row i at position ``n_new[i] - 1`` to sample its next token.

Sizes (units: bytes, tokens)
----------------------------
``kv_cache_bytes(model, tokens, dtype)``: K and V of every layer,
2 · n_layers · n_kv_heads · head_dim · bytes · tokens (Pope et al., 2022, arXiv:2211.05102, §2;
GQA: Ainslie et al., 2023, arXiv:2305.13245). DeepSeek's multi-head latent attention caches one
compressed latent and one shared RoPE key per token and layer: (kv_lora_rank + rope_head_dim) ·
n_layers · bytes · tokens (DeepSeek-AI, 2024, arXiv:2405.04434, §2.1.4 and Table 1).
``kv_block_bytes(model, block_size, dtype)``: one block of a paged pool, int8/fp8 with their scales (the
engine's pool and the inference widget both use it); ``kv_residual_bytes``, ``kv_residual_blocks``: the exact K
a quantized pool keeps for blocks not yet full.
``max_concurrent_sequences(model, gpu, seq_len, ...)``: how many full-length sequences fit in the
GPU memory left after the weights.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..config import DTYPE_BYTES, as_model_config, check_int, check_probability, dtype_bytes, torch_dtype


if TYPE_CHECKING:  # torch is imported where a cache is built: the size formulas run without it
    import torch

__all__ = [
    "DTYPE_BYTES",
    "GPU_MEMORY_UTILIZATION",
    "KVCache",
    "KV_QUANT_KINDS",
    "kv_block_bytes",
    "kv_bytes_per_token",
    "kv_cache_bytes",
    "kv_residual_blocks",
    "kv_residual_bytes",
    "max_concurrent_sequences",
    "weight_bytes",
]


def _torch_dtype(dtype):
    import torch

    return torch.float32 if dtype is None else torch_dtype(dtype)


# ---- sizes ---------------------------------------------------------------------------------------
def kv_bytes_per_token(model, dtype="bf16") -> float:
    """Bytes cached per token over all layers (K and V; MLA: latent + shared RoPE key)."""
    cfg = as_model_config(model)
    b = dtype_bytes(dtype)
    if cfg.kv_lora_rank:  # MLA (DeepSeek-V2/V3)
        return (cfg.kv_lora_rank + cfg.rope_head_dim) * cfg.n_layers * b
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * b


def kv_cache_bytes(model, tokens: int, dtype="bf16") -> int:
    """Bytes to cache ``tokens`` tokens (summed over sequences), all layers, K and V.

    ``model``: preset name, ``ModelConfig`` or ``Transformer``; ``dtype``: a name in ``DTYPE_BYTES``
    or a ``torch.dtype``. MHA/GQA/MQA: 2·L·n_kv_heads·head_dim·bytes·tokens; MLA:
    (kv_lora_rank + rope_head_dim)·L·bytes·tokens."""
    check_int("tokens", tokens, 0)
    return math.ceil(kv_bytes_per_token(model, dtype) * tokens)


KV_QUANT_KINDS = ("int8", "fp8")  # quantized paged pools (quant.kv, KIVI's scheme): 1-byte codes plus scales
KV_SCALE = "fp32"  # their scales: K one per (block, KV head, channel), V one per (token, KV head)
KV_RESIDUAL = "fp32"  # the exact K of a quantized pool's blocks not yet full and computed (the residual)
GPU_MEMORY_UTILIZATION = 0.9  # the share of GPU memory for weights + KV cache (vLLM's default)


def kv_block_bytes(model, block_size: int, dtype="bf16") -> int:
    """Bytes of one block of a paged KV pool (``block_size`` tokens, all layers, K and V): the one formula the
    engine sizes its pool with (``paged.allocate_kv_cache``) and the inference widget shows.

    Unquantized: ``block_size · kv_bytes_per_token`` (2 · n_layers · block_size · n_kv_heads · head_dim · bytes
    per value). "int8"/"fp8" (``KV_QUANT_KINDS``, ``quant.kv``): ``n_layers · n_kv_heads · (block_size · head_dim
    + 4 · head_dim)`` for K (1-byte codes, one fp32 scale per channel) plus ``n_layers · n_kv_heads · block_size ·
    (head_dim + 4)`` for V (codes, one fp32 scale per token); the residual's bytes are ``kv_residual_bytes``.
    ``dtype``: a name in ``DTYPE_BYTES`` or a ``torch.dtype``."""
    cfg = as_model_config(model)
    check_int("block_size", block_size, 1)
    if not (isinstance(dtype, str) and dtype in KV_QUANT_KINDS):
        return math.ceil(block_size * kv_bytes_per_token(cfg, dtype))
    if cfg.kv_lora_rank:
        raise ValueError(f"dtype={dtype!r}: quantized KV pools are for MHA/GQA/MQA, not MLA (kv_lora_rank > 0)")
    L, H, d = cfg.n_layers, cfg.n_kv_heads, cfg.head_dim
    nb, sb = dtype_bytes(dtype), dtype_bytes(KV_SCALE)
    return L * H * (block_size * d * nb + d * sb) + L * H * block_size * (d * nb + sb)


def kv_residual_bytes(model, block_size: int, residual_blocks: int) -> int:
    """Bytes of a quantized pool's exact K residual: ``residual_blocks · n_layers · block_size · n_kv_heads ·
    head_dim · 4`` (fp32)."""
    cfg = as_model_config(model)
    return residual_blocks * cfg.n_layers * block_size * cfg.n_kv_heads * cfg.head_dim * dtype_bytes(KV_RESIDUAL)


def kv_residual_blocks(max_num_seqs: int, block_size: int, num_speculative_tokens: int = 0) -> int:
    """Residual blocks an engine needs: per running sequence its partly filled last block, plus the one a
    prefill chunk or decode may start (2), or with speculation the blocks a verify chunk of k+1 tokens
    touches beyond its first (``ceil((k + 1) / block_size)``) if that is more."""
    extra = max(1, math.ceil((num_speculative_tokens + 1) / block_size)) if num_speculative_tokens else 1
    return max_num_seqs * (1 + extra)


def weight_bytes(model, dtype="bf16") -> float:
    """Bytes of all parameters (a tied head once) at ``dtype``."""
    from ..memory import param_count

    return int(param_count(as_model_config(model))) * dtype_bytes(dtype)


def max_concurrent_sequences(
    model,
    gpu,
    seq_len: int,
    *,
    dtype="bf16",
    weight_dtype="bf16",
    tp: int = 1,
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
) -> int:
    """Full-length sequences of ``seq_len`` tokens whose KV cache fits next to the weights.

    Per GPU: budget = gpu_memory_utilization · memory_bytes − weight_bytes / tp; each sequence
    needs kv_cache_bytes(seq_len) / tp (TP shards the KV heads; MLA's latent is replicated, so it is
    not divided, and with tp > n_kv_heads the KV heads are replicated). Activations and the CUDA
    context are ignored (vLLM's profiling run measures them; this is a model). 0 when the weights
    do not fit. ``gpu``: a name in data/hardware.yaml or a ``mlsys_nb.hardware.GPU``."""
    from .. import hardware

    cfg = as_model_config(model)
    g = hardware.gpu(gpu) if isinstance(gpu, str) else gpu
    check_int("seq_len", seq_len, 1)
    check_int("tp", tp, 1)
    check_probability("gpu_memory_utilization", gpu_memory_utilization, lo_open=True)
    budget = gpu_memory_utilization * g.memory_bytes - weight_bytes(cfg, weight_dtype) / tp
    if budget <= 0:
        return 0
    kv_shards = 1 if cfg.kv_lora_rank else min(tp, cfg.n_kv_heads)
    per_seq = kv_cache_bytes(cfg, seq_len, dtype) / kv_shards
    return int(budget // per_seq)


TP_CHOICES = (1, 2, 4, 8, 16, 32, 64)  # the tensor-parallel degrees ``min_tp_that_fits`` tries


def min_tp_that_fits(
    model,
    gpu,
    seq_len: int,
    *,
    batch: int = 1,
    dtype="bf16",
    weight_dtype="bf16",
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION,
    tp_choices=TP_CHOICES,
) -> int | None:
    """The smallest TP degree in ``tp_choices`` at which ``batch`` sequences of ``seq_len`` tokens
    fit beside the weights on each GPU (``max_concurrent_sequences``), or ``None`` if none does."""
    check_int("batch", batch, 1)
    for tp in tp_choices:
        n = max_concurrent_sequences(
            model,
            gpu,
            seq_len,
            dtype=dtype,
            weight_dtype=weight_dtype,
            tp=tp,
            gpu_memory_utilization=gpu_memory_utilization,
        )
        if n >= batch:
            return tp
    return None


# ---- the contiguous cache ------------------------------------------------------------------------
class KVCache:
    """Contiguous KV cache: ``n_seqs`` sequences × ``max_len`` slots preallocated per layer.

    ``k``, ``v``: tensors [n_layers, n_seqs, n_kv_heads, max_len, head_dim] (zeros at start);
    ``lengths``: int64 [n_seqs]. Implements the protocol in the module docstring. Reserving
    max_len for every sequence is what paging avoids (``mlsys_nb.inference.paged``).

    ``model``: a ``Transformer`` (dtype and device taken from its parameters) or a ``ModelConfig``.
    """

    def __init__(self, model, n_seqs: int, max_len: int | None = None, *, dtype=None, device=None):
        import torch

        cfg = as_model_config(model)
        if dtype is None and isinstance(model, torch.nn.Module):
            p = next(model.parameters())
            dtype, device = p.dtype, device or p.device
        max_len = cfg.seq_len if max_len is None else max_len
        check_int("n_seqs", n_seqs, 1)
        check_int(f"max_len (cfg.seq_len={cfg.seq_len})", max_len, 1, cfg.seq_len)
        self.cfg, self.n_seqs, self.max_len = cfg, n_seqs, max_len
        shape = (cfg.n_layers, n_seqs, cfg.n_kv_heads, max_len, cfg.head_dim)
        self.k = torch.zeros(shape, dtype=_torch_dtype(dtype), device=device)
        self.v = torch.zeros_like(self.k)
        self.lengths = torch.zeros(n_seqs, dtype=torch.long)
        self._planned = None  # (seq_ids, n_new) from plan()
        self._step = None  # (seq_ids, n_new, start, b, s) between begin() and commit()

    @property
    def nbytes(self) -> int:
        """Bytes held by the K and V tensors (what ``kv_cache_bytes(cfg, n_seqs*max_len)`` predicts)."""
        return self.k.nbytes + self.v.nbytes

    def reset(self, seq_ids=None) -> None:
        """Forget sequences (all by default): their length becomes 0, their slots are reused."""
        if seq_ids is None:
            self.lengths.zero_()
        else:
            self.lengths[self._ids(seq_ids)] = 0

    def _ids(self, seq_ids) -> torch.Tensor:
        import torch

        ids = torch.as_tensor(seq_ids, dtype=torch.long).reshape(-1)
        for i in ids.tolist():
            check_int(f"each of seq_ids (n_seqs={self.n_seqs})", i, 0, self.n_seqs - 1)
        if ids.unique().numel() != ids.numel():
            raise ValueError(f"seq_ids {ids.tolist()} repeat a sequence: each row needs its own")
        return ids

    # -- protocol ------------------------------------------------------------------------------
    def plan(self, seq_ids=None, n_new=None) -> None:
        """Row i of the next forward is sequence ``seq_ids[i]`` with ``n_new[i]`` new tokens."""
        import torch

        ids = None if seq_ids is None else self._ids(seq_ids)
        n = None if n_new is None else torch.as_tensor(n_new, dtype=torch.long).reshape(-1)
        if ids is not None and n is not None and ids.numel() != n.numel():
            raise ValueError(f"seq_ids has {ids.numel()} entries but n_new has {n.numel()}")
        self._planned = (ids, n)

    def begin(self, b: int, s: int) -> torch.Tensor:
        import torch

        ids, n = self._planned or (None, None)
        self._planned, self._step = None, None
        planned_n = n is not None
        ids = torch.arange(b) if ids is None else ids
        n = torch.full((b,), s, dtype=torch.long) if n is None else n
        if ids.numel() != b or n.numel() != b:
            raise ValueError(
                f"the batch has {b} rows but the plan has {ids.numel()} sequences / {n.numel()} new-token counts"
            )
        if b > self.n_seqs:
            raise ValueError(f"batch of {b} rows exceeds n_seqs={self.n_seqs}")
        for i in n.tolist() if planned_n else [s]:  # unplanned: s new tokens in every row, one check
            check_int(f"each of n_new (s={s} new tokens per row)", i, 1, s)
        start = self.lengths[ids]
        over = (start + n) > self.max_len
        if over.any():
            i = int(over.nonzero()[0])
            raise ValueError(
                f"sequence {int(ids[i])} has {int(start[i])} cached tokens + {int(n[i])} new > max_len={self.max_len}"
            )
        self._step = (ids, n, start, b, s)
        j = torch.arange(s)
        return start[:, None] + torch.minimum(j[None, :], n[:, None] - 1)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        import torch
        import torch.nn.functional as F

        if self._step is None:
            raise RuntimeError("cache.attend called outside a step: the model calls cache.begin first")
        ids, n, start, b, s = self._step
        kc, vc = self.k[layer_idx], self.v[layer_idx]
        # append the valid new tokens (row i, j < n_new[i]) at positions lengths[seq] + j, in one scatter
        row, j = (torch.arange(s)[None, :] < n[:, None]).nonzero(as_tuple=True)
        dev = kc.device
        seq, pos = ids[row].to(dev), (start[row] + j).to(dev)
        kc[seq, :, pos] = k[row.to(k.device), :, j.to(k.device)].to(kc.dtype)
        vc[seq, :, pos] = v[row.to(v.device), :, j.to(v.device)].to(vc.dtype)
        t = int((start + n).max())
        if torch.equal(ids, torch.arange(b)):  # rows 0..b-1: a view, no copy
            keys, values = kc[:b, :, :t], vc[:b, :, :t]
        else:
            keys, values = kc[ids, :, :t], vc[ids, :, :t]
        keys, values = keys.to(q.dtype), values.to(q.dtype)
        group = q.shape[1] // keys.shape[1]
        if group > 1:
            keys, values = keys.repeat_interleave(group, dim=1), values.repeat_interleave(group, dim=1)
        q_pos = start[:, None] + torch.arange(s)[None, :]  # [b, s] absolute position of each query
        mask = torch.arange(t)[None, None, :] <= q_pos[:, :, None]  # [b, s, t]: causal over the cache
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask[:, None].to(q.device))

    def commit(self) -> None:
        if self._step is None:
            raise RuntimeError("cache.commit called without cache.begin")
        ids, n = self._step[0], self._step[1]
        self.lengths[ids] += n
        self._step = None

    def __repr__(self):
        return (
            f"KVCache(n_seqs={self.n_seqs}, max_len={self.max_len}, dtype={self.k.dtype}, "
            f"lengths={self.lengths.tolist()}, {self.nbytes / 2**20:.2f} MiB)"
        )
