"""Second routes: every family's answer recomputed from ``question.params`` WITHOUT the function
that computed its key.

A worked solution that printed ``question.answer`` and fed it back to ``question.check`` could not
fail: a wrong key would pass its own checker. Here each family has a route of its own, chosen to
share as little as possible with the key:

- hand formulas written out from the papers (α-β times, ZeRO bytes, 6·N·D, the Chinchilla closed
  form, speculative decoding's geometric sum, GAE, PPO/GRPO/DPO/k3 in plain Python);
- counts read off the kit's real ``Transformer`` built on the ``meta`` device (parameters, matmul
  weights), where the keys use ``memory.param_count``'s closed forms;
- FLOPs counted by ``torch.utils.flop_counter.FlopCounterMode`` on that model's graph;
- a hand roofline and a hand training-memory sum (states, each saved tensor of a block, the
  temporaries), where the keys use ``inference.roofline`` and ``memory.estimate``;
- brute force (the inference-optimal model size on a grid), a simulated two-worker timeline
  (asynchronous RLHF), and the pipeline's closed forms where the keys use its simulator.

``second_route(q)`` returns the answer (a number in ``q.unit`` or a choice string);
``worked_response(q)`` writes it as a learner would type it, for ``q.check``. A family without a
route raises ``KeyError`` (``tests/test_quiz_second_route.py`` checks every family has one and that
each agrees with its key).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from functools import cache

from .. import hardware
from .core import Question

ROUTES: dict[str, Callable[[dict], float | str]] = {}
BYTES = {"bf16": 2, "fp16": 2, "fp8": 1, "int8": 1, "int4": 0.5, "fp32": 4}


def route(*names: str):
    """Register ``fn(params) -> answer`` as the second route of the families ``names``."""

    def deco(fn):
        for n in names:
            ROUTES[n] = fn
        return fn

    return deco


def second_route(q: Question) -> float | str:
    """The answer to ``q`` by its family's second route (never the family's own calculator)."""
    if q.family not in ROUTES:
        raise KeyError(f"family {q.family!r} has no second route")
    return ROUTES[q.family](dict(q.params, _family=q.family, _text=q.text))


def worked_response(q: Question) -> str:
    """The second route's answer written with a unit, as a learner would type it."""
    v = second_route(q)
    if q.is_choice:
        return str(v)
    return dataclasses.replace(q, answer=float(v)).answer_response()


# ---- the real model, on the meta device ------------------------------------------------------------
@cache
def _built(cfg) -> dict:
    import torch

    from ..models import Transformer

    with torch.device("meta"):
        model = Transformer(cfg)
    linear = sum(m.weight.numel() for m in model.modules() if isinstance(m, torch.nn.Linear))
    norms = sum(p.numel() for m in model.modules() if "Norm" in type(m).__name__ for p in m.parameters(recurse=False))
    total = sum(p.numel() for p in model.parameters())  # tied tensors once
    experts = [m for name, m in model.named_modules() if re.search(r"experts\.\d+$", name)]
    expert = sum(p.numel() for p in experts[0].parameters()) if experts else 0
    n_moe = sum(1 for name, _ in model.named_modules() if re.search(r"experts$", name))
    return dict(total=total, linear=linear, norms=norms, expert=expert, n_moe=n_moe)


@cache
def meta_counts(cfg) -> dict:
    """Element counts read off ``mlsys_nb.models.Transformer`` built on the meta device: ``total``
    (tied tensors once), ``linear`` (every nn.Linear weight: the matmul weights, LM head included),
    ``norms``, ``embedding``, ``expert`` (one routed expert's weights), ``n_moe`` (layers with routed
    experts). Layers are identical, so the 1- and 2-layer models are built and the difference is
    counted ``n_layers − 1`` more times (seconds saved on a 405B model; exact)."""
    if cfg.n_dense_layers:  # layers of two kinds: build them all
        out = dict(_built(cfg))
    else:
        one, two = _built(cfg.replace(n_layers=1)), _built(cfg.replace(n_layers=2))
        out = {k: one[k] + (cfg.n_layers - 1) * (two[k] - one[k]) for k in ("total", "linear", "norms", "n_moe")}
        out["expert"] = one["expert"]
    return dict(out, cfg=cfg, embedding=cfg.vocab_size * cfg.hidden)


def _cfg(name):
    from ..memory import preset

    return preset(name)


def _meta(name) -> dict:
    return meta_counts(_cfg(name))


def _kv_per_token(cfg, nbytes=2.0) -> float:
    """K and V of every layer (MHA/GQA): 2·L·n_kv·d·bytes; MLA: (latent + RoPE key)·L·bytes."""
    if cfg.kv_lora_rank:
        return (cfg.kv_lora_rank + cfg.rope_head_dim) * cfg.n_layers * nbytes
    return 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim * nbytes


