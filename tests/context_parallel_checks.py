"""Checks of ``mlsys_nb.parallel.context`` run on every rank of one launch (see test_context_parallel.py).

The reference is PyTorch's ``scaled_dot_product_attention`` on the whole sequence in one process
(every rank draws the same full q, k, v from a seed and keeps its tokens). ``cp_checks()`` returns
max abs errors of outputs and of the q, k, v gradients for ring and all-gather attention, causal or
not, contiguous or zig-zag chunks, with GQA; the work each rank computed; the bytes it sent; and
the error of a deliberately broken merge that the tests expect to be large. ``memory_checks()``
measures (``LiveBytes``) the peak bytes a forward holds in groups of 1, 2 and all ranks, for the
ring, the all-gather and a ring broken on purpose to keep every K/V block it received."""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlsys_nb.comm.counting import CommCounter
from mlsys_nb.parallel import context as cpm

B, A, KV, D = 2, 4, 2, 8  # batch, query heads, KV heads (GQA), head dim
CHUNK = 4  # tokens per zig-zag chunk: s = 2·cp·CHUNK


def one_case(fn, causal, layout, seed=0):
    r, R = dist.get_rank(), dist.get_world_size()
    s = 2 * R * CHUNK
    torch.manual_seed(seed)
    q, k, v = torch.randn(B, A, s, D), torch.randn(B, KV, s, D), torch.randn(B, KV, s, D)
    dy = torch.randn(B, A, s, D)
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    (cpm.full_attention(qf, kf, vf, causal=causal) * dy).sum().backward()
    y_ref = cpm.full_attention(q, k, v, causal=causal)

    def mine(t):
        return cpm.shard_sequence(t, R, r, layout)

    ql, kl, vl = (mine(t).clone().requires_grad_() for t in (q, k, v))
    stats = {}
    with CommCounter() as fwd:
        y = fn(ql, kl, vl, causal=causal, layout=layout, stats=stats)
    with CommCounter() as bwd:
        (y * mine(dy)).sum().backward()
    return {
        "out": (y - mine(y_ref)).abs().max().item(),
        "dq": (ql.grad - mine(qf.grad)).abs().max().item(),
        "dk": (kl.grad - mine(kf.grad)).abs().max().item(),
        "dv": (vl.grad - mine(vf.grad)).abs().max().item(),
        "work": stats["work"],
        "kv_block_bytes": stats["kv_block_bytes"],
        "fwd_sent": fwd.bytes_sent,
        "bwd_sent": bwd.bytes_sent,
        "fwd_ops": {op: int(v["calls"]) for op, v in fwd.by_op().items()},
        "bwd_ops": {op: int(v["calls"]) for op, v in bwd.by_op().items()},
    }


def cp_checks():
    R = dist.get_world_size()
    res = {"world": R, "seq_len": 2 * R * CHUNK}
    for name, fn in (("ring", cpm.ring_attention), ("allgather", cpm.allgather_attention)):
        for causal in (True, False):
            for layout in cpm.LAYOUTS:
                res[f"{name}/causal={causal}/{layout}"] = one_case(fn, causal, layout)
    res["no-overlap/ring"] = one_case(lambda *t, **kw: cpm.ring_attention(*t, overlap=False, **kw), True, "zigzag")
    # the idea broken on purpose: average the blocks' outputs instead of the log-sum-exp merge
    orig = cpm.merge_partials

    def average(out, lse, bo, bl):
        return (out + bo) / 2 if torch.isfinite(lse).all() else bo, torch.logaddexp(lse, bl)

    cpm.merge_partials = average
    try:
        res["broken/merge"] = one_case(cpm.ring_attention, True, "zigzag")
    finally:
        cpm.merge_partials = orig
    res["memory"] = memory_checks()
    return res


def memory_checks(s_local=8, d=32):
    """Measured peak forward bytes per group size {1, 2, world} at fixed local tokens:
    ``{"block": bytes of one K|V block, "ring": {cp: bytes}, "allgather": ..., "keep-all": ...}``."""
    R = dist.get_world_size()
    groups = cpm.nested_groups([1, 2, R])
    torch.manual_seed(dist.get_rank())
    q, k, v = torch.randn(1, A, s_local, d), torch.randn(1, KV, s_local, d), torch.randn(1, KV, s_local, d)
    block = 2 * k.numel() * k.element_size()
    res = {"block": block}
    res["ring"] = cpm.kv_held_growth(cpm.ring_attention, q, k, v, groups)
    res["allgather"] = cpm.kv_held_growth(cpm.allgather_attention, q, k, v, groups)
    # the idea broken on purpose: a ring that keeps every block it received alive until the end
    orig, kept = cpm.RingExchange.wait, []

    def wait_and_keep(self):
        t = orig(self)
        kept.append(t)
        return t

    cpm.RingExchange.wait = wait_and_keep
    try:
        res["keep-all"] = cpm.kv_held_growth(cpm.ring_attention, q, k, v, groups)
    finally:
        cpm.RingExchange.wait = orig
        kept.clear()
    return res
