"""The paged KV cache itself: K/V tensors in fixed-size blocks, read and written through block tables.

The idea is PagedAttention's (Kwon et al., 2023, arXiv:2309.06180, §4): instead of reserving
``max_seq_len`` contiguous slots per request, the cache is a pool of ``num_blocks`` blocks of
``block_size`` token slots; each sequence owns a *block table* (logical block i -> physical block id)
and attention gathers K/V through it. A sequence wastes at most ``block_size - 1`` slots (its last,
partly filled block) instead of ``max_seq_len - len``.

Four files, each readable on its own (this one re-exports the names of the other three):

- ``block_manager.py``: ``BlockManager``, bookkeeping only (no tensors, no torch): the free list, block
  tables, reference counts, copy-on-write and hash-chained prefix caching (a block is a prefix-cache hit
  only after ``mark_computed``).
- ``paged_kernels.py``: ``paged_attention(q, k_cache, v_cache, block_tables, context_lens)`` and its tiled
  and varlen-decode variants.
- ``quant/kv.py``: ``quantize_kv`` / ``dequantize_kv``, KIVI's int8/fp8 codes and scales; the bytes per block
  (scales included) are ``kv_cache.kv_block_bytes``.
- here: ``PagedKVCache``, K/V tensors ``[n_layers, num_blocks, block_size, n_kv_heads, head_dim]`` plus a
  ``BlockManager``, implementing the cache protocol of ``mlsys_nb.inference.kv_cache`` (``plan``,
  ``begin``, ``attend``, ``commit``): in every layer the package's ``Transformer`` calls
  ``cache.attend(layer, q, k, v)``, which writes the new K/V into their slots and returns
  ``paged_attention`` over the whole context; and ``allocate_kv_cache``, the engine's pool sized from a
  memory budget.

A quantized pool (``dtype="int8"`` or ``"fp8"``, e4m3) follows KIVI (Liu et al., 2024, arXiv:2402.02750): K per
channel per block, V per token (``quant/kv.py`` says why). The K of a block stays in an fp32 *residual* (a side
pool of ``residual_blocks`` blocks, K only) until the block is full and its tokens are computed
(``BlockManager.mark_computed``, after any speculative rollback), then the block is quantized per channel once,
from exact values. A block written whole in one forward (a prefill chunk) is quantized directly; a speculative
verify chunk always goes through the residual, since a rollback (``BlockManager.truncate``) may un-fill the
block. Copy-on-write copies the residual with the block, swap carries it, freeing a block returns its residual,
prefix-cache hits are full (quantized) blocks. The manager calls nothing back: the cache learns which blocks
became computed or free from the manager's event log (``sync``). ``read`` dequantizes a layer's pool and puts
the residual blocks' exact K over their codes.

Errors name the value and the limit, and a failing call changes nothing (the tests run
``check_invariants()`` after every failing call).
"""

from __future__ import annotations

import math

import torch

from ..config import check_int, torch_dtype
from ..quant.kv import KV_QUANT_DTYPES, KV_RESIDUAL_DTYPE, KV_SCALE_DTYPE, dequantize_kv, quantize_kv
from .block_manager import NO_HASH, BlockManager, OutOfBlocksError, block_hash, fragmentation
from .kv_cache import kv_block_bytes, kv_residual_blocks, kv_residual_bytes
from .paged_kernels import (
    VARLEN_CHUNK_TOKENS,
    paged_attention,
    paged_attention_tiled,
    paged_decode_attention_varlen,
    varlen_decode_chunks,
)

__all__ = [  # the cache's own names, then what the package's front pages document from here
    "PagedKVCache",
    "allocate_kv_cache",
    "index_view",
    "BlockManager",
    "KV_QUANT_DTYPES",
    "NO_HASH",
    "OutOfBlocksError",
    "VARLEN_CHUNK_TOKENS",
    "block_hash",
    "dequantize_kv",
    "fragmentation",
    "kv_block_bytes",
    "kv_residual_blocks",
    "kv_residual_bytes",
    "paged_attention",
    "paged_attention_tiled",
    "paged_decode_attention_varlen",
    "quantize_kv",
    "varlen_decode_chunks",
]


def index_view(t: torch.Tensor) -> torch.Tensor:
    """A same-storage view that CPU indexing kernels accept (fp8 has no index_copy_ on CPU: view as uint8)."""
    return t.view(torch.uint8) if t.dtype == torch.float8_e4m3fn else t


