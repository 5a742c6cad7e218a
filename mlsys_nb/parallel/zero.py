"""ZeRO stages 1, 2 and 3 from scratch (Rajbhandari et al. 2020), with reduce-scatter and all-gather.

Plain data parallelism keeps N identical copies of the parameters, gradients and optimizer
states. ZeRO removes the redundancy by giving each of the N ranks one shard of them:

- stage 1 shards the **optimizer states**: after backward, each unit's gradient is reduce-scattered
  (rank r receives the sum of shard r), rank r updates only parameter shard r with its own
  optimizer states, and the updated shards are all-gathered back into the full parameters.
- stage 2 also shards the **gradients**: during backward, as soon as a unit's gradients are all
  ready they are reduce-scattered and only the rank's shard is kept; the full gradients are freed.
- stage 3 (FSDP's full sharding) also shards the **parameters**: a unit's full parameters exist only
  while it computes. A forward pre-hook all-gathers them and a forward post-hook frees them; when
  the gradient of the unit's output arrives in backward they are gathered again, and freed after
  the unit's gradients are reduce-scattered. ``prefetch=True`` starts gathering the next unit
  (forward) or the previous one (backward) asynchronously while the current one computes.

Layout: the model is split into *units* (default: the embedding, each transformer block, the
final norm, the LM head; in forward order). Each unit's parameters are flattened into one buffer,
zero-padded to a multiple of N and cut into N equal contiguous shards (FSDP1's FlatParameter).
The module's parameters become views into that buffer, and the optimizer (any *elementwise* one:
SGD, Adam, AdamW...) is built on the N-th shards only. Everything is in the parameters' dtype
(fp32 here), so the shard is also the master copy.

Communication per step per rank (Rajbhandari et al. 2020, arXiv:1910.02054, §7; elements): stages 1
and 2 reduce-scatter the
gradients and all-gather the parameters, ``2(N-1)/N·Ψ`` like DDP's all-reduce; stage 3 all-gathers
the parameters twice (forward and backward) and reduce-scatters once, ``3(N-1)/N·Ψ`` = 1.5× DDP.

Usage (the optimizer factory receives the list of shard parameters):

    zero = ZeRO(model, lambda ps: torch.optim.AdamW(ps, lr=1e-3), stage=3, prefetch=True)
    loss = model(x, y); loss.backward(); zero.step(); zero.zero_grad()
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ..comm.cost import bytes_sent_per_rank
from ..config import check_choice, dtype_bytes
from ..models.measure import default_units  # the model's units; memory's exact layouts read them there too

from torch import nn

STAGES = (1, 2, 3)


class FlatUnit:
    """One unit's parameters as a flat padded buffer ``full`` of N equal shards; ``shard`` is ours."""

    def __init__(self, index: int, module: nn.Module, params: list[nn.Parameter], stage: int, group=None):
        self.index, self.module, self.params, self.stage, self.group = index, module, params, stage, group
        self.world, rank = dist.get_world_size(group), dist.get_rank(group)
        self.numel = sum(p.numel() for p in params)
        self.shard_numel = math.ceil(self.numel / self.world)
        self.padded_numel = self.shard_numel * self.world
        self.lo = rank * self.shard_numel
        full = torch.zeros(self.padded_numel, dtype=params[0].dtype, device=params[0].device)
        with torch.no_grad():
            torch.cat([p.reshape(-1) for p in params], out=full[: self.numel])
        dist.broadcast(full, src=dist.get_global_rank(group, 0) if group else 0, group=group)
        self.full = full
        own = full[self.lo : self.lo + self.shard_numel]
        # stages 1-2 keep the full parameters, so our shard is simply a view of our slice of them
        self.shard = nn.Parameter(own if stage < 3 else own.clone())
        offset = 0
        for p in params:  # the module's parameters become views into the flat buffer
            p.data = full[offset : offset + p.numel()].view_as(p)
            offset += p.numel()
        if stage == 1:  # full gradients, in one flat buffer whose slices are the p.grad
            self.grad_full = torch.zeros_like(full)
            offset = 0
            for p in params:
                p.grad = self.grad_full[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
            self.shard.grad = self.grad_full[self.lo : self.lo + self.shard_numel]
        else:  # only our shard of the gradient persists
            self.shard.grad = torch.zeros_like(self.shard)
        self.pending = len(params)  # gradients still to arrive in this backward
        self.work = None  # in-flight async all-gather
        self.gathered = True
        self.backward_started = False
        if stage == 3:
            self.free()

    # -- parameters ---------------------------------------------------------------------------
    def gather(self, async_op: bool = False) -> None:
        """All-gather the shards into the full parameters (no-op if they are already there)."""
        if self.gathered:
            return
        self.full.untyped_storage().resize_(self.padded_numel * self.full.element_size())
        self.work = dist.all_gather_single(self.full, self.shard.detach(), group=self.group, async_op=async_op)
        self.gathered = True

    def wait(self) -> None:
        if self.work is not None:
            self.work.wait()
            self.work = None

    def free(self) -> None:
        """Release the full parameters' memory; the parameter views stay, pointing at no bytes."""
        self.wait()
        self.full.untyped_storage().resize_(0)
        self.gathered = False

    def gather_updated(self) -> None:
        """Stages 1-2, after the step: every rank's updated shard into everyone's full parameters."""
        own = self.shard.detach().clone()  # input must not alias the output buffer
        dist.all_gather_single(self.full, own, group=self.group)

    # -- gradients ----------------------------------------------------------------------------
    def reduce_scatter(self, flat_grad: torch.Tensor) -> torch.Tensor:
        """Mean over ranks of our shard of ``flat_grad`` (padded length): reduce-scatter(SUM) / N."""
        out = torch.empty(self.shard_numel, dtype=flat_grad.dtype, device=flat_grad.device)
        dist.reduce_scatter_single(out, flat_grad, op=dist.ReduceOp.SUM, group=self.group)
        return out.div_(self.world)

    def reduce_grads_stage1(self) -> None:
        self.shard.grad.copy_(self.reduce_scatter(self.grad_full))

    def reduce_grads_and_release(self) -> None:
        """Stages 2-3: reduce-scatter the unit's fresh gradients into our shard's, free the rest."""
        pad = self.padded_numel - self.numel
        flat = torch.cat([p.grad.reshape(-1) for p in self.params] + [self.full.new_zeros(pad)])
        self.shard.grad += self.reduce_scatter(flat)
        for p in self.params:
            p.grad = None


class ZeRO:
    """ZeRO stage 1, 2 or 3 over ``model`` (in place) with an optimizer on the local shards.

    ``make_optimizer(list_of_shard_params)`` builds the inner optimizer (elementwise only).
    ``units``: modules whose parameters are flattened and (stage 3) gathered together, in forward
    order; default ``default_units(model)``. ``prefetch`` (stage 3 only): overlap the next unit's
    all-gather with the current unit's compute. Call ``step()`` after backward and ``zero_grad()``
    (not ``model.zero_grad()``) between steps. Every parameter must get a gradient in every backward.
    """

    def __init__(self, model: nn.Module, make_optimizer, *, stage: int, units=None, prefetch: bool = False, group=None):
        check_choice("stage", stage, STAGES)
        if prefetch and stage != 3:
            raise ValueError(f"prefetch=True needs stage=3 (got stage={stage}): only stage 3 gathers parameters")
        self.model, self.stage, self.prefetch, self.group = model, stage, prefetch, group
        modules = list(units) if units is not None else default_units(model)
        owner: dict[int, int] = {}
        for i, m in enumerate(modules):
            for p in m.parameters():
                if id(p) in owner and stage == 3:
                    raise NotImplementedError(
                        f"a parameter is shared by units {owner[id(p)]} and {i} (tied embeddings?): "
                        "this from-scratch stage 3 gathers each unit separately and does not support it"
                    )
                owner.setdefault(id(p), i)
        missing = [n for n, p in model.named_parameters() if id(p) not in owner]
        if missing:
            raise ValueError(f"units do not cover parameters {missing}: pass units=... covering all of them")
        self.units = []
        for i, m in enumerate(modules):
            params = [p for p in m.parameters() if owner[id(p)] == i]
            if params:
                self.units.append(FlatUnit(len(self.units), m, params, stage, group))
        self.optimizer = make_optimizer([u.shard for u in self.units])
        self.peak_gathered_bytes = 0  # stage 3: most full-parameter bytes alive at once (a high-water mark)
        if stage >= 2:
            for u in self.units:
                for p in u.params:
                    p.register_post_accumulate_grad_hook(self.grad_hook(u))
        if stage == 3:
            for u in self.units:
                u.module.register_forward_pre_hook(self.pre_forward_hook(u))
                u.module.register_forward_hook(self.post_forward_hook(u))

    # -- hooks ----------------------------------------------------------------------------
    def _neighbour(self, unit: FlatUnit, step: int) -> FlatUnit | None:
        j = unit.index + step
        return self.units[j] if 0 <= j < len(self.units) else None

    def _track(self) -> None:
        now = sum(u.padded_numel * u.full.element_size() for u in self.units if u.gathered)
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, now)

    def pre_forward_hook(self, unit: FlatUnit):
        """Stage 3: before ``unit`` runs forward, gather its parameters (and, with ``prefetch``, start the next
        unit's all-gather)."""

        def hook(module, args):
            unit.gather()
            unit.wait()
            nxt = self._neighbour(unit, +1)
            if self.prefetch and nxt is not None:
                nxt.gather(async_op=True)
            self._track()

        return hook

    def post_forward_hook(self, unit: FlatUnit):
        """Stage 3: after ``unit``'s forward, free its parameters and hook its outputs, so that their
        gradient gathers the parameters again before the unit's backward."""

        def hook(module, args, output):
            unit.free()  # autograd's saved views point into the freed buffer; refilled before backward
            unit.backward_started = False
            if torch.is_grad_enabled():
                outs = output if isinstance(output, (tuple, list)) else [output]
                for t in outs:
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        t.register_hook(self.pre_backward_hook(unit))
            return output

        return hook

    def pre_backward_hook(self, unit: FlatUnit):
        """Stage 3: a gradient hook on ``unit``'s outputs; the first one to fire gathers its parameters for the
        backward (and, with ``prefetch``, starts the previous unit's all-gather)."""

        def hook(grad):
            if not unit.backward_started:
                unit.backward_started = True
                unit.gather()
                unit.wait()
                prev = self._neighbour(unit, -1)
                if self.prefetch and prev is not None:
                    prev.gather(async_op=True)
                self._track()
            return grad

        return hook

    def grad_hook(self, unit: FlatUnit):
        """Stages 2-3: the ``post_accumulate_grad_hook`` of each parameter of ``unit``. When the unit's last
        gradient lands, reduce-scatter its gradients into this rank's shard and drop the full gradients
        (stage 3 also frees the gathered parameters)."""

        def hook(param):
            unit.pending -= 1
            if unit.pending == 0:  # the unit's backward is done: shard its gradients now
                unit.reduce_grads_and_release()
                unit.pending = len(unit.params)
                if self.stage == 3:
                    unit.free()

        return hook

    # -- optimizer --------------------------------------------------------------------------
    def step(self) -> None:
        for u in self.units:
            if self.stage == 1:
                u.reduce_grads_stage1()
            elif u.pending != len(u.params):
                raise RuntimeError(f"unit {u.index}: {u.pending} parameter(s) got no gradient in this backward")
        self.optimizer.step()
        if self.stage < 3:
            for u in self.units:
                u.gather_updated()

    def zero_grad(self) -> None:
        for u in self.units:
            (u.grad_full if self.stage == 1 else u.shard.grad).zero_()

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """{name: copy of the full parameter} (stage 3 gathers each unit temporarily)."""
        out = {}
        for u in self.units:
            was = u.gathered
            u.gather()
            u.wait()
            for p in u.params:
                out[id(p)] = p.detach().clone()
            if not was:
                u.free()
        return {n: out[id(p)] for n, p in self.model.named_parameters()}


# ---- closed form (bytes on the wire per step) ----------------------------------------------------
def zero_bytes_per_step(n_params: float, n: int, zero: int, dtype="bf16") -> float:
    """Bytes one rank sends per training step over ``n`` data-parallel ranks (ring collectives), for
    ``n_params`` parameters whose gradients and parameters travel as ``dtype`` (S = n_params · its bytes):
    DDP (``zero=0``) all-reduces the gradients, 2(n−1)/n·S; ZeRO-1 and 2 reduce-scatter the gradients and
    all-gather the updated parameters, the same 2(n−1)/n·S; ZeRO-3 all-gathers the parameters twice
    (forward and backward), 3(n−1)/n·S (Rajbhandari et al. 2020, §7)."""
    check_choice("zero", zero, (0, 1, 2, 3))
    s = n_params * dtype_bytes(dtype)
    rs = bytes_sent_per_rank("reduce_scatter", s, n)
    ag = bytes_sent_per_rank("all_gather", s, n)
    if zero == 0:
        return bytes_sent_per_rank("all_reduce", s, n)
    if zero in (1, 2):
        return rs + ag
    return rs + 2 * ag
