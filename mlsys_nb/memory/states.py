"""Model states per rank: parameters, gradients, optimizer states, fp32 master weights (bytes).

The ZeRO paper's analysis (Rajbhandari et al. 2020, arXiv:1910.02054, §3; Micikevicius et al. 2018,
arXiv:1710.03740): ``bytes_per_param`` of a precision recipe and an optimizer, ``model_state_bytes`` under
ZeRO stage 0-3, ``sharded_elements`` with an implementation's own padding, and ``stage_states``: what one
pipeline rank holds in ``estimate`` (full training, the exact ZeRO layout, LoRA/QLoRA) and, with CPU offload,
what moves to the host (``offload_states``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import ArgumentError, ModelConfig, ParamCount, TrainConfig, check_choice, check_int
from .finetune import finetune_elements, nf4_bytes_per_weight
from .units import PRECISION_BYTES

_STATES = {"adam": 2, "adamw": 2, "sgd": 0, "sgd-momentum": 1, "adam-8bit": 2}


def param_count(model: ModelConfig) -> ParamCount:
    """Exact parameter count of ``model`` (``ModelConfig.param_count``, the one formula)."""
    return model.param_count()


def scalar_head_params(model: ModelConfig) -> int:
    """Parameters of ``model`` with its LM head replaced by a scalar head ``Linear(h, 1)`` (critic, reward)."""
    p = param_count(model)
    return p.total - p.head + model.hidden + 1


@dataclass(frozen=True)
class ModelStates:
    """Bytes per rank of the model states (``int(x)`` / ``.total`` = their sum)."""

    params: float
    grads: float
    optimizer: float
    master: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.master

    def __int__(self):
        return int(round(self.total))

    def __float__(self):
        return float(self.total)


def bytes_per_param(precision: str, optimizer: str, fp32_grad_accum: bool, k: float | None) -> dict:
    """Bytes per parameter of each model state (``param``, ``grad``, ``master``, ``optimizer``, ...) for a
    precision recipe and an optimizer; ``k`` overrides the optimizer-state bytes (the ZeRO paper's K)."""
    check_choice("precision", precision, PRECISION_BYTES)
    check_choice("optimizer", optimizer, _STATES)
    p = dict(PRECISION_BYTES[precision])
    state = 1 if optimizer == "adam-8bit" else p["state"]
    p["optimizer"] = float(k) if k is not None else _STATES[optimizer] * state
    if fp32_grad_accum and precision != "fp8-dsv3":  # dsv3 already accumulates in fp32
        p["grad"] += 4
    return p


def _sharded(n: float, group: int, on: bool) -> float:
    """Elements one rank holds of ``n`` when ZeRO shards them over ``group`` (flat, padded)."""
    return math.ceil(n / group) if (on and group > 1) else n


def sharded_elements(model: ModelConfig, n: int, layout: str, rank: int = 0) -> dict[str, int]:
    """Exact elements per rank when ``n`` ranks shard ``Transformer(model)``'s parameters.

    ``layout="units"`` (``mlsys_nb.parallel.zero``): each unit's flat buffer is padded to a multiple
    of ``n``; ``full`` = the padded buffers (what a rank holds of the parameters below stage 3),
    ``shard`` = their ``1/n``. ``layout="fsdp2"`` (``fully_shard``): every parameter of ``r`` rows is
    split along dim 0 into ``⌈r/n⌉``-row shards; ``full`` = the unpadded parameters. ``layout="flat"``:
    one buffer, ``⌈P/n⌉``. ``total`` = the parameters without padding. ``local``: the unpadded
    elements of ``rank``'s shard, what an optimizer built on FSDP2's local tensors allocates (the
    last ranks hold fewer rows; rank 0 always the most); for the other layouts the shard itself."""
    check_int("rank", rank, 0, n - 1)
    check_choice("layout", layout, ("flat", "units", "fsdp2"))
    from ..models.measure import unit_layout  # the meta-device Transformer's ZeRO units (loads torch)

    units, shapes = unit_layout(model)
    total = sum(units)
    if layout == "units":
        padded = [math.ceil(u / n) * n for u in units]
        return dict(total=total, full=sum(padded), shard=sum(padded) // n, local=sum(padded) // n)
    if layout == "fsdp2":
        rows = [(s[0], math.prod(s) // s[0]) if s else (1, 1) for s in shapes]
        shard = sum(math.ceil(r / n) * c for r, c in rows)
        local = sum(max(0, min(math.ceil(r / n), r - rank * math.ceil(r / n))) * c for r, c in rows)
        return dict(total=total, full=total, shard=shard, local=local)
    return dict(total=total, full=total, shard=math.ceil(total / n), local=math.ceil(total / n))  # "flat"


def model_state_bytes(
    n_params: float,
    *,
    dp: int = 1,
    zero: int = 0,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    fp32_grad_accum: bool = False,
    optimizer_bytes_per_param: float | None = None,
) -> ModelStates:
    """Bytes per rank of params + grads + optimizer states (+ fp32 master) for ``n_params``
    parameters replicated over ``dp`` ranks with ZeRO stage ``zero`` (ZeRO paper, arXiv:1910.02054, §3):
    stage 1 shards optimizer states and master weights, 2 also gradients, 3 also parameters."""
    check_int("zero", zero, 0, 3)
    check_int("dp", dp, 1)
    b = bytes_per_param(precision, optimizer, fp32_grad_accum, optimizer_bytes_per_param)
    return ModelStates(
        params=b["param"] * _sharded(n_params, dp, zero >= 3),
        grads=b["grad"] * _sharded(n_params, dp, zero >= 2),
        optimizer=b["optimizer"] * _sharded(n_params, dp, zero >= 1),
        master=b["master"] * _sharded(n_params, dp, zero >= 1),
    )


def exact_zero_layout(t: TrainConfig) -> bool:
    """Whether ``estimate`` counts the implementation's own ZeRO padding (``t.zero_layout`` "units" or
    "fsdp2", ``sharded_elements``): ZeRO over more than one rank, full training, no TP/PP/EP/CP."""
    exact = t.zero_layout != "flat" and t.zero >= 1 and t.dp * t.cp > 1 and t.tp == t.pp == t.ep == t.cp == 1
    return exact and t.finetune == "full"  # the units' padding is the full model's


def stage_states(
    model: ModelConfig, t: TrainConfig, bpp: dict, dense: float, expert: float, layers: int
) -> tuple[dict, float, dict]:
    """Model-state bytes one rank holds (``param``, ``grad``, ``optimizer``, ``master``) of ``dense`` and
    ``expert`` parameters (TP/PP/EP applied, ``layers`` transformer layers), ZeRO over dp x cp (experts over
    dp x cp / ep); ``bpp``: ``bytes_per_param``. Returns (states, elements the optimizer updates, the
    fine-tuning detail: empty for full training)."""
    if t.finetune != "full":
        return _finetune_states(model, t, bpp, dense + expert, layers)
    zgroup = t.dp * t.cp
    if exact_zero_layout(t):  # the implementation's own padding (see TrainConfig.zero_layout)
        el = sharded_elements(model, zgroup, t.zero_layout)
        full = el["full"] if t.zero_layout == "units" else el["total"]
        held = dict(
            param=el["shard"] if t.zero >= 3 else full,
            grad=el["shard"] if t.zero >= 2 else full,
            optimizer=el["shard"],
            master=el["shard"],
        )
        return {key: bpp[key] * held[key] for key in held}, held["optimizer"], {}
    states, egroup = {}, zgroup // t.ep
    for key, zmin in (("param", 3), ("grad", 2), ("optimizer", 1), ("master", 1)):
        n = _sharded(dense, zgroup, t.zero >= zmin) + _sharded(expert, egroup, t.zero >= zmin)
        states[key] = bpp[key] * n
        if key == "optimizer":
            n_opt = n
    return states, n_opt, {}


def _finetune_states(model: ModelConfig, t: TrainConfig, bpp: dict, n_rank: float, layers: int):
    """``stage_states`` of LoRA / QLoRA: the frozen base (QLoRA: its linear weights in NF4) and the adapters,
    ZeRO over dp x cp; the adapters alone carry gradients, optimizer states and master weights."""
    fe = finetune_elements(model, t, n_rank, layers)
    zgroup = t.dp * t.cp

    def z(n: float, zmin: int) -> float:
        return _sharded(n, zgroup, t.zero >= zmin)

    frozen = bpp["param"] * z(fe["frozen"], 3)
    if fe["quantized"]:
        frozen += z(fe["quantized"], 3) * nf4_bytes_per_weight(t)
    adapters = bpp["param"] * z(fe["trainable"], 3)
    states = dict(
        param=frozen + adapters,
        grad=bpp["grad"] * z(fe["trainable"], 2),
        optimizer=bpp["optimizer"] * z(fe["trainable"], 1),
        master=bpp["master"] * z(fe["trainable"], 1),
    )
    return states, z(fe["trainable"], 1), dict(fe, frozen_bytes=frozen, adapter_bytes=adapters)


_DTYPE_OF_BYTES = {4: "fp32", 2: "bf16", 1: "fp8"}


def offload_states(t: TrainConfig, bpp: dict, states: dict, n_opt: float) -> tuple[dict, dict]:
    """Move the offloaded states of ``states`` (bytes, edited in place) to the host: returns (host bytes by
    state, the step's traffic from ``checkpoint.offload.offload_bytes_per_step``). Model, as ``OffloadAdamW``
    runs it: the host holds an fp32 copy of the parameters it updates (the master), fp32 gradients and the
    optimizer states; the accelerator none of them (gradients stream out during backward; its bucket is not
    counted); ``optimizer+params`` moves the parameters too. ``n_opt``: elements the optimizer updates here."""
    if t.offload == "none":
        return {}, {}
    from ..checkpoint.offload import offload_bytes_per_step

    grad_b, param_b = bpp["grad"], bpp["param"]
    if grad_b not in _DTYPE_OF_BYTES or param_b not in _DTYPE_OF_BYTES:
        raise ArgumentError(
            f"offload={t.offload!r} needs parameters and gradients of 1, 2 or 4 bytes, got {param_b} and {grad_b} "
            f"(precision={t.precision!r}, fp32_grad_accum={t.fp32_grad_accum})"
        )
    on_host = t.offload == "optimizer+params"
    if on_host and t.finetune != "full":
        raise ArgumentError(f"offload='optimizer+params' is modelled for finetune='full' only, got {t.finetune!r}")
    host = {"master (fp32)": 4.0 * n_opt, "gradients (fp32)": 4.0 * n_opt, "optimizer": states["optimizer"]}
    if on_host:
        host["parameters"] = states["param"]
        states["param"] = 0.0
    states["grad"] = states["optimizer"] = states["master"] = 0.0
    traffic = offload_bytes_per_step(
        int(round(n_opt)), _DTYPE_OF_BYTES[grad_b], _DTYPE_OF_BYTES[param_b], params_on_host=on_host
    )
    return host, traffic
