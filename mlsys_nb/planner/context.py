"""The cluster and the model as the cost model sees them (``PlanContext``, checked once per search), the
``TrainConfig`` a layout gives ``mlsys_nb.memory``, and the planner's memoised closed forms (``clear_caches``).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from functools import lru_cache

from .. import hardware, memory
from ..config import ModelConfig, TrainConfig, check_choice, check_int, check_multiple, check_number, check_probability
from .calibration import Calibration, fitted_calibration
from .plan import Layout, memory_schedule

_CACHED: list = []


def memoised(maxsize: int):
    """``functools.lru_cache(maxsize)``, registered so that ``clear_caches`` empties it."""

    def wrap(fn):
        cached = lru_cache(maxsize=maxsize)(fn)
        _CACHED.append(cached)
        return cached

    return wrap


def clear_caches() -> None:
    """Forget the memoised closed forms (benchmarks time a cold search with it)."""
    for f in _CACHED:
        f.cache_clear()


@dataclass(frozen=True)
class PlanContext:
    """The model, the cluster and the assumptions of one search or ``evaluate`` (``plan_context`` checks and
    resolves them once), with the memo of the closed forms asked for them."""

    model: ModelConfig
    gpus: int
    gpu: str
    global_batch_tokens: int
    seq_len: int
    gpus_per_node: int
    network: str
    nvlink: str
    precision: str
    dtype: str
    compute_efficiency: float
    dp_overlap: float
    overhead_bytes: float
    ep_copies: float | None = None
    ep_bytes: float = 2.0
    nv_ab: tuple = ()  # (alpha s, beta B/s) of the NVLink and of the network, resolved once
    net_ab: tuple = ()
    peak: float = 0.0  # FLOP/s per GPU at dtype
    cap: float = 0.0  # GPU memory, bytes
    hbm: float = 0.0  # HBM bandwidth, bytes/s
    calibration: object = None  # a Calibration, or None: the uncalibrated upper bound
    cache: dict = field(default_factory=dict, compare=False, repr=False)  # memo's results for this context

    @property
    def sequences(self) -> int:
        return self.global_batch_tokens // self.seq_len

    def memo(self, fn, *args):
        """``fn(self.model, *args)`` remembered in the context: a search asks the same closed forms ~10^5
        times, and hashing the ModelConfig for an lru_cache costs more than most of them."""
        key = (fn, *args)
        try:
            return self.cache[key]
        except KeyError:
            out = self.cache[key] = fn(self.model, *args)
            return out

    def memo_ctx(self, fn, *args):
        """``fn(self, *args)`` remembered in the context (the communication terms: a few hundred distinct
        argument tuples among ~10^5 layouts)."""
        key = (fn, *args)
        try:
            return self.cache[key]
        except KeyError:
            out = self.cache[key] = fn(self, *args)
            return out


def plan_context(
    model,
    *,
    gpus,
    gpu,
    global_batch_tokens,
    seq_len,
    gpus_per_node=8,
    network="infiniband-ndr",
    nvlink=None,
    precision="bf16-mixed",
    dtype="bf16",
    compute_efficiency=1.0,
    dp_overlap=0.8,
    overhead_bytes=4e9,
    ep_copies=None,
    ep_bytes=2.0,
    calibration="fitted",
) -> PlanContext:
    """Check the assumptions (each keyword is one, ``DEFAULTS``) and resolve the GPU's peak, memory and HBM
    bandwidth, the links' α and β, and the calibration (``"fitted"``: ``fitted_calibration()``) once."""
    if isinstance(model, str):
        model = memory.preset(model)
    if not isinstance(model, ModelConfig):
        raise TypeError(f"model must be a ModelConfig or a preset name, got {type(model).__name__}")
    check_int("gpus", gpus)
    check_int("gpus_per_node", gpus_per_node)
    check_int("seq_len", seq_len)
    check_int("global_batch_tokens", global_batch_tokens)
    g = hardware.gpu(gpu)  # KeyError listing the GPUs
    check_multiple("global_batch_tokens", global_batch_tokens, seq_len, "seq_len")  # whole sequences per step
    nv = nvlink or g.nvlink
    if nv is None:
        raise ValueError(f"gpu={gpu!r} has no NVLink in data/hardware.yaml: pass nvlink= (a link name)")
    hardware.link(nv)
    hardware.link(network)
    g.peak(dtype)
    check_probability("compute_efficiency", compute_efficiency, lo_open=True)
    check_probability("dp_overlap", dp_overlap)
    check_number("overhead_bytes", overhead_bytes, 0, unit="bytes")
    memory.bytes_per_param(precision, "adam", False, None)  # raises naming precision
    if ep_copies is not None:  # None: top_k
        check_number("ep_copies", ep_copies, 0, lo_open=True, unit="token copies sent per MoE layer")
    check_number("ep_bytes", ep_bytes, 0, 4, lo_open=True, unit="bytes per element on the wire")
    nvl, net = hardware.link(nv), hardware.link(network)
    calibration = _resolve_calibration(calibration, gpu)
    return PlanContext(
        model,
        gpus,
        gpu,
        global_batch_tokens,
        seq_len,
        gpus_per_node,
        network,
        nv,
        precision,
        dtype,
        float(compute_efficiency),
        float(dp_overlap),
        float(overhead_bytes),
        ep_copies,
        float(ep_bytes),
        (nvl.latency_s, nvl.per_direction_bytes_per_s),
        (net.latency_s, net.per_direction_bytes_per_s),
        g.peak(dtype),
        g.memory_bytes,
        g.hbm_bandwidth_bytes_per_s,
        calibration,
    )


def _resolve_calibration(calibration, gpu: str) -> Calibration | None:
    """``"fitted"`` -> ``fitted_calibration()``; a ``Calibration`` or None as given, checked for ``gpu``."""
    if isinstance(calibration, str):
        check_choice("calibration", calibration, ("fitted",))
        calibration = fitted_calibration()
    if calibration is not None:
        if not isinstance(calibration, Calibration):
            raise TypeError(f"calibration must be a Calibration, 'fitted' or None, got {type(calibration).__name__}")
        calibration.efficiency(gpu)  # raises naming the GPU when its generation was not fitted
    return calibration


# the assumptions every number depends on (each is a keyword of search/evaluate): plan_context's keyword defaults
DEFAULTS = {
    k: p.default
    for k, p in inspect.signature(plan_context).parameters.items()
    if p.default is not inspect.Parameter.empty
}


def layout_train_config(ctx: PlanContext, lay: Layout, m: int) -> TrainConfig:
    """The ``TrainConfig`` that ``mlsys_nb.memory`` sees for layout ``lay`` with ``m`` micro-batches per
    pipeline: fused kernels and FlashAttention on CUDA, sequence parallelism with TP."""
    return TrainConfig(
        micro_batch=lay.micro_batch,
        seq_len=ctx.seq_len,
        precision=ctx.precision,
        recompute=lay.recompute,
        recompute_layers=lay.recompute_layers or None,
        dp=lay.dp,
        tp=lay.tp,
        sp=lay.tp > 1,
        pp=lay.pp,
        **memory_schedule(lay.schedule, lay.v),
        n_microbatches=m,
        cp=lay.cp,
        ep=lay.ep,
        zero=lay.zero,
        flash_attention=True,
        kernels="fused",
        device="cuda",
        gpu=ctx.gpu,
        overhead_bytes=ctx.overhead_bytes,
    )
