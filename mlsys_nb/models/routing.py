"""Mixture-of-experts routing, shared by the dense ``MoE`` reference and expert parallelism.

One token ``x`` has router logits ``z = x·W_rᵀ`` (one per expert, ``E`` experts). Two gatings:

- ``gating="softmax"`` (Switch, GShard, Mixtral): ``p = softmax(z)``; the token goes to the ``k``
  experts with the largest ``p`` and their weights are ``p`` renormalised over those ``k``.
- ``gating="sigmoid"`` (DeepSeek-V3, Liu et al. 2024, arXiv:2412.19437, Sec. 2.1.2): scores
  ``s = sigmoid(z)``; the ``k`` experts are chosen by ``s + b`` where ``b`` is a per-expert bias
  that is *not trained by gradients*: after each step ``b_e += γ·sign(mean load − load_e)``
  (auxiliary-loss-free balancing, ``update_bias``); the weights are ``s`` renormalised over the
  chosen ``k`` (the bias steers the choice only).

Capacity (Switch, Fedus et al. 2021, arXiv:2101.03961, Sec. 2.2): with ``capacity_factor = cf`` each
expert takes at most ``C = ⌈cf·T·k/E⌉`` assignments out of the ``T`` tokens of the whole group; the
rest are **dropped** (that expert contributes nothing to the token; the residual connection around
the layer carries the token on). The drop rule is pinned so the expert-parallel layer and the
dense reference drop the same tokens: assignments fill an expert in the order (slot, token): every
token's first choice before any second choice (GShard's priority), tokens in global order (EP rank
major, then position in the rank's flattened ``[b, s]`` batch). ``capacity_factor=None``: no drops.

Losses (each returned unscaled; multiply by your coefficient):

- load-balancing loss (Switch, Sec. 2.2; GShard): ``E · Σ_e f_e · P_e`` with ``f_e`` = fraction of the
  ``T·k`` assignments routed to ``e`` (before drops, not differentiable) and ``P_e`` = mean over
  tokens of the router probability of ``e`` (softmax ``p``; for sigmoid gating ``s / Σ s``). It is
  1.0 at perfectly uniform routing and grows as routing concentrates (``E`` at the worst, k = 1).
- router z-loss (Zoph et al. 2022, ST-MoE, arXiv:2202.08906, Sec. 3): mean over tokens of
  ``logsumexp(z)²``; keeps logits small (numerically safe in bf16).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..config import check_choice, check_int, check_number


GATINGS = ("softmax", "sigmoid")


def check_router_args(n_experts: int, top_k: int, gating: str, capacity_factor) -> None:
    """Raise ``ArgumentError`` (a ``ValueError``) naming the parameter for an impossible router setting."""
    check_int("n_experts", n_experts, 1)
    check_int(f"top_k (n_experts={n_experts})", top_k, 1, n_experts)
    check_choice("gating", gating, GATINGS)
    if capacity_factor is not None:  # None: no drops
        check_number("capacity_factor (or None: no drops)", capacity_factor, 0, lo_open=True)


def capacity(capacity_factor, n_tokens: int, top_k: int, n_experts: int) -> int | None:
    """Assignments one expert accepts: ``⌈cf·T·k/E⌉`` over the group's ``T`` tokens (None: no limit)."""
    if capacity_factor is None:
        return None
    return math.ceil(capacity_factor * n_tokens * top_k / n_experts)


@dataclass
class Routing:
    """The router's decisions for ``T`` tokens (one rank's tokens under EP).

    ``idx`` [T, k] chosen experts (slot 0 = first choice); ``weight`` [T, k] their gate weights
    (differentiable); ``keep`` [T, k] False where the assignment was dropped by capacity;
    ``position`` [T, k] the assignment's place in its expert's queue (global under EP);
    ``probs`` [T, E] probabilities used by the load-balancing loss (differentiable); ``logits``."""

    idx: torch.Tensor
    weight: torch.Tensor
    keep: torch.Tensor
    position: torch.Tensor
    probs: torch.Tensor
    logits: torch.Tensor
    capacity: int | None

    @property
    def dropped(self) -> int:
        return int((~self.keep).sum())

    def counts(self, n_experts: int, kept_only: bool = False) -> torch.Tensor:
        """Assignments per expert [E] (int64), before drops unless ``kept_only``."""
        idx = self.idx[self.keep] if kept_only else self.idx.reshape(-1)
        return torch.bincount(idx.reshape(-1), minlength=n_experts)

    def slot_counts(self, n_experts: int) -> torch.Tensor:
        """Assignments per (slot, expert) [k, E] before drops: what the capacity rule needs."""
        k = self.idx.shape[1]
        flat = self.idx.t().reshape(-1) + n_experts * torch.arange(k, device=self.idx.device).repeat_interleave(
            self.idx.shape[0]
        )
        return torch.bincount(flat, minlength=k * n_experts).view(k, n_experts)


