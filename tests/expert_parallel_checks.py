"""Checks of ``mlsys_nb.parallel.expert`` run on every rank of one launch (see test_expert_parallel.py).

The reference is the package's dense ``mlsys_nb.models.MoE`` run in one process on the whole
group's tokens (every rank builds it from the same seed and keeps its rows of the batch).
``ep_checks()`` returns a dict of max abs errors (``err/...``), drop counts, losses, byte counts
and the results of deliberately broken variants (``broken/...``) that the tests expect to fail.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mlsys_nb.comm.counting import CommCounter
from mlsys_nb.config import ModelConfig
from mlsys_nb.models import routing
from mlsys_nb.models.transformer import MoE
from mlsys_nb.parallel import expert as ep

B, S, H = 2, 8, 16  # per rank: B sequences of S tokens, hidden H


def make_cfg(world, top_k=2, shared=0):
    return ModelConfig(
        n_layers=1,
        hidden=H,
        n_heads=2,
        vocab_size=32,
        seq_len=S,
        n_experts=2 * world,
        top_k=top_k,
        expert_ffn_hidden=24,
        n_shared_experts=shared,
    )


def _err(a, b):
    return (a.detach() - b.detach()).abs().max().item()


def one_case(cfg, *, gating="softmax", cf=None, skew=0.0, uniform=False, seed=0, counter=False):
    """Dense MoE on all tokens vs EPMoE on this rank's tokens: outputs, input grads, every weight
    grad (after summing the replicated ones), drops, load and the two losses."""
    r, R = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed)
    full = MoE(cfg, gating=gating, capacity_factor=cf)
    x = torch.randn(R * B, S, H)
    with torch.no_grad():
        if skew:  # uneven routing: the tokens lean towards u, and experts 0 and 1 like u
            u = torch.nn.functional.normalize(torch.randn(H), dim=0)
            x += u
            full.router.weight[:2] += skew * u
        if gating == "sigmoid":
            full.router_bias.copy_(0.2 * torch.randn(cfg.n_experts))
        if uniform:  # token t -> experts 2t, 2t+1 (mod E): every rank sends k·T/ep rows to every rank
            E = cfg.n_experts
            full.router.weight.zero_()
            full.router.weight[:, :E] = 10 * torch.eye(E)
            t = torch.arange(B * S)
            xl = torch.zeros(B * S, H)
            xl[t, (2 * t) % E] = 1.0
            xl[t, (2 * t + 1) % E] = 0.5
            x = xl.view(B, S, H).repeat(R, 1, 1)
    dy = torch.randn(R * B, S, H)
    xr = x.clone().requires_grad_()
    y = full(xr)
    ((y * dy).sum() + 0.3 * full.last_aux_loss + 0.1 * full.last_z_loss).backward()

    m = ep.EPMoE(cfg, gating=gating, capacity_factor=cf)
    ep.load_dense_state_dict(m, full.state_dict(), router_bias=full.router_bias)
    rows = slice(r * B, (r + 1) * B)
    xl = x[rows].clone().requires_grad_()
    with CommCounter() as cc:
        yl = m(xl)
        ((yl * dy[rows]).sum() + 0.3 * m.last_aux_loss + 0.1 * m.last_z_loss).backward()
    ep.sync_replicated_grads(m)
    grads = ep.compare_with_dense(m, {n: p.grad for n, p in full.named_parameters()})
    out = {
        "out": _err(yl, y[rows]),
        "dx": _err(xl.grad, xr.grad[rows]),
        "grad": max(grads.values()),
        "n_grads": len(grads),
        "dropped": (m.last_dropped, full.last_dropped),
        "load": (m.last_load.tolist(), full.last_load.tolist()),
        "aux": (m.last_aux_loss.item(), full.last_aux_loss.item()),
        "z": (m.last_z_loss.item(), full.last_z_loss.item()),
        "stats": dict(m.last_stats),
        "capacity": full.last_routing.capacity,
        "demand": full.last_routing.counts(cfg.n_experts).tolist(),
    }
    if counter:
        out["records"] = [(rec.op, rec.payload_bytes, rec.bytes_sent) for rec in cc.records]
    return out


def broken_local_capacity(cfg, cf, skew, seed=0):
    """The idea broken on purpose: capacity counted per rank (its own T/ep tokens) instead of over
    the group in global order. The EP layer then drops other tokens than the dense reference."""
    orig = ep.EPMoE.route_tokens

    def local(self, flat):
        logits = self.router(flat)
        return routing.route(
            logits, cfg.top_k, gating=self.gating, bias=self.router_bias, capacity_factor=self.capacity_factor
        ), flat.shape[0] * self.ep

    ep.EPMoE.route_tokens = local
    try:
        res = one_case(cfg, cf=cf, skew=skew, seed=seed)
    finally:
        ep.EPMoE.route_tokens = orig
    return res


def wire_case():
    """Bytes this rank's sockets really received in one EP forward (``mlsys_nb.comm.wire``) vs the
    token rows the splits say crossed ranks (what a rank receives in the dispatch is what it sends
    back in the combine, and vice versa); wide tokens so the payload dwarfs the count messages."""
    from mlsys_nb.comm.wire import WireCounter, available, calibrate_baseline

    if not available():
        return None
    r, R = dist.get_rank(), dist.get_world_size()
    cfg = ModelConfig(
        n_layers=1, hidden=512, n_heads=2, vocab_size=32, seq_len=64, n_experts=2 * R, top_k=2, expert_ffn_hidden=8
    )
    torch.manual_seed(0)
    m = ep.EPMoE(cfg, capacity_factor=1.25)
    torch.manual_seed(1 + r)
    x = torch.randn(2, 64, 512)
    with torch.no_grad():
        m(x)  # gloo opens its pair connections lazily: warm every path first
        dist.barrier()
        base = calibrate_baseline(dist.barrier)
        with WireCounter(baseline=base) as w:
            m(x)
            dist.barrier()
    st = m.last_stats
    # received: data that arrived (the fence guarantees it); "acked" sent bytes may lag by a delayed ACK
    return {
        "wire_received": w.bytes_received,
        "wire_sent": w.bytes_sent,
        "rows_off_rank_bytes": st["dispatch_bytes_off_rank"] + st["combine_bytes_off_rank"],
    }


def ep_checks():
    R = dist.get_world_size()
    res = {"world": R}
    cfg = make_cfg(R)
    cases = {
        "softmax/no-drop": one_case(cfg),
        "softmax/skew/cf=1.0": one_case(cfg, cf=1.0, skew=4.0, counter=True),
        "softmax/shared/cf=1.25": one_case(make_cfg(R, shared=1), cf=1.25, skew=2.0),
        "sigmoid/bias/cf=0.8": one_case(cfg, gating="sigmoid", cf=0.8, skew=2.0),
        "softmax/top1/cf=0.5": one_case(make_cfg(R, top_k=1), cf=0.5, skew=4.0),
        "uniform": one_case(cfg, uniform=True, counter=True),
    }
    res["cases"] = cases
    res["wire"] = wire_case()
    res["broken/local_capacity"] = broken_local_capacity(cfg, 1.0, 4.0)
    # bias balancing on the group: the same update on every rank keeps the bias replicated
    m = ep.EPMoE(cfg, gating="sigmoid")
    torch.manual_seed(1)
    m(torch.randn(B, S, H))
    m.update_bias(0.01)
    b = m.router_bias.clone()
    every = [torch.empty_like(b) for _ in range(R)]
    dist.all_gather(every, b)
    res["bias_replicated"] = all(torch.equal(e, b) for e in every)
    res["bias_nonzero"] = bool(b.abs().sum() > 0)
    res["local_expert_params"] = sum(p.numel() for p in m.experts.parameters())
    return res
