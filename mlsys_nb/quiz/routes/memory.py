"""Second routes of the topic ``memory``: a hand sum of the states, the saved tensors and the
temporaries, where the keys use ``memory.estimate``."""

from __future__ import annotations

import math

from .model import cfg_of, gpu_bytes, model_counts
from .registry import register_route


def acts_per_token(cfg, *, recompute="none", flash=True, seq_len=2048, tp=1, sp=False) -> float:
    """Bytes saved for backward per token per layer (bf16 activations, fused kernels, CUDA masks of
    1 B), written out from the block's forward (Korthikanti et al. 2022, arXiv:2205.05198, §4):
    norm inputs (+ fp32 rstd for RMSNorm, fp32 mean and rstd for LayerNorm), the q/k/v input, q, k,
    v, the flash log-sum-exp (or the s² probabilities), the output projection's input (with flash: the
    flash output itself), the MLP input and its fused SwiGLU's gate and up outputs + their product (3
    FFN-wide tensors; SiLU recomputed in backward) or GELU's 2 intermediates, dropout masks. TP shards head and
    FFN dimensions; without SP the h-wide tensors stay replicated."""
    h, f, a, hd, kv = cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
    if recompute == "full":
        return 2 * h / (tp if sp else 1)
    stats = 4 if cfg.norm == "rmsnorm" else 8
    drop = cfg.dropout > 0
    replicated = 2 * (2 * h + stats) + 2 * h + 2 * h + (2 * h if drop else 0)  # norms, qkv/mlp inputs, masks
    ffn = 3 * 2 * f if cfg.activation == "swiglu" else 2 * 2 * f
    sharded = 2 * a * hd + 2 * 2 * kv * hd + 2 * a * hd + ffn
    if recompute == "none":
        if flash:
            sharded += 4 * a
        else:
            sharded += (2 + 1 + 2 if drop else 2) * a * seq_len  # probabilities (+ dropout mask and output)
    return replicated / (tp if sp else 1) + sharded / tp


def outside_bytes(cfg, tokens, tp=1, sp=False) -> float:
    """Outside the layers: token and target ids (int64), the final norm, the LM head input, the fp32
    log-probs (vocab-parallel: split by TP), the scalar loss."""
    k = tp if sp else 1
    stats = 4 if cfg.norm == "rmsnorm" else 8
    emb_mask = cfg.hidden / k if cfg.dropout > 0 else 0
    return tokens * (8 + 8 + emb_mask + (2 * cfg.hidden + stats) / k + 2 * cfg.hidden / k + 4 * cfg.vocab_size / tp) + 4


def train_memory(model, *, micro_batch=1, seq_len=2048, dp=1, zero=0, recompute="none", tp=1, sp=False) -> float:
    """Bytes per GPU of bf16-mixed Adam training (pp = 1), by hand: states 2 + 2 + 12 B per parameter
    held (ZeRO shards over dp, flat with padding: ceil(n / dp)), activations of every layer and outside
    them, and the transient peak: ZeRO-3's two gathered layers + max(recompute working set, logits and
    their gradient)."""
    m = model_counts(model)
    cfg = m["cfg"]
    vshard = math.ceil(cfg.vocab_size / tp) * cfg.hidden
    emb_head = vshard * (1 if cfg.tied_embeddings else 2)
    layer_norms = (m["norms"] - cfg.hidden) / cfg.n_layers
    kv_rank = cfg.n_kv_heads / tp if tp <= cfg.n_kv_heads else 1
    attn = cfg.hidden * cfg.q_dim * 2 / tp + 2 * cfg.hidden * cfg.head_dim * kv_rank
    mlp = 3 * cfg.hidden * cfg.ffn_hidden / tp
    layer_rank = attn + mlp + layer_norms
    n = cfg.n_layers * layer_rank + emb_head + cfg.hidden
    shard = lambda x, on: math.ceil(x / dp) if (on and dp > 1) else x  # noqa: E731
    states = 2 * shard(n, zero >= 3) + 2 * shard(n, zero >= 2) + 8 * shard(n, zero >= 1) + 4 * shard(n, zero >= 1)
    tokens = micro_batch * seq_len
    acts = cfg.n_layers * tokens * acts_per_token(cfg, recompute=recompute, seq_len=seq_len, tp=tp, sp=sp)
    acts += outside_bytes(cfg, tokens, tp, sp)
    gathered = 2 * layer_rank * 2 if (zero >= 3 and dp > 1) else 0.0
    if recompute == "none":
        work = 0.0
    else:
        full = tokens * acts_per_token(cfg, seq_len=seq_len, tp=tp, sp=sp)
        kept = tokens * acts_per_token(cfg, recompute=recompute, seq_len=seq_len, tp=tp, sp=sp)
        work = full - kept if recompute == "selective" else full
    logits = (4 + 2) * cfg.vocab_size * tokens / tp
    return states + acts + gathered + max(work, logits)


