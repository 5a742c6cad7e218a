"""Tensor and sequence parallelism, Megatron-LM style, in one readable file.

Every rank of the tensor-parallel (TP) group of size ``t`` holds a slice of each weight matrix and
the ranks talk only through four small autograd functions (Shoeybi et al. 2019, Korthikanti et al.
2022), the TP/SP names of the differentiable collectives in ``mlsys_nb.parallel.functional``. The
communication in forward *and* backward is written out below:

    operator                    forward                   backward                  where
    copy_to_tp            (f)   identity                  all-reduce                entering a TP region
    reduce_from_tp        (g)   all-reduce                identity                  leaving a TP region
    gather_from_sp              all-gather along s        reduce-scatter along s    entering, with SP
    reduce_scatter_to_sp        reduce-scatter along s    all-gather along s        leaving, with SP

``f`` and ``g`` are *conjugate*: each is the other's transpose, so a column-parallel layer (weight
split by output features, input replicated) followed by a row-parallel layer (weight split by input
features) needs exactly one all-reduce in forward and one in backward. With sequence parallelism
(SP) the activations between TP regions (norms, dropout, residual) are split along the sequence
and each all-reduce becomes a reduce-scatter plus an all-gather (same bytes, t-times smaller
activations).

Building blocks: ``ColumnParallelLinear``, ``RowParallelLinear``, ``TPMLP`` (SwiGLU/GELU/ReLU),
``TPAttention`` (heads split across ranks, grouped-query attention with ``n_kv_heads % t == 0``),
``VocabParallelEmbedding``, ``vocab_parallel_cross_entropy`` (its autograd function:
``VocabParallelCE``) and ``TPTransformer``, the TP version
of ``mlsys_nb.models.Transformer`` (same function: RoPE, GQA, tied or untied head). Every module
loads its weights from the *full* model's state dict by slicing (``load_full_state_dict``).
``module.shard_map()`` says which slice of which full tensor each local tensor is: full name ->
``(parameter, rows, dim)`` (``rows``: the part of a fused weight such as q|k|v, or None; ``dim``:
the dimension of the full tensor split across ranks, or None if replicated).
``compare_with_full`` uses it to compare weights or gradients with an unsharded model.

Under SP, parameters that see only this rank's tokens (norm weights, row-parallel biases) need their
gradients summed over the group after backward: ``sync_sequence_parallel_grads(model)``. Dropout
(``cfg.dropout > 0``) runs with each rank's own RNG: fine for training and memory accounting, but
not bit-equal to the single-process model (Megatron keeps separate RNG streams for that).

All collectives go through ``torch.distributed`` functions looked up at call time, so
``mlsys_nb.comm.counting.CommCounter`` sees (and counts the bytes of) every message. The code
assumes an initialised process group (``mlsys_nb.launch``); ``group=None`` means the world group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..comm.cost import bytes_sent_per_rank
from ..config import ModelConfig, dtype_bytes
from ..models.transformer import apply_rope, attention_core, build_norm, rope_tables
from .functional import (
    all_gather,
    all_reduce,
    copy_to,
    gather_from,
    gather_replicated,
    reduce_from,
    reduce_scatter,
    reduce_scatter_to,
    shard,
)

SEQ_DIM = 1  # activations are [batch, seq, hidden]

__all__ = [
    "ColumnParallelLinear",
    "GatherLinear",
    "RowParallelLinear",
    "SEQ_DIM",
    "TPAttention",
    "TPBlock",
    "TPMLP",
    "TPTransformer",
    "VocabParallelCE",
    "VocabParallelEmbedding",
    "compare_with_full",
    "copy_to_tp",
    "enter_tp",
    "exit_tp",
    "gather_from_sp",
    "gather_from_tp",
    "load_full_state_dict",
    "reduce_from_tp",
    "reduce_scatter_to_sp",
    "shard",
    "sync_sequence_parallel_grads",
    "tp_bytes_per_layer",
    "tp_rank",
    "tp_size",
    "vocab_parallel_cross_entropy",
]


# ---------------------------------------------------------------------------------------------
# 0. Small helpers: group size and rank (slicing and the collectives: ``mlsys_nb.parallel.functional``)
# ---------------------------------------------------------------------------------------------
def tp_size(group=None) -> int:
    return dist.get_world_size(group)


def tp_rank(group=None) -> int:
    return dist.get_rank(group)


# ---------------------------------------------------------------------------------------------
# 1. The conjugate operators, by their TP/SP names (the autograd functions: ``functional``)
# ---------------------------------------------------------------------------------------------
def copy_to_tp(x, group=None):
    """f (``functional.copy_to``): identity forward, all-reduce backward."""
    return copy_to(x, group)


def reduce_from_tp(x, group=None):
    """g (``functional.reduce_from``): all-reduce forward, identity backward."""
    return reduce_from(x, group)


def gather_from_sp(x, group=None):
    """SP entry: all-gather along the sequence forward, reduce-scatter backward."""
    return gather_from(x, SEQ_DIM, group)


def reduce_scatter_to_sp(x, group=None):
    """SP exit: reduce-scatter along the sequence forward, all-gather backward."""
    return reduce_scatter_to(x, SEQ_DIM, group)


def gather_from_tp(x, group=None):
    """Concatenate a column-sharded output along the last dim; backward keeps this rank's slice."""
    return gather_replicated(x, -1, group)


