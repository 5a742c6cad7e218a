"""``estimate(model, train)``: the memory of one rank, stage by stage: model states, activations, buffers.

Each pipeline stage (``_stage_breakdown``) adds up its model states (``states.stage_states``, moved to the
host with ``train.offload``), the saved activations of its layers times the micro-batches in flight plus the
tensors outside the layers (``_activations``), and the transient buffers at the peak (``_temporary_buffers``);
``estimate`` reports the heaviest stage unless ``stage=`` is given.
"""

from __future__ import annotations

import math

from ..config import ModelConfig, TrainConfig, check_choice, check_int
from .activations import LayerBytes, layer_terms, outside_terms
from .breakdown import Breakdown, check
from .playbook import playbook_breakdown
from .stages import in_flight_stages, stage_activations, stage_params, stage_range
from .states import bytes_per_param, exact_zero_layout, offload_states, param_count, stage_states
from .units import PRECISION_BYTES

GATHERED = "ZeRO-3 gathered layers (2 x largest)"
RECOMPUTE_WORKING_SET = "recompute working set (one layer)"
LOGITS = "logits + their gradient"


def estimate(
    model: ModelConfig, train: TrainConfig | None = None, *, stage: int | None = None, compat: str | None = None
) -> Breakdown:
    """Memory per rank of training ``model`` with ``train`` (bytes; see ``Breakdown``).

    ``stage``: which pipeline stage to report (default: the one with the largest total).
    ``compat="playbook"``: the Ultra-Scale Playbook widget's numbers for the same inputs (bugs
    included; see ``playbook_inputs`` for the mapping)."""
    from .. import hardware

    t = train or TrainConfig()
    if compat is not None:
        check_choice("compat", compat, (None, "playbook"))
        return playbook_breakdown(model, t)
    check(model, t)
    if stage is not None:
        check_int("stage", stage, 0, t.pp - 1)
    pc = param_count(model)
    per_layer_terms = layer_terms(model, t)
    common = dict(  # the same on every stage
        activations_per_layer=sum(b for _, b in per_layer_terms),
        n_params_total=pc.total,
        n_params_active=pc.active,
        gpu=t.gpu,
        gpu_memory=hardware.gpu(t.gpu).memory_bytes,
        terms=per_layer_terms,
    )
    bpp = bytes_per_param(t.precision, t.optimizer, t.fp32_grad_accum, t.optimizer_bytes_per_param)
    layer_bytes = LayerBytes(model, t)  # the stages share it
    flights = in_flight_stages(t) if t.pp > 1 else None  # every stage's, computed once
    results = [
        _stage_breakdown(model, t, st, bpp, layer_bytes, flights[st] if flights else 1.0, common)
        for st in ([stage] if stage is not None else range(t.pp))
    ]
    return max(results, key=lambda r: r.total)


def _stage_breakdown(
    model: ModelConfig, t: TrainConfig, st: int, bpp: dict, layer_bytes: LayerBytes, fl: float, common: dict
) -> Breakdown:
    """The ``Breakdown`` of pipeline rank ``st`` holding ``fl`` micro-batches in flight (``in_flight_stages``)."""
    held = [st]
    if t.pp_schedule == "dualpipe" and t.pp > 1:  # DualPipe: this rank also holds stage pp-1-st
        held.append(t.pp - 1 - st)
    dense, expert, largest, nlay = stage_params(model, t, st)
    for mirror in held[1:]:
        d2, e2, l2, n2 = stage_params(model, t, mirror)
        dense, expert, largest, nlay = dense + d2, expert + e2, max(largest, l2), nlay + n2
    states, n_opt, ft_detail = stage_states(model, t, bpp, dense, expert, nlay)
    host, traffic = offload_states(t, bpp, states, n_opt)
    acts_layers, acts_out, outside = _activations(model, t, held, fl, layer_bytes)
    temp = _temporary_buffers(model, t, held, largest, bpp, layer_bytes)
    # ZeRO-3's gathered layers are alive beside the larger of the recompute working set and the logits
    temporary = temp.get(GATHERED, 0.0) + max(temp.get(RECOMPUTE_WORKING_SET, 0.0), temp.get(LOGITS, 0.0))
    acts = acts_layers + acts_out
    return Breakdown(
        params=states["param"],
        grads=states["grad"],
        optimizer=states["optimizer"],
        master=states["master"],
        activations=acts,
        activations_layers=acts_layers,
        activations_outside=acts_out,
        temporary=temporary,
        overhead=t.overhead_bytes,
        total=sum(states.values()) + acts + temporary + t.overhead_bytes,
        n_params_rank=dense + expert,
        layers=nlay,
        in_flight=fl,
        stage=st,
        detail={"temporary": temp, "outside": outside, "host": host, "offload": traffic, "finetune": ft_detail},
        host=sum(host.values()),
        offload_bytes_per_step=traffic.get("total", 0.0),
        **common,
    )


def _activations(model: ModelConfig, t: TrainConfig, held: list, fl: float, layer_bytes: LayerBytes) -> tuple:
    """(saved bytes of the rank's layers x ``fl`` in-flight micro-batches, bytes outside the layers, their terms)
    of a rank holding the stages ``held``."""
    acts_layers = sum(stage_activations(model, t, stage_range(model, t, s), layer_bytes) for s in held)
    acts_layers /= len(held)  # DualPipe: in-flight micro-batches counted over one stage's layers
    acts_layers *= fl
    first, last = 0 in held, t.pp - 1 in held
    outside = outside_terms(model, t, first, last)
    # embedding-side tensors wait for every in-flight micro-batch; the head's are freed by the
    # backward that follows each forward at once (last stage), so they count once
    first_out = outside_terms(model, t, first, False) if first else []
    acts_out = sum(b for _, b in outside) + sum(b for _, b in first_out) * (fl - 1.0)
    return acts_layers, acts_out, outside


def _temporary_buffers(
    model: ModelConfig, t: TrainConfig, held: list, largest: float, bpp: dict, layer_bytes: LayerBytes
) -> dict:
    """Transient buffers at the peak (bytes by name) of a rank holding the stages ``held`` whose largest layer
    has ``largest`` parameters: ZeRO-3's gathered layers, the recompute working set, the logits' gradient."""
    zgroup = t.dp * t.cp
    temp = {}
    if t.zero >= 3 and zgroup > 1:  # current + prefetched gathered layer
        if exact_zero_layout(t) and t.zero_layout == "units":  # a unit is gathered into its padded flat buffer
            largest = math.ceil(largest / zgroup) * zgroup
        temp[GATHERED] = 2 * largest * bpp["param"]
    elif t.offload == "optimizer+params":  # the layer being computed and the one being fetched
        temp[GATHERED] = 2 * largest * bpp["param"]
    if t.recompute != "none":
        first_layer = stage_range(model, t, held[0]).start
        work = layer_bytes(first_layer, "none")
        kept = layer_bytes(first_layer)
        temp[RECOMPUTE_WORKING_SET] = work - kept if t.recompute == "selective" else work
    if t.pp - 1 in held:
        vp = t.tp if (t.vocab_parallel and t.tp > 1) else 1
        B = PRECISION_BYTES[t.precision]["act"]
        # fused stacks: the logits in the activation dtype and their fp32 gradient; the eager model computes the
        # loss in fp32, and its backward holds the fp32 gradient of the log-probs and of the logits at once (8 B
        # per logit whatever the activation dtype; measured on an H100 by the GPU pack)
        per_logit = 8 if t.kernels == "eager" else 4 + B
        temp[LOGITS] = per_logit * model.vocab_size * t.micro_batch * t.seq_len / t.cp / vp
    return temp
