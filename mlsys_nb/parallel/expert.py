"""Expert parallelism (EP) for a mixture-of-experts layer, in one readable file.

The ``E`` routed experts are split over the ``ep`` ranks of an EP group: rank r holds experts
``[r·E/ep, (r+1)·E/ep)``; the router and the shared experts are replicated. Every rank routes its
own tokens, sends each token to the rank that holds its expert, the experts run on whatever
arrived, and the results travel back (GShard, Lepikhin et al. 2020, arXiv:2006.16668; DeepSeek-V3,
Liu et al. 2024, arXiv:2412.19437, Sec. 3.2). The communication, forward and backward:

    step                       forward                                  backward
    capacity (cf given)        all_gather of per-(slot, expert) counts  -
    split sizes                all_to_all of per-expert counts (ints)   -
    dispatch                   all_to_all of the routed tokens          all_to_all of their grads
                               (uneven splits)                          (splits swapped) = "combine"
    local experts              E/ep expert MLPs on received tokens      local autograd
    combine                    all_to_all of expert outputs back        all_to_all of output grads
                                                                        (splits swapped) = "dispatch"
    load-balancing/z-loss      all_reduce of counts, prob sums, lse²    -  (local share of the gradient)

So an MoE layer costs 2 token all-to-alls forward and 2 backward: with ``T`` local tokens, top-k
and uniform routing each moves ``k·T·h`` elements, ``(ep−1)/ep`` of them to other ranks
(``2·k·T·h·(ep−1)/ep`` elements off the rank per direction of the layer). The split sizes must be
exchanged first because the receiver allocates its buffer: that is the small all-to-all of counts.

Same tokens, same drops as the dense reference ``mlsys_nb.models.MoE``: capacity
``⌈cf·T·k/E⌉`` is over the whole group's ``T`` tokens and fills first choices first, then tokens
in global order (EP rank, then position); the all-gathered counts give each rank its offsets in
every expert's queue (``mlsys_nb.models.routing``).

Gradients: the router and shared experts see only this rank's tokens, so their gradients are this
rank's share; ``sync_replicated_grads(module)`` sums them over the EP group (the dense layer's
gradient on all tokens). Expert weights live on one rank and get every token's gradient through the
backward all-to-alls. ``last_aux_loss`` / ``last_z_loss`` have the *group's* value on every rank
while their gradient is this rank's share (sum over ranks = the dense gradient).

All collectives go through ``torch.distributed`` functions looked up at call time, so
``mlsys_nb.comm.counting.CommCounter`` counts them (the token all-to-all is
``mlsys_nb.parallel.functional.all_to_all``, re-exported here); ``last_stats`` also records the exact
token rows each rank sent to every other rank (bytes off the rank, beside the counter's model).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn

from ..config import ArgumentError, ModelConfig, check_divides, dtype_bytes

from ..models.routing import (
    GATINGS,
    check_router_args,
    load_balancing_loss,
    load_balancing_terms,
    route,
    update_bias,
    z_loss_sum,
)
from ..models.transformer import MLP
from .functional import all_to_all

__all__ = [
    "GATINGS",
    "EPMoE",
    "all_to_all",
    "check_ep_args",
    "compare_with_dense",
    "ep_bytes_per_layer",
    "load_dense_state_dict",
    "priority_testable",
    "priority_violations",
    "sync_replicated_grads",
    "tp_moe_bytes_per_layer",
]


def check_ep_args(cfg: ModelConfig, ep: int, *, gating: str = "softmax", capacity_factor=None) -> None:
    """Raise ``ArgumentError`` (a ``ValueError``) naming the parameter (call it before starting ranks)."""
    if not cfg.is_moe:
        raise ArgumentError(f"n_experts={cfg.n_experts}: expert parallelism needs an MoE config (n_experts > 0)")
    check_router_args(cfg.n_experts, cfg.top_k, gating, capacity_factor)
    check_divides("ep", ep, cfg.n_experts, "n_experts")


def priority_violations(idx: torch.Tensor, keep: torch.Tensor, n_experts: int) -> dict:
    """Where the capacity rule broke GShard's priority, expert by expert: ``{expert: (j, j2)}`` for every expert
    to which a choice of slot ``j`` (0 = first choice) was dropped while a later choice ``j2 > j`` **to the same
    expert** was kept (empty: the priority held). ``idx``/``keep`` [T, k] as in ``routing.Routing``.

    Per expert, because the queues are per expert: a token's first choice dropped at a full expert 1 says nothing
    about second choices kept at an expert 0 that still had room."""
    out = {}
    for e in range(n_experts):
        to_e = idx == e  # [T, k]
        dropped = (to_e & ~keep).any(dim=0).tolist()  # per slot: some choice of this slot to e was dropped
        kept = (to_e & keep).any(dim=0).tolist()
        bad = [(j, j2) for j in range(len(dropped)) for j2 in range(j + 1, len(kept)) if dropped[j] and kept[j2]]
        if bad:
            out[e] = bad[0]
    return out


def priority_testable(idx: torch.Tensor, keep: torch.Tensor, n_experts: int) -> list[int]:
    """Experts at which ``priority_violations`` can bite: assignments were dropped there and it was wanted as
    a first choice by some token and as a later choice by another (a rule that queued the later choices first
    would keep one of those and drop a first choice)."""
    out = []
    for e in range(n_experts):
        to_e = idx == e
        if (to_e & ~keep).any() and to_e[:, 0].any() and to_e[:, 1:].any():
            out.append(e)
    return out


class EPMoE(nn.Module):
    """The expert-parallel version of ``mlsys_nb.models.MoE`` (same options, same results).

    ``forward(x)`` with x [b, s, h] (this rank's tokens) returns [b, s, h]. Every rank of the group
    must call it (it communicates) with the same number of tokens. After a forward:
    ``last_routing`` (this rank's tokens; ``position`` is global), ``last_dropped`` (group total),
    ``last_load`` (kept assignments per expert, group total), ``last_aux_loss``, ``last_z_loss``,
    ``last_stats`` (send/recv rows per rank, bytes)."""

    def __init__(self, cfg: ModelConfig, *, gating: str = "softmax", capacity_factor: float | None = None, group=None):
        super().__init__()
        ep = dist.get_world_size(group)
        check_ep_args(cfg, ep, gating=gating, capacity_factor=capacity_factor)
        self.cfg, self.gating, self.capacity_factor, self.group = cfg, gating, capacity_factor, group
        self.ep, self.rank = ep, dist.get_rank(group)
        self.n_local = cfg.n_experts // ep
        self.first_expert = self.rank * self.n_local
        self.router = nn.Linear(cfg.hidden, cfg.n_experts, bias=False)
        self.experts = nn.ModuleList(MLP(cfg, cfg.expert_ffn_hidden) for _ in range(self.n_local))
        self.shared = nn.ModuleList(MLP(cfg, cfg.expert_ffn_hidden) for _ in range(cfg.n_shared_experts))
        self.register_buffer("router_bias", torch.zeros(cfg.n_experts), persistent=False)
        self.last_routing = self.last_aux_loss = self.last_z_loss = self.last_load = None
        self.last_dropped, self.last_stats = 0, {}

    # -- routing with the group's capacity ------------------------------------------------------
    def route_tokens(self, flat):
        E, k = self.cfg.n_experts, self.cfg.top_k
        T_local = flat.shape[0]
        logits = self.router(flat)
        if self.capacity_factor is None:
            r = route(logits, k, gating=self.gating, bias=self.router_bias)
            return r, T_local * self.ep
        # dry run for the counts, then offsets: earlier slots (all ranks) + this slot on earlier ranks
        probe = route(logits.detach(), k, gating=self.gating, bias=self.router_bias)
        counts = probe.slot_counts(E)  # [k, E]
        every = counts.new_empty((self.ep * k, E))
        dist.all_gather_into_tensor(every, counts.contiguous(), group=self.group)
        every = every.view(self.ep, k, E)
        per_slot = every.sum(dim=0)  # [k, E] group totals
        offset = (per_slot.cumsum(0) - per_slot) + every[: self.rank].sum(dim=0)
        T = T_local * self.ep
        r = route(
            logits,
            k,
            gating=self.gating,
            bias=self.router_bias,
            capacity_factor=self.capacity_factor,
            n_tokens=T,
            offset=offset,
        )
        return r, T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        flat = x.reshape(-1, h)
        E = self.cfg.n_experts
        r, T = self.route_tokens(flat)

        # 1. which (token, slot) goes where: kept assignments sorted by expert (= by owner rank)
        token, slot = r.keep.nonzero(as_tuple=True)
        expert = r.idx[token, slot]
        order = torch.argsort(expert, stable=True)
        token, slot, expert = token[order], slot[order], expert[order]
        per_expert = torch.bincount(expert, minlength=E)  # [E] rows to each expert

        # 2. exchange the counts first: rank j learns how many rows of each of its experts come
        recv_per_expert = torch.empty_like(per_expert)
        dist.all_to_all_single(recv_per_expert, per_expert, group=self.group)
        recv_matrix = recv_per_expert.view(self.ep, self.n_local)  # [source rank, local expert]
        in_splits = per_expert.view(self.ep, self.n_local).sum(1).tolist()
        out_splits = recv_matrix.sum(1).tolist()

        # 3. dispatch, 4. local experts, 5. combine
        received = all_to_all(flat[token], in_splits, out_splits, self.group)
        local_expert = (
            torch.arange(self.n_local, device=x.device).repeat(self.ep).repeat_interleave(recv_matrix.reshape(-1))
        )
        y = torch.zeros_like(received)
        for le, mlp in enumerate(self.experts):
            rows = (local_expert == le).nonzero(as_tuple=True)[0]
            if rows.numel():
                y = y.index_add(0, rows, mlp(received[rows]))
        back = all_to_all(y, out_splits, in_splits, self.group)
        out = torch.zeros_like(flat).index_add(0, token, back * r.weight[token, slot, None])
        for mlp in self.shared:
            out = out + mlp(flat)

        self._record(r, T, in_splits, out_splits, h, flat.element_size())
        return out.view(b, s, h)

    def _record(self, r, T, in_splits, out_splits, h, elem):
        """Group-wide losses (value of the group, gradient of this rank's share), load and bytes."""
        E, k = self.cfg.n_experts, self.cfg.top_k
        counts, prob_sums = load_balancing_terms(r, E)
        lse2 = z_loss_sum(r.logits)
        totals = torch.cat(
            [counts.detach(), prob_sums.detach(), lse2.detach().view(1), r.counts(E, kept_only=True).to(counts.dtype)]
        )
        dist.all_reduce(totals, group=self.group)
        g_counts, g_probs, g_lse2, g_load = totals[:E], totals[E : 2 * E], totals[2 * E], totals[2 * E + 1 :]
        local_aux = load_balancing_loss(g_counts, prob_sums, T, k)
        group_aux = load_balancing_loss(g_counts, g_probs, T, k)
        self.last_aux_loss = local_aux + (group_aux - local_aux).detach()
        self.last_z_loss = lse2 / T + ((g_lse2 - lse2) / T).detach()
        self.last_load = g_load.round().long()
        self.last_dropped = int(T * k - g_load.sum().item())
        self.last_routing = r
        off = [n for j, n in enumerate(in_splits) if j != self.rank]
        self.last_stats = {
            "send_rows": list(in_splits),
            "recv_rows": list(out_splits),
            # token rows leaving this rank in one all-to-all (dispatch fwd; the same in combine bwd)
            "dispatch_bytes_off_rank": sum(off) * h * elem,
            "combine_bytes_off_rank": sum(n for j, n in enumerate(out_splits) if j != self.rank) * h * elem,
        }

    def update_bias(self, gamma: float = 1e-3) -> None:
        """Auxiliary-loss-free step on ``router_bias`` from the group's load of the last forward
        (all ranks apply the same update: the bias stays replicated)."""
        load = self.last_routing.counts(self.cfg.n_experts).to(self.router_bias.dtype)
        dist.all_reduce(load, group=self.group)
        update_bias(self.router_bias, load, gamma)

    def shard_map(self, prefix=""):
        """Full-model name -> (local parameter, replicated?) for every local tensor."""
        m = {prefix + "router.weight": (self.router.weight, True)}
        for i, mlp in enumerate(self.experts):
            for n, p in mlp.named_parameters():
                m[f"{prefix}experts.{self.first_expert + i}.{n}"] = (p, False)
        for i, mlp in enumerate(self.shared):
            for n, p in mlp.named_parameters():
                m[f"{prefix}shared.{i}.{n}"] = (p, True)
        return m


def load_dense_state_dict(module: EPMoE, full_state: dict, *, router_bias: torch.Tensor | None = None) -> None:
    """Copy this rank's experts, the router and the shared experts from the dense ``MoE``'s
    ``state_dict()`` (``router_bias``: the dense layer's bias buffer, not in its state dict)."""
    with torch.no_grad():
        for key, (p, _) in module.shard_map().items():
            if key not in full_state:
                raise KeyError(f"the full state dict has no {key!r}")
            p.copy_(full_state[key])
        if router_bias is not None:
            module.router_bias.copy_(router_bias)


def sync_replicated_grads(module: EPMoE) -> None:
    """Sum the router's and shared experts' gradients over the EP group (each rank saw only its
    tokens); afterwards they equal the dense layer's gradient on all the group's tokens."""
    for p, replicated in module.shard_map().values():
        if replicated and p.grad is not None:
            dist.all_reduce(p.grad, group=module.group)


def compare_with_dense(module: EPMoE, full_tensors: dict, *, grads: bool = True) -> dict:
    """Max abs difference of every local parameter (or gradient) with the dense one of the same
    name. A missing gradient (an expert no token reached) counts as zeros on either side."""
    out = {}
    for key, (p, _) in module.shard_map().items():
        mine, ref = (p.grad if grads else p), full_tensors[key]
        mine = torch.zeros_like(p) if mine is None else mine.detach()
        ref = torch.zeros_like(p) if ref is None else ref.detach()
        out[key] = (mine - ref).abs().max().item()
    return out


# ---- closed forms (model bytes; the test pins them against the counter) ------------------------
def ep_bytes_per_layer(tokens: int, hidden: int, top_k: int, ep: int, dtype="bf16") -> dict:
    """Bytes one rank sends per MoE layer under EP with uniform routing and no drops:
    dispatch and combine each move ``k·T·h`` elements, ``(ep−1)/ep`` of them off the rank; the
    backward repeats both. ``tokens``: this rank's tokens T."""
    one = top_k * tokens * hidden * (ep - 1) / ep * dtype_bytes(dtype)
    return {"forward": 2 * one, "backward": 2 * one, "step": 4 * one}


def tp_moe_bytes_per_layer(tokens: int, hidden: int, tp: int, dtype="bf16") -> dict:
    """Bytes one rank sends per MoE layer when each expert is split Megatron-style over ``tp``
    ranks instead: every rank holds all ``T`` tokens and the layer ends with one all-reduce of
    ``T·h`` (ring: ``2(tp−1)/tp·T·h``) in forward and one in backward."""
    one = 2 * (tp - 1) / tp * tokens * hidden * dtype_bytes(dtype)
    return {"forward": one, "backward": one, "step": 2 * one}