@register_route("memory.model_states")
def _(p):
    n, dp, z = p["n_params"], p["dp"], p["zero"]
    return 2 * n / (dp if z >= 3 else 1) + 2 * n / (dp if z >= 2 else 1) + 12 * n / (dp if z >= 1 else 1)


@register_route("memory.bytes_per_param")
def _(p):
    table = {  # params + grads + optimizer states + fp32 master
        ("bf16-mixed", "adam"): 2 + 2 + 4 + 4 + 4,
        ("fp32", "adam"): 4 + 4 + 4 + 4,
        ("bf16-mixed", "sgd-momentum"): 2 + 2 + 4 + 4,
        ("fp32", "sgd"): 4 + 4,
        ("bf16-mixed", "adam-8bit"): 2 + 2 + 1 + 1 + 4,
    }
    return table[(p["precision"], p["optimizer"])]


@register_route("memory.activations_per_layer")
def _(p):
    """Each saved tensor of the block written out by hand (acts_per_token)."""
    cfg = cfg_of(p["model"])
    return p["micro_batch"] * p["seq_len"] * acts_per_token(cfg, recompute=p["recompute"], seq_len=p["seq_len"])


@register_route("memory.recompute_saving")
def _(p):
    """Each saved tensor of the block written out by hand (acts_per_token), with and without recompute."""
    cfg = cfg_of(p["model"])
    none = acts_per_token(cfg, flash=False, seq_len=p["seq_len"])
    return none / acts_per_token(cfg, recompute=p["recompute"], flash=False, seq_len=p["seq_len"])


@register_route("memory.fits")
def _(p):
    """A hand sum of states, saved tensors and temporaries (train_memory) against the GPU."""
    kw = {k: p[k] for k in ("micro_batch", "seq_len", "dp", "zero", "recompute")}
    return "yes" if train_memory(p["model"], **kw) <= gpu_bytes(p["gpu"]) else "no"


@register_route("memory.max_micro_batch")
def _(p):
    """The largest micro-batch whose hand memory sum (train_memory) fits."""
    kw = {k: p[k] for k in ("seq_len", "dp", "zero", "recompute")}
    cap = gpu_bytes(p["gpu"])
    return max((b for b in range(1, 65) if train_memory(p["model"], micro_batch=b, **kw) <= cap), default=0)


@register_route("memory.oom_knob")
def _(p):
    """Each change applied to the hand memory sum (train_memory): the one that fits."""
    base = {k: p[k] for k in ("micro_batch", "seq_len", "dp", "zero")}
    options = {
        "ZeRO-3": dict(base, zero=3),
        "full recompute": dict(base, recompute="full"),
        "TP = 8 with SP": dict(base, tp=8, sp=True),
        "halve the micro-batch": dict(base, micro_batch=max(1, p["micro_batch"] // 2)),
    }
    cap = gpu_bytes(p["gpu"])
    fits = [k for k, kw in options.items() if train_memory(p["model"], **kw) <= cap]
    return fits[0] if len(fits) == 1 else "ambiguous: " + ", ".join(fits)