def choose(logits: torch.Tensor, top_k: int, gating: str = "softmax", bias: torch.Tensor | None = None):
    """Top-k choice and gate weights: returns (idx [T, k], weight [T, k], probs [T, E])."""
    if gating == "softmax":
        probs = logits.softmax(dim=-1)
        weight, idx = probs.topk(top_k, dim=-1)
    elif gating == "sigmoid":
        scores = logits.sigmoid()
        sel = scores if bias is None else scores + bias
        idx = sel.detach().topk(top_k, dim=-1).indices
        weight = scores.gather(-1, idx)
        probs = scores / scores.sum(dim=-1, keepdim=True)
    else:
        check_choice("gating", gating, GATINGS)
    return idx, weight / weight.sum(dim=-1, keepdim=True), probs


def assignment_positions(idx: torch.Tensor, n_experts: int, offset: torch.Tensor | None = None) -> torch.Tensor:
    """Place of every assignment in its expert's queue, filled slot by slot (all first choices,
    then all second choices, ...), tokens in order within a slot. ``offset`` [k, E]: assignments
    to each expert queued before this rank's slot-j ones (earlier slots and earlier EP ranks);
    ``None`` means this is the whole group (earlier slots of these tokens only)."""
    onehot = torch.nn.functional.one_hot(idx.t(), n_experts)  # [k, T, E]
    within = onehot.cumsum(dim=1) - onehot  # earlier tokens of the same slot
    if offset is None:
        per_slot = onehot.sum(dim=1)  # [k, E]
        offset = per_slot.cumsum(dim=0) - per_slot
    pos = (within + offset[:, None, :]).gather(2, idx.t().unsqueeze(-1)).squeeze(-1)  # [k, T]
    return pos.t()


def route(
    logits: torch.Tensor,
    top_k: int,
    *,
    gating: str = "softmax",
    bias=None,
    capacity_factor=None,
    n_tokens: int | None = None,
    offset: torch.Tensor | None = None,
) -> Routing:
    """Route ``T`` tokens given their router ``logits`` [T, E]. ``n_tokens``: the group's token
    count ``T`` for the capacity (default this call's T); ``offset``: see ``assignment_positions``."""
    n_experts = logits.shape[-1]
    idx, weight, probs = choose(logits, top_k, gating, bias)
    pos = assignment_positions(idx, n_experts, offset)
    cap = capacity(capacity_factor, n_tokens or logits.shape[0], top_k, n_experts)
    keep = torch.ones_like(idx, dtype=torch.bool) if cap is None else pos < cap
    return Routing(idx, weight, keep, pos, probs, logits, cap)


def load_balancing_terms(r: Routing, n_experts: int):
    """The two sums the load-balancing loss needs, over these tokens: assignments per expert
    [E] (float, no gradient) and router probability summed over tokens [E] (differentiable)."""
    return r.counts(n_experts).to(r.probs.dtype), r.probs.sum(dim=0)


def load_balancing_loss(counts: torch.Tensor, prob_sums: torch.Tensor, n_tokens: int, top_k: int) -> torch.Tensor:
    """``E · Σ_e f_e · P_e`` with ``f_e = counts_e / (T·k)`` and ``P_e = prob_sums_e / T``."""
    n_experts = counts.shape[0]
    return n_experts * (counts / (n_tokens * top_k) * prob_sums / n_tokens).sum()


def z_loss_sum(logits: torch.Tensor) -> torch.Tensor:
    """Σ over tokens of ``logsumexp(z)²`` (divide by the group's T for the z-loss)."""
    return logits.float().logsumexp(dim=-1).square().sum()


@torch.no_grad()
def update_bias(bias: torch.Tensor, load: torch.Tensor, gamma: float) -> torch.Tensor:
    """DeepSeek-V3's auxiliary-loss-free step: ``b_e += γ·sign(mean load − load_e)`` (in place):
    overloaded experts become less attractive, underloaded ones more."""
    load = load.to(bias.dtype)
    bias += gamma * torch.sign(load.mean() - load)
    return bias