# ---- collectives (α-β, Thakur et al. 2005; Patarasuk & Yuan 2009) ----------------------------------
def _ab(op, algorithm, n, S, a, b):
    lg = math.ceil(math.log2(n))
    pw = 2 ** int(math.log2(n))
    table = {
        ("all_reduce", "ring"): (2 * (n - 1), 2 * (n - 1) / n),
        ("all_reduce", "tree"): (2 * lg, 2),
        ("all_reduce", "binomial_tree"): (2 * lg, 2 * lg),
        ("all_reduce", "rabenseifner"): (2 * lg, 2 * (n - 1) / n),
        ("all_reduce", "recursive_doubling"): (int(math.log2(pw)) + 2 * (pw != n),) * 2,
        ("all_gather", "ring"): (n - 1, (n - 1) / n),
        ("reduce_scatter", "ring"): (n - 1, (n - 1) / n),
        ("all_to_all", "pairwise"): (n - 1, (n - 1) / n),
        ("broadcast", "binomial_tree"): (lg, lg),
        ("broadcast", "pipelined_chain"): (n - 1, 1),
    }
    ka, kb = table[(op, algorithm)]
    return ka * a + kb * S / b


@route(
    "comm.allreduce_time",
    "comm.allreduce_tree_time",
    "comm.allreduce_binomial_time",
    "comm.allreduce_rabenseifner_time",
    "comm.allreduce_recursive_doubling_time",
    "comm.allgather_time",
    "comm.reduce_scatter_time",
    "comm.all_to_all_time",
    "comm.broadcast_tree_time",
    "comm.broadcast_chain_time",
)
def _comm_time(p):
    return _ab(p["op"], p["algorithm"], p["n"], p["bytes"], p["alpha"], p["beta"])


@route("comm.ring_allreduce_bytes_sent")
def _(p):
    return 2 * (p["n"] - 1) / p["n"] * p["bytes"]


@route("comm.allgather_bytes_sent")
def _(p):
    return (p["n"] - 1) / p["n"] * p["bytes"]


@route("comm.ring_tree_crossover")
def _(p):
    n = p["n"]
    return n * (n - 1 - math.ceil(math.log2(n))) * p["alpha"] * p["beta"]


@route("comm.busbw")
def _(p):
    n = p["n"]
    factor = 2 * (n - 1) / n if p["op"] == "all_reduce" else (n - 1) / n
    return p["bytes"] / p["seconds"] * factor


@route("comm.faster_allreduce")
def _(p):
    n, s, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
    ring = 2 * (n - 1) * a + 2 * (n - 1) / n * s / b
    tree = 2 * math.ceil(math.log2(n)) * a + 2 * s / b  # pipelined (double binary) tree
    return "ring" if ring < tree else "tree"


@route("data_parallel.ddp_bytes_per_step")
def _(p):
    return 2 * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@route("data_parallel.zero_bytes_per_step")
def _(p):
    return (3 if p["zero"] == 3 else 2) * (p["n"] - 1) / p["n"] * 2 * p["n_params"]


@route("data_parallel.zero3_vs_ddp_traffic")
def _(p):
    n = p["n"]
    return (3 * (n - 1) / n) / (2 * (n - 1) / n)  # RS + 2 AG vs RS + AG


@route("data_parallel.grad_allreduce_time")
def _(p):
    n = p["n"]
    return 2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * 2 * p["n_params"] / p["beta"]


@route("data_parallel.bucketing_speedup")
def _(p):
    n, S, a, b = p["n"], p["bytes"], p["alpha"], p["beta"]
    k = math.ceil(S / p["bucket"])
    lat, bw = 2 * (n - 1) * a, 2 * (n - 1) / n * S / b
    return (p["tensors"] * lat + bw) / (k * lat + bw)


@route("tensor.tp_bytes_per_layer", "tensor.sp_bytes_per_layer")
def _(p):
    return 2 * 2 * (p["tp"] - 1) / p["tp"] * p["b"] * p["s"] * p["h"] * 2


@route("tensor.tp_allreduce_time_per_layer")
def _(p):
    n, S = p["tp"], p["b"] * p["s"] * p["h"] * 2
    return 2 * (2 * (n - 1) * p["alpha"] + 2 * (n - 1) / n * S / p["beta"])


@route("expert_context.ep_bytes_per_layer")
def _(p):
    return 4 * p["top_k"] * p["tokens"] * p["hidden"] * (p["ep"] - 1) / p["ep"] * 2


@route("expert_context.ep_vs_tp_moe")
def _(p):
    return p["top_k"]


@route("expert_context.cp_causal_imbalance")
def _(p):
    return p["cp"]