class PagedKVCache:
    """K/V of a ``Transformer`` in blocks; implements the cache protocol of ``mlsys_nb.inference.kv_cache``
    (``plan``, ``begin``, ``attend``, ``commit``), so ``model(tokens, cache=cache)`` works unchanged.

    Unlike the contiguous ``KVCache``, the paged cache knows each sequence's token ids (the block
    manager hashes them for prefix caching), so tokens are registered before the forward that
    computes them, and ``commit`` (after the forward) marks the computed blocks as prefix-cache hits:

    - ``n_cached = cache.add_sequence(seq_id, prompt_ids)``: blocks for the prompt; the first
      ``n_cached`` tokens (whole blocks found in the prefix cache) need no compute. Then
      ``cache.plan([seq_id])`` and ``model(tensor([prompt_ids[n_cached:]]), cache=cache)``.
    - per decode step: ``cache.append_tokens({seq_id: token, ...})`` (may copy a shared last block),
      ``cache.plan(seq_ids)`` and ``model(tokens[:, None], cache=cache)``.
    - ``cache.fork(parent, child)`` (shares all blocks), ``cache.free(seq_id)`` at the end.

    Without ``plan``, the rows of the next forward are the sequences with uncomputed tokens, in the
    order they were added. ``plan(seq_ids, n_new)`` may compute fewer tokens than are pending
    (chunked prefill) and mixes prefill chunks with decodes (rows padded to the longest).
    A block becomes a prefix-cache hit only after the forward that computed it, so a sequence added
    before that forward computes the shared prefix itself.

    ``k``, ``v``: [n_layers, num_blocks, block_size, n_kv_heads, head_dim]; ``dtype``: "fp32", "bf16",
    "fp16" or a ``torch.dtype`` (default: the model's parameters' dtype, fp32 for a ``ModelConfig``), or
    "int8" / "fp8" (e4m3): then ``k``/``v`` hold codes, ``k_scale`` [n_layers, num_blocks, n_kv_heads,
    head_dim] K's per-channel scales, ``v_scale`` [n_layers, num_blocks, block_size, n_kv_heads] V's
    per-token scales, and ``k_res`` [n_layers, residual_blocks, block_size, n_kv_heads, head_dim] the fp32
    K of the blocks not yet quantized (``res_of``: block id -> residual slot; module docstring).
    ``residual_blocks`` (default ``num_blocks``, always enough; the engine sizes it with
    ``kv_residual_blocks``). Every write goes through ``write``, every read through ``read``, and every
    copy of blocks (copy-on-write, swap) through ``tensors()`` plus ``get_residual``/``set_residual``,
    so the scales and residuals travel with their codes."""

    def __init__(
        self,
        model,
        *,
        num_blocks: int,
        block_size: int = 16,
        dtype=None,
        device=None,
        prefix_caching: bool = True,
        max_seq_len: int | None = None,
        residual_blocks: int | None = None,
    ):
        cfg = getattr(model, "cfg", model)  # a Transformer or its ModelConfig
        if dtype is None and isinstance(model, torch.nn.Module):
            p = next(model.parameters())
            dtype, device = p.dtype, device or p.device
        if max_seq_len is not None:
            check_int(f"max_seq_len (cfg.seq_len={cfg.seq_len})", max_seq_len, 1, cfg.seq_len)
        self.cfg, self.block_size = cfg, block_size
        self.attention_backend = "gather"  # or "tiled" (paged_attention_tiled); the engine sets EngineConfig's
        self.compile_attention = False  # EngineConfig.compile: "flex" decodes run FlexAttention's fused kernel
        self.quant = dtype if isinstance(dtype, str) and dtype in KV_QUANT_DTYPES else None
        self.manager = BlockManager(  # a quantized pool reads the manager's events (``sync``)
            num_blocks,
            block_size,
            prefix_caching=prefix_caching,
            max_seq_len=max_seq_len or cfg.seq_len,
            record_events=bool(self.quant),
        )
        shape = (cfg.n_layers, num_blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        store = KV_QUANT_DTYPES[self.quant] if self.quant else torch.float32 if dtype is None else torch_dtype(dtype)
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros_like(self.k)
        n_res = 0
        if self.quant:
            n_res = check_int("residual_blocks", num_blocks if residual_blocks is None else residual_blocks, 1)
            n_res = min(n_res, num_blocks)  # never more blocks not yet quantized than blocks
        self.k_scale = (
            torch.zeros(shape[:2] + shape[3:], dtype=KV_SCALE_DTYPE, device=device) if self.quant else None
        )  # K: per (block, head, channel)
        self.v_scale = torch.zeros(shape[:-1], dtype=KV_SCALE_DTYPE, device=device) if self.quant else None
        self.k_res = torch.zeros(shape[:1] + (n_res,) + shape[2:], dtype=KV_RESIDUAL_DTYPE, device=device)
        self._res_of: dict[int, int] = {}  # block id -> residual slot (its K in full precision, not yet quantized)
        self.res_free = list(range(n_res - 1, -1, -1))
        self._res_index = None  # (block ids, residual slots) as tensors, for ``read``; None when stale
        self._write_plan = None
        self.auto_sync = True  # read the manager's events before touching the residual (``sync``)
        self.computed: dict[object, int] = {}  # tokens of each sequence whose K/V are in the cache
        self._planned = None
        self._step = None

    @property
    def nbytes(self) -> int:
        """Bytes of the pool: K and V codes plus, for a quantized pool, their scales and the K residual."""
        return sum(t.nbytes for t in self.tensors()) + self.k_res.nbytes

    def tensors(self) -> list[torch.Tensor]:
        """Every per-block tensor of the pool ([n_layers, num_blocks, ...]): K, V and (quantized) their
        scales, as views CPU indexing accepts. Copying blocks means copying the same rows of each."""
        extra = [self.k_scale, self.v_scale] if self.quant else []
        return [index_view(self.k), index_view(self.v)] + extra

    def copy_blocks(self, src, dst) -> None:
        """Copy block ``src`` to ``dst`` in every layer (codes, scales and, if it has one, its K residual)."""
        for t in self.tensors():
            t[:, dst] = t[:, src]
        if self.quant and src in self.res_of:
            self.set_residual(dst, self.get_residual(src))

    # ---- the K residual (quantized pools): full-precision K of blocks not yet quantized -------------
    @property
    def res_of(self) -> dict[int, int]:
        """Block id -> residual slot of the blocks whose K is still in full precision (as of the last ``sync``)."""
        self._auto_sync()
        return self._res_of

    def sync(self) -> None:
        """Catch up with the block manager (``BlockManager.take_events``), in order: the blocks a sequence has
        full of computed tokens are quantized out of the residual, a freed block gives its residual slot back.

        With ``auto_sync`` (the default) every method that reads or changes the residual (``read``, ``write``,
        ``get_residual``, ``set_residual``, ``copy_blocks``, ``res_of``) calls it first, so whoever calls the
        manager directly (a scheduler, a speculative rollback) needs no extra step. An engine that frees blocks
        before it copies them out (swap) or schedules on another thread sets ``auto_sync = False`` and calls
        ``sync()`` at points of its own."""
        for kind, blocks in self.manager.take_events():
            if kind == "computed":
                self._seal(blocks)
            else:
                for b in blocks:
                    self._release_residual(b)

    def _auto_sync(self) -> None:
        if self.auto_sync:
            self.sync()

    def get_residual(self, block: int) -> torch.Tensor | None:
        """A copy of ``block``'s full-precision K [n_layers, block_size, n_kv_heads, head_dim], or None."""
        self._auto_sync()
        r = self._res_of.get(block)
        return None if r is None else self.k_res[:, r].clone()

    def set_residual(self, block: int, k: torch.Tensor | None = None) -> None:
        """Give ``block`` a residual holding ``k`` (default: its dequantized codes, so a reopened block keeps
        its tokens)."""
        self._auto_sync()
        if block not in self._res_of:
            if not self.res_free:
                raise RuntimeError(
                    f"the K residual is full: residual_blocks={self.k_res.shape[1]} blocks are all in use "
                    "(size it for the running sequences: paged.kv_residual_blocks)"
                )
            self._res_of[block] = self.res_free.pop()
            self._res_index = None
        if k is None:
            k = dequantize_kv(self.k[:, block], self.k_scale[:, block], KV_RESIDUAL_DTYPE, dim=1)
        self.k_res[:, self._res_of[block]] = k.to(self.k_res.device, KV_RESIDUAL_DTYPE)

    def _release_residual(self, block: int) -> None:
        r = self._res_of.pop(block, None)
        if r is not None:
            self.res_free.append(r)
            self._res_index = None

    def _seal(self, blocks) -> None:
        """Quantize per channel (once, from exact values) every block of ``blocks`` (full of computed tokens)
        still in the residual; their residual slots go back."""
        full = [b for b in blocks if b in self._res_of]
        if not full:
            return
        res = torch.tensor([self._res_of[b] for b in full], device=self.k.device)
        blocks = torch.tensor(full, device=self.k.device)
        codes, scales = quantize_kv(self.k_res[:, res], self.quant, dim=2)  # [L, n, bs, H, d]: over the tokens
        index_view(self.k)[:, blocks] = index_view(codes)
        self.k_scale[:, blocks] = scales
        for b in full:
            self._release_residual(b)

    def _plan_write(self, slots: torch.Tensor, tentative) -> tuple:
        """Where K of one write goes (the same for every layer): blocks the write fills whole, none of it
        tentative, are quantized directly ((block ids, token indices [n, block_size])); every other token
        goes to its block's residual ((token indices, flat residual slots)), which is opened if needed."""
        bs = self.block_size
        tent = [False] * len(slots) if tentative is None else [bool(t) for t in tentative]
        by_block: dict[int, dict[int, int]] = {}
        for i, sl in enumerate(slots.tolist()):
            b, o = divmod(sl, bs)
            by_block.setdefault(b, {})[o] = i  # a repeated slot (padding) keeps its last token
        direct_b, direct_i, res_i, res_s = [], [], [], []
        for b, offs in by_block.items():
            if b not in self._res_of and len(offs) == bs and not any(tent[i] for i in offs.values()):
                direct_b.append(b)
                direct_i.append([offs[o] for o in range(bs)])
                continue
            if b not in self._res_of:
                self.set_residual(b)
            res_i += offs.values()
            res_s += [self._res_of[b] * bs + o for o in offs]
        dev = self.k.device
        return (
            slots,
            torch.tensor(direct_b, dtype=torch.long, device=dev),
            torch.tensor(direct_i, dtype=torch.long, device=dev).view(-1, bs),
            torch.tensor(res_i, dtype=torch.long, device=dev),
            torch.tensor(res_s, dtype=torch.long, device=dev),
        )

    def write(
        self, layer_idx: int, slots: torch.Tensor, k_new: torch.Tensor, v_new: torch.Tensor, tentative=None
    ) -> None:
        """Store ``k_new``, ``v_new`` [T, n_kv_heads, head_dim] at flat slot indices ``slots`` [T] of one layer.

        An "int8"/"fp8" pool quantizes V per token, and K per channel for the blocks this write fills whole,
        else keeps K in the residual until its block is full and computed (module docstring). ``tentative``
        [T] (bool): tokens a rollback may remove (a speculative verify chunk); their blocks stay in the
        residual. The plan is made once per step: layer 0, or new ``slots``."""
        n_kv, d = self.k.shape[-2], self.k.shape[-1]
        if not self.quant:
            for pool, x in ((self.k, k_new), (self.v, v_new)):
                pool[layer_idx].view(-1, n_kv, d).index_copy_(0, slots, x.to(pool.dtype))
            return
        self._auto_sync()
        codes, s = quantize_kv(v_new, self.quant)
        index_view(self.v[layer_idx]).view(-1, n_kv, d).index_copy_(0, slots, index_view(codes))
        self.v_scale[layer_idx].view(-1, n_kv).index_copy_(0, slots, s)
        if layer_idx == 0 or self._write_plan is None or self._write_plan[0] is not slots:
            self._write_plan = self._plan_write(slots, tentative)
        _, direct_b, direct_i, res_i, res_s = self._write_plan
        if len(direct_b):
            codes, s = quantize_kv(k_new[direct_i], self.quant, dim=1)  # [n, bs, H, d]: per channel
            index_view(self.k[layer_idx])[direct_b] = index_view(codes)
            self.k_scale[layer_idx][direct_b] = s
        if len(res_i):
            self.k_res[layer_idx].view(-1, n_kv, d).index_copy_(0, res_s, k_new[res_i].to(KV_RESIDUAL_DTYPE))

    def read(self, layer_idx: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """One layer's K and V pools [num_blocks, block_size, n_kv_heads, head_dim] in ``dtype`` (dequantized;
        the residual blocks' K exact)."""
        if self.quant:
            self._auto_sync()
            k = dequantize_kv(self.k[layer_idx], self.k_scale[layer_idx], dtype, dim=1)
            if self._res_of:
                if self._res_index is None:
                    dev = self.k.device
                    self._res_index = (
                        torch.tensor(list(self._res_of), device=dev),
                        torch.tensor(list(self._res_of.values()), device=dev),
                    )
                blocks, res = self._res_index
                k[blocks] = self.k_res[layer_idx, res].to(dtype)
            return k, dequantize_kv(self.v[layer_idx], self.v_scale[layer_idx], dtype)
        return self.k[layer_idx].to(dtype), self.v[layer_idx].to(dtype)

    @property
    def lengths(self) -> dict:
        """Cached (computed) tokens per sequence: ``{seq_id: n}``."""
        return dict(self.computed)

    def pending(self, seq_id) -> int:
        """Tokens of ``seq_id`` registered but not yet computed by a forward."""
        return self.manager.num_tokens(seq_id) - self.computed[seq_id]

    # ---- sequence management -------------------------------------------------------------------
    def add_sequence(self, seq_id, token_ids) -> int:
        """Allocate blocks for a prompt; return how many leading tokens already have K/V (prefix cache)."""
        n = self.manager.allocate(seq_id, token_ids)
        self.computed[seq_id] = n
        return n

    def append_tokens(self, tokens: dict) -> None:
        """One new token per sequence (``{seq_id: token_id}``) ahead of a decode step; copies on write."""
        for sid, tok in tokens.items():
            copy = self.manager.append_token(sid, int(tok))
            if copy is not None:
                self.copy_blocks(*copy)

    def fork(self, parent_id, child_id) -> None:
        """``child_id`` continues ``parent_id`` (same tokens, same blocks, nothing copied yet)."""
        if self.pending(parent_id):
            raise ValueError(
                f"fork of seq_id={parent_id!r} with {self.pending(parent_id)} uncomputed tokens: run the forward first"
            )
        self.manager.fork(parent_id, child_id)
        self.computed[child_id] = self.computed[parent_id]

    def free(self, seq_id) -> None:
        self.manager.free_seq(seq_id)
        del self.computed[seq_id]

    def reset(self, seq_ids=None) -> None:
        """Free sequences (all by default)."""
        for sid in list(self.computed) if seq_ids is None else list(seq_ids):
            self.free(sid)

    # ---- the protocol the model calls ----------------------------------------------------------
    def plan(self, seq_ids=None, n_new=None) -> None:
        """Row i of the next forward is ``seq_ids[i]`` with ``n_new[i]`` new tokens (default: all pending)."""
        ids = None if seq_ids is None else list(seq_ids)
        if ids is not None:
            for sid in ids:
                self.manager._seq(sid)
            if len(set(ids)) != len(ids):
                raise ValueError(f"seq_ids {ids} repeat a sequence: each row needs its own")
        n = None if n_new is None else [int(x) for x in (n_new.tolist() if torch.is_tensor(n_new) else n_new)]
        if ids is not None and n is not None and len(ids) != len(n):
            raise ValueError(f"seq_ids has {len(ids)} entries but n_new has {len(n)}")
        self._planned = (ids, n)

    def begin(self, b: int, s: int) -> torch.Tensor:
        ids, n = self._planned or (None, None)
        self._planned, self._step = None, None
        if ids is None:
            ids = [sid for sid in self.computed if self.pending(sid)]
        if n is None:
            n = [self.pending(sid) for sid in ids]
        if len(ids) != b or len(n) != b:
            waiting = [x for x in self.computed if self.pending(x)]
            raise ValueError(
                f"the batch has {b} rows but the plan has {len(ids)} sequences / {len(n)} new-token "
                f"counts (sequences with uncomputed tokens: {waiting})"
            )
        for sid, cnt in zip(ids, n):
            check_int(
                f"n_new of seq_id={sid!r} (min(s={s}, uncomputed tokens={self.pending(sid)}))",
                cnt,
                1,
                min(s, self.pending(sid)),
            )

        bs = self.block_size
        start = [self.computed[sid] for sid in ids]
        slots = [
            self.manager.seqs[sid].table[p // bs] * bs + p % bs
            for sid, lo, cnt in zip(ids, start, n)
            for p in range(lo, lo + cnt)
        ]
        tables = [self.manager.seqs[sid].table for sid in ids]
        width = max(map(len, tables))
        dev = self.k.device
        start_t = torch.tensor(start, dtype=torch.long)
        n_t = torch.tensor(n, dtype=torch.long)
        valid = torch.arange(s)[None, :] < n_t[:, None]  # [b, s]: which row positions are real tokens
        self._step = {
            "ids": ids,
            "n": n,
            "slots": torch.tensor(slots, dtype=torch.long, device=dev),
            "valid": None if bool(valid.all()) else valid.to(dev),
            "tables": torch.tensor([t + [0] * (width - len(t)) for t in tables], dtype=torch.long, device=dev),
            "lens": (start_t + s).to(dev),  # query j of row i sits at start_i + j (padding: beyond, ignored)
        }
        return start_t[:, None] + torch.minimum(torch.arange(s)[None, :], n_t[:, None] - 1)

    def attend(self, layer_idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        st = self._step
        if st is None:
            raise RuntimeError("cache.attend called outside a step: the model calls cache.begin first")
        n_kv, d = k.shape[1], k.shape[3]
        k_new, v_new = k.transpose(1, 2), v.transpose(1, 2)  # [b, s, n_kv, d]
        if st["valid"] is not None:
            k_new, v_new = k_new[st["valid"]], v_new[st["valid"]]
        # write the new tokens into their slots (the flat view of this layer's pool), then attend
        self.write(layer_idx, st["slots"], k_new.reshape(-1, n_kv, d), v_new.reshape(-1, n_kv, d))
        kc, vc = self.read(layer_idx, q.dtype)
        return paged_attention(q, kc, vc, st["tables"], st["lens"])

    def commit(self) -> None:
        if self._step is None:
            raise RuntimeError("cache.commit called without cache.begin")
        for sid, cnt in zip(self._step["ids"], self._step["n"]):
            self.computed[sid] += cnt
            self.manager.mark_computed(sid, self.computed[sid])
        self._step = None

    def __repr__(self):
        return (
            f"PagedKVCache(num_blocks={self.manager.num_blocks}, block_size={self.block_size}, "
            f"free={self.manager.num_free_blocks()}, sequences={len(self.computed)}, "
            f"{self.nbytes / 2**20:.2f} MiB{', ' + self.quant if self.quant else ''})"
        )


def allocate_kv_cache(cfg, config, dtype, device) -> PagedKVCache:
    """The engine's paged pool for a model of ``cfg`` under ``config`` (an ``EngineConfig``; nano-vllm's
    ``allocate_kv_cache``). ``dtype``: the model's parameter dtype, used when ``kv_cache_dtype="auto"``.

    ``num_blocks=None``: as many blocks of ``kv_block_bytes`` as ``kv_cache_memory`` bytes hold, capped at
    ``max_num_seqs`` sequences of the full context; an int8/fp8 pool first takes its fp32 K residual
    (``kv_residual_blocks``, more with speculation) out of that budget. The context (``max_seq_len``) is
    ``min(cfg.seq_len, num_blocks · block_size)`` tokens, so one sequence alone always fits."""
    c, block_size = config, config.block_size
    kv_dtype = dtype if c.kv_cache_dtype == "auto" else c.kv_cache_dtype
    spec_k = c.num_speculative_tokens if c.speculative_model is not None else 0
    residual = kv_residual_blocks(c.max_num_seqs, block_size, spec_k) if kv_dtype in KV_QUANT_DTYPES else None
    memory = c.kv_cache_memory - (kv_residual_bytes(cfg, block_size, residual) if residual else 0)
    num_blocks = c.num_blocks
    if num_blocks is None:  # from the memory budget, capped at max_num_seqs full-length sequences
        full = c.max_num_seqs * math.ceil(cfg.seq_len / block_size)
        num_blocks = max(1, min(memory // kv_block_bytes(cfg, block_size, kv_dtype), full))
    left = f", {memory} after the K residual's {c.kv_cache_memory - memory}" if residual else ""
    check_int(f"num_blocks (from kv_cache_memory={c.kv_cache_memory} bytes{left})", num_blocks, 2)
    kv = PagedKVCache(
        cfg,
        num_blocks=num_blocks,
        block_size=block_size,
        dtype=kv_dtype,
        device=device,
        prefix_caching=c.enable_prefix_caching,
        max_seq_len=min(cfg.seq_len, num_blocks * block_size),
        residual_blocks=residual,
    )
    kv.attention_backend, kv.compile_attention = c.attention_backend, c.compile
    return kv