def enter_tp(x, sequence_parallel: bool, group=None):
    """Replicated (or sequence-sharded with SP) activation -> full input of a TP region."""
    return gather_from_sp(x, group) if sequence_parallel else copy_to_tp(x, group)


def exit_tp(y, sequence_parallel: bool, group=None):
    """Partial sums from a row-parallel matmul -> replicated (or sequence-sharded) activation."""
    return reduce_scatter_to_sp(y, group) if sequence_parallel else reduce_from_tp(y, group)


class GatherLinear(torch.autograd.Function):
    """SP all-gather fused with the column-parallel matmul, as Megatron-LM does it.

    Saving only the local sequence shard (not the gathered input) keeps *every* activation of a
    layer divided by t (Korthikanti et al. 2022, Sec. 4.2.2); the price is a second all-gather in
    backward to rebuild the input for the weight gradient. ``regather=False`` saves the gathered
    input instead (no extra communication, ``t`` times more memory for this tensor)."""

    @staticmethod
    def forward(ctx, x, weight, bias, group, regather):
        full = all_gather(x, SEQ_DIM, group)
        ctx.group, ctx.regather, ctx.has_bias = group, regather, bias is not None
        ctx.save_for_backward(x if regather else full, weight)
        return F.linear(full, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        saved, weight = ctx.saved_tensors
        full = all_gather(saved, SEQ_DIM, ctx.group) if ctx.regather else saved
        dx = reduce_scatter(dy @ weight, SEQ_DIM, ctx.group)
        dw = dy.reshape(-1, dy.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        db = dy.reshape(-1, dy.shape[-1]).sum(0) if ctx.has_bias else None
        return dx, dw, db, None, None


# ---------------------------------------------------------------------------------------------
# 2. Parallel linear layers
# ---------------------------------------------------------------------------------------------
def _mark_sequence_parallel(p: nn.Parameter) -> nn.Parameter:
    """A replicated parameter that, under SP, sees only this rank's tokens: its gradient is a
    partial sum and must be all-reduced over the TP group (``sync_sequence_parallel_grads``)."""
    p.sequence_parallel = True
    return p


class ColumnParallelLinear(nn.Module):
    """``Y = X Wᵀ`` with W split by output features: rank r holds rows ``W[r·o/t:(r+1)·o/t]``.

    Input replicated (or sequence-sharded with SP), output sharded on the last dim. ``enter=False``
    skips the region entry (the caller already applied ``enter_tp`` once for several linears)."""

    def __init__(
        self,
        in_features,
        out_features,
        *,
        bias=False,
        sequence_parallel=False,
        gather_output=False,
        enter=True,
        regather=True,
        group=None,
    ):
        super().__init__()
        t = tp_size(group)
        if out_features % t:
            raise ValueError(f"out_features={out_features} must be divisible by tp={t}")
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel, self.gather_output, self.enter = sequence_parallel, gather_output, enter
        self.regather, self.group = regather, group
        self.weight = nn.Parameter(torch.empty(out_features // t, in_features))
        self.bias = nn.Parameter(torch.zeros(out_features // t)) if bias else None
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        if self.enter and self.sequence_parallel:
            y = GatherLinear.apply(x, self.weight, self.bias, self.group, self.regather)
        else:
            y = F.linear(copy_to_tp(x, self.group) if self.enter else x, self.weight, self.bias)
        return gather_from_tp(y, self.group) if self.gather_output else y

    def shard_map(self, prefix=""):
        m = {prefix + "weight": (self.weight, None, 0)}
        if self.bias is not None:
            m[prefix + "bias"] = (self.bias, None, 0)
        return m


class RowParallelLinear(nn.Module):
    """``Y = Σ_r X_r W_rᵀ`` with W split by input features: rank r holds columns
    ``W[:, r·i/t:(r+1)·i/t]`` and a column slice of the input; the sum is ``exit_tp`` (all-reduce,
    or reduce-scatter along the sequence with SP). The bias is added once, after the sum."""

    def __init__(self, in_features, out_features, *, bias=False, sequence_parallel=False, group=None):
        super().__init__()
        t = tp_size(group)
        if in_features % t:
            raise ValueError(f"in_features={in_features} must be divisible by tp={t}")
        self.in_features, self.out_features = in_features, out_features
        self.sequence_parallel, self.group = sequence_parallel, group
        self.weight = nn.Parameter(torch.empty(out_features, in_features // t))
        self.bias = nn.Parameter(torch.zeros(out_features)) if bias else None
        if self.bias is not None and sequence_parallel:
            _mark_sequence_parallel(self.bias)
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, x):
        y = exit_tp(F.linear(x, self.weight), self.sequence_parallel, self.group)
        return y + self.bias if self.bias is not None else y

    def shard_map(self, prefix=""):
        m = {prefix + "weight": (self.weight, None, 1)}
        if self.bias is not None:
            m[prefix + "bias"] = (self.bias, None, None)
        return m


# ---------------------------------------------------------------------------------------------
# 3. Megatron MLP and attention
# ---------------------------------------------------------------------------------------------
def _enter_exit_pair(cfg: ModelConfig, fused_out: int, inner: int, sequence_parallel, regather, group):
    """Megatron's pair around a TP region: a column-parallel ``cfg.hidden -> fused_out`` linear (the
    ``enter_tp``; several projections fused into one matmul) and a row-parallel ``inner -> cfg.hidden`` linear
    (the ``exit_tp``), both with ``cfg.bias``. Returns ``(column, row)``."""
    column = ColumnParallelLinear(
        cfg.hidden, fused_out, bias=cfg.bias, sequence_parallel=sequence_parallel, regather=regather, group=group
    )
    row = RowParallelLinear(inner, cfg.hidden, bias=cfg.bias, sequence_parallel=sequence_parallel, group=group)
    return column, row


def _fused_shard_map(linear: ColumnParallelLinear, names: list[str], sizes: list[int], prefix: str) -> dict:
    """The shard map of a fused (concatenated) column-parallel ``linear``, e.g. q | k | v: its local rows
    hold the parts ``names`` of ``sizes`` rows each, and each part is this rank's slice of a separate full
    tensor ``{prefix}{name}.weight`` (and ``.bias``). Returns full name -> (local tensor, its rows, dim 0)."""
    m, start = {}, 0
    for name, n in zip(names, sizes):
        rows = slice(start, start + n)
        start += n
        m[f"{prefix}{name}.weight"] = (linear.weight, rows, 0)
        if linear.bias is not None:
            m[f"{prefix}{name}.bias"] = (linear.bias, rows, 0)
    return m


class TPMLP(nn.Module):
    """Column-parallel up (and gate, fused into one matmul for SwiGLU), local activation,
    row-parallel down: one ``enter_tp`` and one ``exit_tp`` per MLP."""

    def __init__(self, cfg: ModelConfig, *, sequence_parallel=False, regather=True, group=None):
        super().__init__()
        t = tp_size(group)
        if cfg.ffn_hidden % t:
            raise ValueError(f"ffn_hidden={cfg.ffn_hidden} must be divisible by tp={t}")
        self.cfg, self.group, self.ffn_local = cfg, group, cfg.ffn_hidden // t
        n_in = 2 if cfg.activation == "swiglu" else 1  # gate and up share one gathered input
        self.fc1, self.down_proj = _enter_exit_pair(
            cfg, n_in * cfg.ffn_hidden, cfg.ffn_hidden, sequence_parallel, regather, group
        )

    def forward(self, x):
        h = self.fc1(x)
        act = self.cfg.activation
        if act == "swiglu":
            gate, up = h.split(self.ffn_local, dim=-1)
            h = F.silu(gate) * up
        else:
            h = F.gelu(h) if act == "gelu" else F.relu(h)
        return F.dropout(self.down_proj(h), p=self.cfg.dropout, training=self.training)

    def shard_map(self, prefix=""):
        names = ["gate_proj", "up_proj"] if self.cfg.activation == "swiglu" else ["up_proj"]
        m = _fused_shard_map(self.fc1, names, [self.ffn_local] * len(names), prefix)
        m.update(self.down_proj.shard_map(prefix + "down_proj."))
        return m


class TPAttention(nn.Module):
    """Causal self-attention with the heads split across ranks: rank r computes query heads
    ``[r·a/t, (r+1)·a/t)`` and KV heads ``[r·n_kv/t, (r+1)·n_kv/t)`` (the KV heads those query
    heads use under GQA), then a row-parallel output projection sums the heads' contributions.
    Q, K and V are one fused column-parallel matmul (one ``enter_tp``)."""

    def __init__(self, cfg: ModelConfig, *, sequence_parallel=False, regather=True, attn_impl="sdpa", group=None):
        super().__init__()
        t = tp_size(group)
        if cfg.n_heads % t or cfg.n_kv_heads % t:
            raise ValueError(
                f"tp={t} must divide n_heads={cfg.n_heads} and n_kv_heads={cfg.n_kv_heads} "
                "(each rank needs whole query heads and the KV heads they read)"
            )
        self.cfg, self.attn_impl, self.group = cfg, attn_impl, group
        self.heads, self.kv_heads = cfg.n_heads // t, cfg.n_kv_heads // t
        self.sizes = [self.heads * cfg.head_dim, self.kv_heads * cfg.head_dim, self.kv_heads * cfg.head_dim]
        self.qkv, self.o_proj = _enter_exit_pair(
            cfg, cfg.q_dim + 2 * cfg.kv_dim, cfg.q_dim, sequence_parallel, regather, group
        )

    def forward(self, x, cos, sin):
        d = self.cfg.head_dim
        qkv = self.qkv(x)
        b, s, _ = qkv.shape
        q, k, v = qkv.split(self.sizes, dim=-1)
        q = q.view(b, s, self.heads, d).transpose(1, 2)
        k = k.view(b, s, self.kv_heads, d).transpose(1, 2)
        # copy v out of the fused q|k|v output: a saved *view* would keep all of it alive
        v = v.contiguous().view(b, s, self.kv_heads, d).transpose(1, 2)
        q, k = apply_rope(q, cos[:s], sin[:s]), apply_rope(k, cos[:s], sin[:s])
        group = self.heads // self.kv_heads
        if group > 1:
            k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        y = attention_core(q, k, v, dropout_p=self.cfg.dropout, impl=self.attn_impl, training=self.training)
        y = y.transpose(1, 2).reshape(b, s, self.heads * d)
        return F.dropout(self.o_proj(y), p=self.cfg.dropout, training=self.training)

    def shard_map(self, prefix=""):
        m = _fused_shard_map(self.qkv, ["q_proj", "k_proj", "v_proj"], self.sizes, prefix)
        m.update(self.o_proj.shard_map(prefix + "o_proj."))
        return m


# ---------------------------------------------------------------------------------------------
# 4. Vocabulary-parallel embedding and cross-entropy
# ---------------------------------------------------------------------------------------------
class VocabParallelEmbedding(nn.Module):
    """Rank r holds embedding rows ``[r·V/t, (r+1)·V/t)``; tokens outside the range look up zeros
    and the partial results are summed by ``exit_tp`` (all-reduce, or reduce-scatter with SP)."""

    def __init__(self, vocab_size, hidden, *, sequence_parallel=False, group=None):
        super().__init__()
        t, r = tp_size(group), tp_rank(group)
        if vocab_size % t:
            raise ValueError(f"vocab_size={vocab_size} must be divisible by tp={t}")
        self.per_rank = vocab_size // t
        self.start = r * self.per_rank
        self.sequence_parallel, self.group = sequence_parallel, group
        self.weight = nn.Parameter(torch.empty(self.per_rank, hidden))
        nn.init.normal_(self.weight, std=0.02)

    def forward(self, tokens):
        local = tokens - self.start
        outside = (local < 0) | (local >= self.per_rank)
        y = F.embedding(local.masked_fill(outside, 0), self.weight)
        y = y.masked_fill(outside.unsqueeze(-1), 0.0)
        return exit_tp(y, self.sequence_parallel, self.group)

    def shard_map(self, prefix=""):
        return {prefix + "weight": (self.weight, None, 0)}


class VocabParallelCE(torch.autograd.Function):
    """Mean cross-entropy over logits sharded along the vocabulary, never gathering them: three
    all-reduces of one value per token (max, target logit, sum of exponentials)."""

    @staticmethod
    def forward(ctx, logits, targets, start, group):
        logits = logits.float()
        n_local = logits.shape[-1]
        gmax = all_reduce(logits.max(dim=-1).values, group, dist.ReduceOp.MAX)
        shifted = logits - gmax.unsqueeze(-1)
        local_t = targets - start
        outside = (local_t < 0) | (local_t >= n_local)
        local_t = local_t.masked_fill(outside, 0)
        target_logit = shifted.gather(-1, local_t.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        target_logit = all_reduce(target_logit, group)
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), group)
        loss = sum_exp.log() - target_logit  # per token
        ctx.save_for_backward(exp / sum_exp.unsqueeze(-1), local_t, outside)
        return loss.mean()

    @staticmethod
    def backward(ctx, dloss):
        softmax, local_t, outside = ctx.saved_tensors
        grad = softmax.clone()
        onehot = torch.zeros_like(grad).scatter_(-1, local_t.unsqueeze(-1), 1.0)
        grad -= onehot * (~outside).unsqueeze(-1).to(grad.dtype)
        return grad * (dloss / local_t.numel()), None, None, None


def vocab_parallel_cross_entropy(local_logits, targets, group=None):
    """Mean CE of ``local_logits`` [..., V/t] (this rank's vocabulary slice) against ``targets``."""
    start = tp_rank(group) * local_logits.shape[-1]
    return VocabParallelCE.apply(local_logits, targets, start, group)


# ---------------------------------------------------------------------------------------------
# 5. The tensor-parallel transformer
# ---------------------------------------------------------------------------------------------
def _norm(cfg, sequence_parallel):
    """The package's norm (replicated); with SP its parameters are marked for the TP-group
    gradient sum, since each rank normalises only its slice of the sequence."""
    norm = build_norm(cfg)
    if sequence_parallel:
        for p in norm.parameters():
            _mark_sequence_parallel(p)
    return norm


def _replicated(module, prefix):
    return {prefix + n: (p, None, None) for n, p in module.named_parameters()}


class TPBlock(nn.Module):
    def __init__(self, cfg, *, sequence_parallel=False, regather=True, attn_impl="sdpa", group=None):
        super().__init__()
        kw = dict(sequence_parallel=sequence_parallel, regather=regather, group=group)
        self.attn_norm = _norm(cfg, sequence_parallel)
        self.attn = TPAttention(cfg, attn_impl=attn_impl, **kw)
        self.mlp_norm = _norm(cfg, sequence_parallel)
        self.mlp = TPMLP(cfg, **kw)

    def forward(self, x, cos, sin):
        x = x + self.attn(self.attn_norm(x), cos, sin)
        return x + self.mlp(self.mlp_norm(x))

    def shard_map(self, prefix=""):
        m = _replicated(self.attn_norm, prefix + "attn_norm.")
        m.update(self.attn.shard_map(prefix + "attn."))
        m.update(_replicated(self.mlp_norm, prefix + "mlp_norm."))
        m.update(self.mlp.shard_map(prefix + "mlp."))
        return m


class TPTransformer(nn.Module):
    """Tensor-parallel ``mlsys_nb.models.Transformer`` (dense models): vocab-parallel embedding,
    ``TPBlock``s, final norm, vocab-parallel LM head (tied or not) and vocab-parallel loss.

    ``forward(tokens)`` returns this rank's logits slice [b, s, V/t]; ``forward(tokens, targets)``
    the mean cross-entropy (same value on every rank). With ``sequence_parallel=True`` the sequence
    length must be divisible by t; call ``sync_sequence_parallel_grads(model)`` after backward."""

    def __init__(self, cfg: ModelConfig, *, sequence_parallel=False, regather=True, attn_impl="sdpa", group=None):
        super().__init__()
        if cfg.is_moe:
            raise ValueError("TPTransformer covers dense models (n_experts=0); MoE layers use expert parallelism")
        self.cfg, self.sequence_parallel, self.group = cfg, sequence_parallel, group
        kw = dict(sequence_parallel=sequence_parallel, group=group)
        self.embed = VocabParallelEmbedding(cfg.vocab_size, cfg.hidden, **kw)
        self.blocks = nn.ModuleList(
            TPBlock(cfg, regather=regather, attn_impl=attn_impl, **kw) for _ in range(cfg.n_layers)
        )
        self.norm = _norm(cfg, sequence_parallel)
        self.lm_head = ColumnParallelLinear(cfg.hidden, cfg.vocab_size, regather=regather, **kw)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(cfg.head_dim, cfg.seq_len, cfg.rope_theta)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)

    def forward(self, tokens, targets=None):
        s, t = tokens.shape[1], tp_size(self.group)
        if s > self.cfg.seq_len:
            raise ValueError(f"sequence length {s} exceeds cfg.seq_len={self.cfg.seq_len}")
        if self.sequence_parallel and s % t:
            raise ValueError(f"sequence length {s} must be divisible by tp={t} with sequence_parallel=True")
        x = F.dropout(self.embed(tokens), p=self.cfg.dropout, training=self.training)
        for blk in self.blocks:
            x = blk(x, self.rope_cos, self.rope_sin)
        logits = self.lm_head(self.norm(x))
        if targets is None:
            return logits
        return vocab_parallel_cross_entropy(logits, targets, self.group)

    def shard_map(self, prefix=""):
        m = self.embed.shard_map(prefix + "embed.")
        for i, blk in enumerate(self.blocks):
            m.update(blk.shard_map(f"{prefix}blocks.{i}."))
        m.update(_replicated(self.norm, prefix + "norm."))
        if not self.cfg.tied_embeddings:
            m.update(self.lm_head.shard_map(prefix + "lm_head."))
        return m


# ---------------------------------------------------------------------------------------------
# 6. Loading full weights, comparing gradients, SP gradient sync
# ---------------------------------------------------------------------------------------------
def _local(param, rows, grad=False):
    t = param.grad if grad else param
    if t is None:
        raise ValueError("no gradient: did backward run on this rank?")
    return t if rows is None else t[rows]


def load_full_state_dict(module: nn.Module, full_state: dict, group=None) -> None:
    """Copy this rank's slice of every tensor of ``full_state`` (keys of the unsharded module,
    e.g. ``mlsys_nb.models.Transformer(cfg).state_dict()``) into the TP ``module``."""
    t, r = tp_size(group), tp_rank(group)
    with torch.no_grad():
        for key, (param, rows, dim) in module.shard_map().items():
            if key not in full_state:
                raise KeyError(f"the full state dict has no {key!r}")
            src = full_state[key] if dim is None else shard(full_state[key], dim, r, t)
            dst = _local(param, rows)
            if src.shape != dst.shape:
                raise ValueError(f"{key}: slice {tuple(src.shape)} does not fit the local {tuple(dst.shape)}")
            dst.copy_(src)


def compare_with_full(module: nn.Module, full_tensors: dict, *, grads=True, group=None) -> dict:
    """Max abs difference between each local parameter (or its gradient, ``grads=True``) and this
    rank's slice of the matching full tensor (``full_tensors``: full name -> tensor, e.g.
    ``{n: p.grad for n, p in full_model.named_parameters()}``). Returns {full name: max error}."""
    t, r = tp_size(group), tp_rank(group)
    out = {}
    for key, (param, rows, dim) in module.shard_map().items():
        ref = full_tensors[key] if dim is None else shard(full_tensors[key], dim, r, t)
        out[key] = (_local(param, rows, grads).detach() - ref).abs().max().item()
    return out


def sync_sequence_parallel_grads(module: nn.Module, group=None) -> None:
    """Sum the gradients of parameters marked ``sequence_parallel`` (norm weights, row-parallel
    biases under SP) over the TP group: each rank saw only its slice of the sequence."""
    for p in module.parameters():
        if getattr(p, "sequence_parallel", False) and p.grad is not None:
            dist.all_reduce(p.grad, group=group)


# ---- closed form (bytes on the wire; tests/test_tensor_parallel.py pins it against the counter) -----
def tp_bytes_per_layer(b: int, s: int, h: int, tp: int, sp: bool, dtype="bf16") -> float:
    """Bytes one rank sends per transformer layer in the FORWARD pass (ring collectives): Megatron TP
    all-reduces the [b, s, h] activations twice (after attention and after the MLP), ``2·2(tp−1)/tp·b·s·h``
    elements; SP replaces each all-reduce by a reduce-scatter and an all-gather: the same bytes. ``dtype``:
    a name in ``config.DTYPE_BYTES`` (the activations' element size)."""
    x = b * s * h * dtype_bytes(dtype)
    if sp:
        return 2 * (bytes_sent_per_rank("reduce_scatter", x, tp) + bytes_sent_per_rank("all_gather", x, tp))
    return 2 * bytes_sent_per_rank("all_reduce", x, tp)