@route("expert_context.ep_all_to_all_time")
def _(p):
    n, S = p["ep"], p["top_k"] * p["tokens"] * p["hidden"] * 2
    return (n - 1) * p["alpha"] + (n - 1) / n * S / p["beta"]


@route("expert_context.cp_ring_bytes")
def _(p):
    blk = 2 * p["b"] * p["seq_len"] // p["cp"] * p["n_kv_heads"] * p["head_dim"] * 2
    return (p["cp"] - 1 if p["pass"] == "forward" else 2 * p["cp"] - 1) * blk


@route("expert_context.moe_params")
def _(p):
    """Counted on the real MoE Transformer (meta device): active = total − the unused experts."""
    m = meta_counts(_cfg("mixtral-8x7b").replace(n_experts=p["n_experts"], top_k=p["top_k"]))
    active = m["total"] - m["n_moe"] * (p["n_experts"] - p["top_k"]) * m["expert"]
    return {"total parameters": m["total"], "active parameters per token": active}.get(p["ask"], 2 * m["total"])


@route("layout.tp_within_node")
def _(p):
    nv = hardware.link("nvlink4")
    s, n = p["bytes"], p["tp"]
    inside = 2 * (n - 1) * nv.latency_s + 2 * (n - 1) / n * s / nv.per_direction_bytes_per_s
    across = 2 * (n - 1) * 10e-6 + 2 * (n - 1) / n * s / p["beta_inter"]
    return across / inside


@route("rl.weight_sync_time")
def _(p):
    return (p["n"] - 1) * p["alpha"] + 2 * p["n_params"] / p["beta"]


# ---- pipeline: the closed forms where the keys use the simulator --------------------------------
def _pl_bubble_time(p):
    from .. import pipeline as pl

    bt = pl.closed_form(p["schedule"], p["p"], p["m"], p["v"], F=1.0, B=1.0, W=1.0)["bubble_time"]
    if bt is None:  # no closed form for this case: the simulated timeline's idle time, op by op
        r = pl.simulate(pl.schedule(p["schedule"], p["p"], p["m"], p["v"]), F=1.0, B=1.0, W=1.0)
        busy = sum(e - s for *_, s, e in r.rows())
        return r.makespan - busy / p["p"]
    return bt


@route("pipeline.bubble_fraction")
def _(p):
    """The schedule's closed-form bubble (the key runs the event simulator)."""
    bt = _pl_bubble_time(p)
    return bt / (3.0 * p["m"] + bt)


@route("pipeline.makespan")
def _(p):
    """Busy time + the schedule's closed-form bubble (the key runs the event simulator)."""
    return 3.0 * p["m"] + _pl_bubble_time(p)


@route("pipeline.bubble_ratio")
def _(p):
    """The schedule's closed-form bubble over the busy time (the key runs the event simulator)."""
    return _pl_bubble_time(p) / (3.0 * p["m"])


@route("pipeline.interleaving_gain")
def _(p):
    return p["v"]


@route("pipeline.min_microbatches")
def _(p):
    q, t = p["p"] - 1, p["target"]
    return max(1, math.ceil(q * (1 - t) / t - 1e-9))


@route("pipeline.best_schedule_for_memory")
def _(p):
    """Peaks and bubbles from the closed forms (the key reads them off the simulator)."""
    from .. import pipeline as pl

    rows = {}
    for name in ("gpipe", "1f1b", "zb-h2"):
        cf = pl.closed_form(name, p["p"], p["m"], None, F=1.0, B=1.0, W=1.0)
        rows[name] = (
            pl.peak_in_flight(name, p["p"], p["m"], None)[0],
            cf["bubble_time"] / (3 * p["m"] + cf["bubble_time"]),
        )
    return min(rows, key=lambda k: rows[k])


def _peak_acts(p):
    """In-flight micro-batches from the closed forms (the key counts them in the simulator)."""
    from .. import pipeline as pl

    if p["schedule"] == "gpipe":
        return p["m"]
    if p["schedule"] in ("1f1b", "zb-h1"):
        return min(p["p"], p["m"])
    return pl.peak_in_flight(p["schedule"], p["p"], p["m"], p["v"])[0]


for _name in ("gpipe", "1f1b", "zb_h1", "interleaved_1f1b", "zb_h2", "zbv", "dualpipe", "dualpipev"):
    ROUTES[f"pipeline.peak_activations_{_name}"] = _peak_acts


# ---- memory: a hand sum of the states, the saved tensors and the temporaries ------------------------
def acts_per_token(cfg, *, recompute="none", flash=True, seq_len=2048, tp=1, sp=False) -> float:
    """Bytes saved for backward per token per layer (bf16 activations, fused kernels, CUDA masks of
    1 B), written out from the block's forward (Korthikanti et al. 2022, arXiv:2205.05198, §4):
    norm inputs (+ fp32 rstd for RMSNorm, fp32 mean and rstd for LayerNorm), the q/k/v input, q, k,
    v, the flash output and log-sum-exp (or the s² probabilities), the output projection's input, the
    MLP input and its SwiGLU (4 tensors) or GELU (2) intermediates, dropout masks. TP shards head and
    FFN dimensions; without SP the h-wide tensors stay replicated."""
    h, f, a, hd, kv = cfg.hidden, cfg.ffn_hidden, cfg.n_heads, cfg.head_dim, cfg.n_kv_heads
    if recompute == "full":
        return 2 * h / (tp if sp else 1)
    stats = 4 if cfg.norm == "rmsnorm" else 8
    drop = cfg.dropout > 0
    replicated = 2 * (2 * h + stats) + 2 * h + 2 * h + (2 * h if drop else 0)  # norms, qkv/mlp inputs, masks
    ffn = 4 * 2 * f if cfg.activation == "swiglu" else 2 * 2 * f
    sharded = 2 * a * hd + 2 * 2 * kv * hd + 2 * a * hd + ffn
    if recompute == "none":
        if flash:
            sharded += 2 * a * hd + 4 * a
        else:
            sharded += (2 + 1 + 2 if drop else 2) * a * seq_len  # probabilities (+ dropout mask and output)
    return replicated / (tp if sp else 1) + sharded / tp


def _outside(cfg, tokens, tp=1, sp=False) -> float:
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
    m = _meta(model)
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
    acts += _outside(cfg, tokens, tp, sp)
    gathered = 2 * layer_rank * 2 if (zero >= 3 and dp > 1) else 0.0
    if recompute == "none":
        work = 0.0
    else:
        full = tokens * acts_per_token(cfg, seq_len=seq_len, tp=tp, sp=sp)
        kept = tokens * acts_per_token(cfg, recompute=recompute, seq_len=seq_len, tp=tp, sp=sp)
        work = full - kept if recompute == "selective" else full
    logits = (4 + 2) * cfg.vocab_size * tokens / tp
    return states + acts + gathered + max(work, logits)


def _gpu_bytes(name) -> float:
    return hardware.gpu(name).memory_bytes


@route("memory.model_states")
def _(p):
    n, dp, z = p["n_params"], p["dp"], p["zero"]
    return 2 * n / (dp if z >= 3 else 1) + 2 * n / (dp if z >= 2 else 1) + 12 * n / (dp if z >= 1 else 1)


@route("memory.bytes_per_param")
def _(p):
    table = {  # params + grads + optimizer states + fp32 master
        ("bf16-mixed", "adam"): 2 + 2 + 4 + 4 + 4,
        ("fp32", "adam"): 4 + 4 + 4 + 4,
        ("bf16-mixed", "sgd-momentum"): 2 + 2 + 4 + 4,
        ("fp32", "sgd"): 4 + 4,
        ("bf16-mixed", "adam-8bit"): 2 + 2 + 1 + 1 + 4,
    }
    return table[(p["precision"], p["optimizer"])]


@route("memory.activations_per_layer")
def _(p):
    """Each saved tensor of the block written out by hand (acts_per_token)."""
    cfg = _cfg(p["model"])
    return p["micro_batch"] * p["seq_len"] * acts_per_token(cfg, recompute=p["recompute"], seq_len=p["seq_len"])


@route("memory.recompute_saving")
def _(p):
    """Each saved tensor of the block written out by hand (acts_per_token), with and without recompute."""
    cfg = _cfg(p["model"])
    none = acts_per_token(cfg, flash=False, seq_len=p["seq_len"])
    return none / acts_per_token(cfg, recompute=p["recompute"], flash=False, seq_len=p["seq_len"])


@route("memory.fits")
def _(p):
    """A hand sum of states, saved tensors and temporaries (train_memory) against the GPU."""
    kw = {k: p[k] for k in ("micro_batch", "seq_len", "dp", "zero", "recompute")}
    return "yes" if train_memory(p["model"], **kw) <= _gpu_bytes(p["gpu"]) else "no"


@route("memory.max_micro_batch")
def _(p):
    """The largest micro-batch whose hand memory sum (train_memory) fits."""
    kw = {k: p[k] for k in ("seq_len", "dp", "zero", "recompute")}
    cap = _gpu_bytes(p["gpu"])
    return max((b for b in range(1, 65) if train_memory(p["model"], micro_batch=b, **kw) <= cap), default=0)


@route("memory.oom_knob")
def _(p):
    """Each change applied to the hand memory sum (train_memory): the one that fits."""
    base = {k: p[k] for k in ("micro_batch", "seq_len", "dp", "zero")}
    options = {
        "ZeRO-3": dict(base, zero=3),
        "full recompute": dict(base, recompute="full"),
        "TP = 8 with SP": dict(base, tp=8, sp=True),
        "halve the micro-batch": dict(base, micro_batch=max(1, p["micro_batch"] // 2)),
    }
    cap = _gpu_bytes(p["gpu"])
    fits = [k for k, kw in options.items() if train_memory(p["model"], **kw) <= cap]
    return fits[0] if len(fits) == 1 else "ambiguous: " + ", ".join(fits)


@route("tensor.params_per_rank")
def _(p):
    """Parameters counted on the real model's modules (meta device), split as Megatron splits them."""
    m = _meta(p["model"])
    split = m["linear"] + (0 if m["cfg"].tied_embeddings else m["embedding"])  # vocab-parallel embedding
    return split / p["tp"] + m["norms"]


@route("tensor.sp_activation_saving")
def _(p):
    """Each saved tensor written out by hand, split by TP with and without SP."""
    cfg, s, tp = _cfg(p["model"]), p["seq_len"], p["tp"]
    total = {
        sp: cfg.n_layers * s * acts_per_token(cfg, seq_len=s, tp=tp, sp=sp) + _outside(cfg, s, tp, sp)
        for sp in (False, True)
    }
    return total[False] / total[True]


@route("layout.smallest_zero_stage")
def _(p):
    n, dp = p["n_params"], p["dp"]
    cap = 0.5 * _gpu_bytes(p["gpu"])
    sizes = [(2 + 2 + 12) * n, (2 + 2) * n + 12 * n / dp, 2 * n + 14 * n / dp, 16 * n / dp]
    fits = [z for z, b in enumerate(sizes) if b <= cap]
    return f"ZeRO-{fits[0]}" if fits else "none fits"


@route("rl.rlhf_memory_per_gpu")
def _(p):
    """Actor and critic (trunk + scalar head) at 16 B/param over n (ZeRO-3), reference and reward frozen
    bf16 over n, the rollout engine's full bf16 actor and the KV cache of the batch (512 + 512 tokens)."""
    m = _meta(p["actor"])
    cfg, n = m["cfg"], p["n_gpus"]
    actor = m["total"]
    critic = actor - (0 if cfg.tied_embeddings else m["embedding"]) + cfg.hidden + 1
    return (
        16 * (actor + critic) / n
        + 2 * (actor + critic) / n
        + 2 * actor
        + p["rollout_batch"] * 1024 * _kv_per_token(cfg) / n
    )


# ---- FLOPs, time, cost -----------------------------------------------------------------------------
def _peak(gpu):
    return hardware.gpu(gpu).peak("bf16")


@route("flops.training_days")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (p["n_gpus"] * _peak(p["gpu"]) * p["mfu"]) / 86400


@route("flops.training_flops")
def _(p):
    return 6 * p["n_params"] * p["tokens"]


@route("flops.mfu")
def _(p):
    return p["tokens_per_s"] * 6 * p["n_params"] / (p["n_gpus"] * _peak(p["gpu"]))


@route("flops.gpu_hours", "flops.cost_usd")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (_peak(p["gpu"]) * p["mfu"]) / 3600 * p.get("price", 1.0)


@route("flops.implied_mfu")
def _(p):
    return 6 * p["n_params"] * p["tokens"] / (p["gpu_hours"] * 3600 * _peak(p["gpu"]))


@cache
def _counted(cfg, seq_len: int) -> float:
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ..models import Transformer

    with torch.device("meta"):  # a longer position table (GPT-2) adds no FLOPs: it is a lookup
        net = Transformer(dataclasses.replace(cfg, seq_len=max(cfg.seq_len, seq_len)))
        x = torch.zeros(1, seq_len, dtype=torch.long)
    with FlopCounterMode(display=False) as fc:
        net(x, x).backward()
    return fc.get_total_flops()


@cache
def counted_flops_per_token(model: str, seq_len: int) -> float:
    """Forward + backward FLOPs per token counted by FlopCounterMode on the meta-device model (the
    1- and 2-layer models; each further layer adds the difference), with the masked half of the
    s × s attention scores removed (a causal query sees (s + 1) / 2 keys, the counter counts s)."""
    cfg = _cfg(model)
    one, two = _counted(cfg.replace(n_layers=1), seq_len), _counted(cfg.replace(n_layers=2), seq_len)
    counted = one + (cfg.n_layers - 1) * (two - one)
    masked = 3 * cfg.n_layers * 4 * cfg.n_heads * cfg.head_dim * (seq_len - (seq_len + 1) / 2)
    return counted / seq_len - masked


@route("flops.flops_per_token")
def _(p):
    """FLOPs counted by FlopCounterMode on the real model's graph (meta device)."""
    return counted_flops_per_token(p["model"], p["seq_len"])


@route("layout.modelled_mfu")
def _(p):
    """Model FLOPs per step counted by FlopCounterMode on the real model's graph (meta device)."""
    flops_per_step = counted_flops_per_token(p["model"], 4096) * p["global_batch_tokens"]
    return flops_per_step / (p["gpus"] * _peak(p["gpu"]) * p["step_s"])


@route("layout.fastest_layout")
def _(p):
    """Each candidate layout through the planner's search (its enumeration, rules and memory filter)
    pinned to that layout's degrees, where the key evaluates each layout directly."""
    from .. import planner
    from .bank.training import _LAYOUTS

    steps = {}
    for name, lay in _LAYOUTS.items():
        try:
            rows = planner.search(
                p["model"],
                gpus=p["gpus"],
                gpu=p["gpu"],
                global_batch_tokens=p["global_batch_tokens"],
                seq_len=4096,
                tp=[lay["tp"]],
                pp=[lay.get("pp", 1)],
                cp=[1],
                zero=lay["zero"],
                recompute="none",
                micro_batch=[1],
                schedules=[lay.get("schedule", "1f1b")],
                top=None,
            )
        except ValueError:  # nothing of this layout fits (or its rules reject it)
            continue
        steps[name] = float(rows.step_s.min())
    return min(steps, key=steps.get) if steps else "none fits"


# ---- scaling laws ----------------------------------------------------------------------------------
def _optimum(law, c):
    a, b = law.alpha, law.beta
    G = (a * law.A / (b * law.B)) ** (1 / (a + b))
    n = G * (c / 6) ** (b / (a + b))
    return n, c / (6 * n)


@route("scaling.chinchilla_params", "scaling.chinchilla_tokens", "scaling.tokens_per_param", "scaling.loss")
def _(p):
    from .. import scaling

    L = scaling.law(p["law"])
    if p["_family"] == "scaling.loss":
        return L.E + L.A / p["N"] ** L.alpha + L.B / p["D"] ** L.beta
    n, d = _optimum(L, p["C"])
    return {"scaling.chinchilla_params": n, "scaling.chinchilla_tokens": d}.get(p["_family"], d / n)


@route("scaling.twenty_rule_params")
def _(p):
    return math.sqrt(p["C"] / 120)


@route("scaling.inference_optimal_shrink")
def _(p):
    """Brute force along the Chinchilla iso-loss curve: the N of least 6·N·D + 2·N·D_inference
    (Sardana et al. 2023, arXiv:2401.00448, eq. 2) on a fine grid, then refined by a golden search."""
    from .. import scaling

    law = scaling.law("chinchilla")
    n0, d0 = _optimum(law, p["C"])
    target = law.E + law.A / n0**law.alpha + law.B / d0**law.beta

    def cost(n):
        gap = target - law.E - law.A / n**law.alpha
        if gap <= 0:
            return math.inf
        return 6 * n * (law.B / gap) ** (1 / law.beta) + 2 * n * p["inference_multiple"] * d0

    grid = [n0 * 10 ** (-1.5 + 1.7 * i / 2000) for i in range(2001)]
    i = min(range(len(grid)), key=lambda j: cost(grid[j]))
    lo, hi = grid[max(0, i - 1)], grid[min(len(grid) - 1, i + 1)]
    for _ in range(100):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, m2) if cost(m1) < cost(m2) else (m1, hi)
    return n0 / ((lo + hi) / 2)


# ---- inference and serving: a hand roofline on the real model's matmul weights -----------------------
def roofline(model, gpu, batch, new, context) -> dict:
    """Hand roofline (Williams et al. 2009): FLOPs = 2 × matmul weights × tokens + causal attention
    4·L·n_heads·head_dim per (query, key) pair; bytes = weights once + the cache read and written."""
    m = _meta(model)
    cfg = m["cfg"]
    keys = new * context + new * (new + 1) / 2
    flops = 2 * m["linear"] * batch * new + batch * 4 * cfg.n_layers * cfg.n_heads * cfg.head_dim * keys
    nbytes = 2 * m["linear"] + batch * (context + new) * _kv_per_token(cfg)
    g = hardware.gpu(gpu)
    peak, bw = g.peak("bf16"), g.hbm_bandwidth_bytes_per_s
    return dict(time=max(flops / peak, nbytes / bw), bound="compute" if flops / nbytes >= peak / bw else "memory")


def sequences_that_fit(model, gpu, context, tp=1, usable=0.9) -> int:
    """Full sequences whose bf16 cache fits next to the bf16 weights on each of ``tp`` GPUs."""
    m = _meta(model)
    cfg = m["cfg"]
    budget = usable * _gpu_bytes(gpu) - 2 * m["total"] / tp
    per_seq = math.ceil(_kv_per_token(cfg) * context) / (1 if cfg.kv_lora_rank else min(tp, cfg.n_kv_heads))
    return max(0, math.floor(budget / per_seq))


@route("inference.kv_cache_bytes")
def _(p):
    return _kv_per_token(_cfg(p["preset"]), BYTES[p["dtype"]]) * p["tokens"]


@route("inference.kv_bytes_per_token")
def _(p):
    return _kv_per_token(_cfg(p["preset"]))


@route("inference.weight_bytes")
def _(p):
    """Parameters counted on the real model (meta device) × bytes per parameter."""
    return _meta(p["preset"])["total"] * BYTES[p["dtype"]]


@route("inference.max_concurrent_sequences")
def _(p):
    """Weights counted on the real model (meta device) + a hand KV-cache size against the GPU."""
    return sequences_that_fit(p["preset"], p["gpu"], p["seq_len"], p["tp"])


@route("inference.fits_tp")
def _(p):
    """Weights counted on the real model (meta device) + a hand KV-cache size, tp = 1, 2, 4, 8 in turn."""
    for tp in (1, 2, 4, 8):
        if sequences_that_fit(p["preset"], p["gpu"], p["context"], tp) >= p["batch"]:
            return f"TP = {tp}"
    return "does not fit on 8 GPUs"


@route("inference.gqa_kv_saving")
def _(p):
    cfg = _cfg(p["preset"])
    return _kv_per_token(cfg.replace(n_kv_heads=cfg.n_heads)) / _kv_per_token(cfg)


@route("inference.ridge_point")
def _(p):
    g = hardware.gpu(p["gpu"])
    return g.peak("bf16") / g.hbm_bandwidth_bytes_per_s


@route("inference.decode_step_time")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"]


@route("inference.prefill_time")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], p["prompt_len"], 0)["time"]


@route("inference.decode_bound")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["bound"]


@route("serving.decode_throughput")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    return p["batch"] / roofline(p["preset"], p["gpu"], p["batch"], 1, p["context"])["time"]


@route("serving.batching_speedup")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device)."""
    one = roofline(p["preset"], p["gpu"], 1, 1, 1024)["time"]
    return p["batch"] * one / roofline(p["preset"], p["gpu"], p["batch"], 1, 1024)["time"]


@route("serving.gpus_for_target")
def _(p):
    """A hand roofline on the real model's matmul weights (meta device), batch doubled while it meets the rate."""
    best = None
    b = 1
    while b <= 1024 and sequences_that_fit(p["preset"], p["gpu"], p["context"]) >= b:
        t = roofline(p["preset"], p["gpu"], b, 1, p["context"])["time"]
        if t * p["per_user"] > 1:
            break
        best = b / t
        b *= 2
    return math.ceil(p["target"] / best)


@route("serving.paged_utilization")
def _(p):
    L, bs = p["lengths"], p["block_size"]
    return sum(L) / sum(math.ceil(x / bs) * bs for x in L)


@route("serving.prefix_sharing_savings")
def _(p):
    shared = (p["prefix"] // p["block_size"]) * p["block_size"]
    return (p["n"] - 1) * shared * _kv_per_token(_cfg(p["preset"]))


@route("serving.speculative_tokens_per_step")
def _(p):
    return sum(p["alpha"] ** i for i in range(p["k"] + 1))


@route("serving.speculative_speedup")
def _(p):
    return sum(p["alpha"] ** i for i in range(p["k"] + 1)) / (p["k"] * p["c"] + 1)


@route("serving.static_batching_utilization")
def _(p):
    return sum(p["lengths"]) / (len(p["lengths"]) * max(p["lengths"]))


@route("serving.overlap_scheduling_speedup")
def _(p):
    return (p["cpu_s"] + p["model_s"]) / max(p["cpu_s"], p["model_s"])


# ---- RL ------------------------------------------------------------------------------------------------
@route("rl.gae_advantage")
def _(p):
    r, v, g, lam = p["rewards"], p["values"], p["gamma"], p["lam"]
    vals = v + [p["last_value"]]
    return sum((g * lam) ** t * (r[t] + g * vals[t + 1] - vals[t]) for t in range(len(r)))


@route("rl.ppo_clipped_objective")
def _(p):
    r, a, e = p["ratio"], p["advantage"], p["clip"]
    return min(r * a, min(max(r, 1 - e), 1 + e) * a)


@route("rl.grpo_advantage")
def _(p):
    r, i = p["rewards"], p["index"]
    mean = sum(r) / len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
    return (r[i] - mean) / (std + 1e-6)


@route("rl.dpo_loss")
def _(p):
    m = p["beta"] * ((p["pc"] - p["rc"]) - (p["pr"] - p["rr"]))
    return math.log1p(math.exp(-m))


@route("rl.kl_k3_estimate")
def _(p):
    q = p["logp_ref"] - p["logp"]
    return math.exp(q) - q - 1


def rlhf_timeline(gen_s, train_s, sync_s, *, lag: int, steps: int = 40) -> list[float]:
    """End times of the weight syncs of ``steps`` RLHF steps on a rollout worker and a trainer,
    event by event. The rollout's ops: gen(k) needs the weights of sync(k − lag) (lag 1: synchronous;
    lag 2: one step off-policy, so gen(k+1) runs while the trainer trains on batch k); train(k) needs
    gen(k); sync(k) needs train(k) and a free rollout, and occupies both workers."""
    roll = trainer = 0.0
    gen_end: dict[int, float] = {}
    sync_end: dict[int, float] = {}

    def gen(k):
        nonlocal roll
        start = max(roll, sync_end.get(k - lag, 0.0))
        roll = gen_end[k] = start + gen_s

    for k in range(lag):
        gen(k)
    for k in range(steps):
        done = max(trainer, gen_end[k]) + train_s
        sync_end[k] = roll = trainer = max(done, roll) + sync_s
        gen(k + lag)
    return [sync_end[k] for k in range(steps)]


@route("rl.async_rlhf_speedup")
def _(p):
    """Both schedules simulated event by event on a rollout worker and a trainer (rlhf_timeline)."""

    def period(lag):
        ends = rlhf_timeline(p["gen_s"], p["train_s"], p["sync_s"], lag=lag)
        return (ends[-1] - ends[len(ends) // 2]) / (len(ends) - 1 - len(ends) // 2)

    return period(1) / period(2)


# ---- cards: judge the statement shown against a number computed here -------------------------------
def _claims_number(text, pattern) -> float | None:
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def _card(fn):
    def judge(p):
        """The statement shown judged against a number computed here (never which one was drawn)."""
        return "true" if fn(p["_text"]) else "false"

    return judge


@route("cards.zero3_traffic")
@_card
def _(text):
    n = 8
    ratio = (3 * (n - 1) / n) / (2 * (n - 1) / n)  # ZeRO-3: RS + 2 AG; DDP: RS + AG (ring)
    return abs(_claims_number(text, r"sends ([\d.]+)×") - ratio) < 1e-9


@route("cards.adam_bytes_per_param")
@_card
def _(text):
    return _claims_number(text, r"needs (\d+) bytes per parameter") == 2 + 2 + 4 + 4 + 4


@route("cards.one_f_one_b_bubble")
@_card
def _(text):
    p, m = 4, 8
    gpipe = one_f_one_b = (p - 1) / (m + p - 1)  # both ramp up and down once (Narayanan et al. 2021)
    claims_half = "halves" in text
    return claims_half == (one_f_one_b <= gpipe / 2 + 1e-12)


@route("cards.twenty_tokens_per_param")
@_card
def _(text):
    from .. import scaling

    law = scaling.law("epoch")
    lo, hi = (d / n for n, d in (_optimum(law, 1e20), _optimum(law, 1e26)))
    constant = abs(hi / lo - 1) < 0.05
    return ("at every budget" in text) == constant


@route("cards.sp_traffic")
@_card
def _(text):
    n, s = 4, 1.0
    adds = (n - 1) / n * s * 2 > 2 * (n - 1) / n * s  # RS + AG vs one ring all-reduce
    return ("adds communication" in text) == adds


@route("cards.decode_bound")
@_card
def _(text):
    bound = roofline("llama-3-8b", "H100-SXM", 1, 1, 1024)["bound"]
    return ("compute-bound" in text) == (bound == "compute")


@route("cards.ring_bytes_grow")
@_card
def _(text):
    grows = 2 * (1024 - 1) / 1024 > 2  # ring all-reduce bytes per rank 2(n−1)/n·S never exceed 2S
    return ("more bytes per rank as you add ranks" in text) == grows


@route("cards.mfu_recompute")
@_card
def _(text):
    # MFU counts the model's FLOPs (6 per parameter per token, whatever is executed); full recompute
    # executes the forward twice (8 per parameter): hardware FLOPs rise, the model's do not
    model_flops, executed = 6, 2 + 2 + 4
    return ("raises HFU, not MFU" in text) == (executed > model_flops)


@route("cards.gqa_kv")
@_card
def _(text):
    cfg = _cfg("llama-2-70b")
    heads_smaller = cfg.head_dim < cfg.hidden // cfg.n_heads  # GQA keeps head_dim; it caches fewer heads
    return ("making each head smaller" in text) == heads_smaller
