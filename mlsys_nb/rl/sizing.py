"""Sizing RLHF systems (models, not measurements): per-GPU memory and step time of co-located vs
disaggregated (split) layouts for real model sizes, with the weight-sync cost from ``data/hardware.yaml``.

- Memory: ``mlsys_nb.memory.rlhf_estimate`` (the one RLHF memory calculator), per GPU, with
  ``fits`` against the GPU's memory.
- Generation (rollout): the inference roofline (``mlsys_nb.inference.roofline``: 100 % of peak, no
  overlap loss): one prefill of ``prompt_len`` tokens plus ``response_len`` decode steps at the mean
  context ``prompt_len + response_len / 2``, the batch spread over ``G_rollout / rollout_tp`` replicas,
  tensor parallelism taken as ideal (time / ``rollout_tp``).
- Training: ``6 N`` FLOP per token for each trained model (actor, critic), ``2 N`` for each forward-only
  one (reference, reward) over ``rollout_batch · (prompt_len + response_len)`` tokens, at ``mfu`` of the
  GPU's dense bf16 peak. Co-located: the four run in turn on all GPUs; split: reference and reward
  in parallel, then actor and critic in parallel, each on its own GPUs.
- Weight sync: ``S = N_actor · bytes(frozen_dtype)``. The trainer's ZeRO-3 shards are all-gathered
  over the GPU's NVLink (ring, ``(n-1)α + (n-1)/n·S/β``); split layouts then send them to the rollout
  replicas over ``sync_link`` as a pipelined chain broadcast (``(n-1)α + S/β``, n = replicas + 1).
- Steps: ``step_sync_s = gen + sync + train`` (phases alternate), ``step_async_s = max(gen, train) +
  sync`` (split only: generation of step t+1 overlaps training of step t, one-step off-policy).

``layout_cost(actor, placement=..., n_gpus=..., gpu=..., sync_link=...) -> LayoutCost``; ``compare(...)``
gives both layouts for a list of models. Seconds and bytes throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..comm.cost import collective_time
from ..config import ModelConfig
from ..hardware import GPU, gpu as _gpu, link as _link
from ..inference.roofline import decode_cost, prefill_cost
from ..memory import RLHFMemory, preset, rlhf_estimate

__all__ = ["LayoutCost", "compare", "layout_cost", "sync_seconds"]


@dataclass(frozen=True)
class LayoutCost:
    """One layout: ``memory`` (``RLHFMemory``), ``per_gpu_bytes``, ``fits``, modelled ``gen_s``,
    ``train_s``, ``sync_s`` (seconds per RLHF step) and the step times of both schedules."""

    placement: str
    n_gpus: int
    gpu: str
    memory: RLHFMemory
    gen_s: float
    train_s: float
    sync_s: float
    fits: bool

    @property
    def per_gpu_bytes(self) -> float:
        return self.memory.per_gpu

    @property
    def step_sync_s(self) -> float:
        return self.gen_s + self.sync_s + self.train_s

    @property
    def step_async_s(self) -> float:
        """One-step off-policy overlap; a co-located layout cannot overlap (same GPUs): equals sync."""
        if self.placement == "colocated":
            return self.step_sync_s
        return max(self.gen_s, self.train_s) + self.sync_s


def sync_seconds(weight_bytes: float, *, n_trainers: int, n_replicas: int, gather_link, send_link=None) -> float:
    """Weight-sync time (model): all-gather of the trainer shards over ``gather_link`` (ring on
    ``n_trainers``), then, if ``send_link`` is given, a pipelined chain broadcast to ``n_replicas``
    rollout replicas (``n_replicas + 1`` members). Links: names in data/hardware.yaml or ``Link``s."""
    g = _link(gather_link) if isinstance(gather_link, str) else gather_link
    t = collective_time("all_gather", weight_bytes, n_trainers, g.latency_s, g.per_direction_bytes_per_s)
    if send_link is not None:
        s = _link(send_link) if isinstance(send_link, str) else send_link
        t += collective_time(
            "broadcast",
            weight_bytes,
            n_replicas + 1,
            s.latency_s,
            s.per_direction_bytes_per_s,
            algorithm="pipelined_chain",
        )
    return t


def layout_cost(
    actor="llama-2-7b",
    *,
    placement: str = "colocated",
    n_gpus: int = 8,
    gpu="H100-SXM",
    sync_link: str = "infiniband-ndr",
    split: dict | None = None,
    rollout_batch: int = 256,
    prompt_len: int = 512,
    response_len: int = 512,
    rollout_tp: int = 1,
    mfu: float = 0.4,
    frozen_dtype="bf16",
) -> LayoutCost:
    """Per-GPU memory and modelled step time of one PPO-RLHF layout (see the module docstring)."""
    if not 0 < mfu <= 1:
        raise ValueError(f"mfu={mfu!r}: allowed 0 < mfu <= 1")
    m: ModelConfig = preset(actor) if isinstance(actor, str) else actor
    g: GPU = _gpu(gpu) if isinstance(gpu, str) else gpu
    mem = rlhf_estimate(
        m,
        n_gpus=n_gpus,
        placement=placement,
        split=split,
        rollout_batch=rollout_batch,
        prompt_len=prompt_len,
        response_len=response_len,
        rollout_tp=rollout_tp,
        frozen_dtype=frozen_dtype,
    )
    if placement == "colocated":
        groups = dict.fromkeys(("actor", "critic", "reference", "reward", "rollout"), n_gpus)
    else:
        groups = {r: mem.roles[r][0] for r in ("actor", "critic", "reference", "reward", "rollout")}
    n = mem.params
    replicas = groups["rollout"] // rollout_tp
    b = math.ceil(rollout_batch / replicas)
    gen = prefill_cost(m, g, prompt_len, batch=b).time_s if prompt_len else 0.0
    gen += response_len * decode_cost(m, g, prompt_len + response_len // 2, batch=b).time_s
    gen /= rollout_tp
    tokens = rollout_batch * (prompt_len + response_len)
    rate = g.peak("bf16") * mfu

    def t(flop_per_token, role):
        return flop_per_token * tokens / (groups[role] * rate)

    fwd = [t(2 * n["reference"], "reference"), t(2 * n["reward"], "reward")]
    bwd = [t(6 * n["actor"], "actor"), t(6 * n["critic"], "critic")]
    train = sum(fwd) + sum(bwd) if placement == "colocated" else max(fwd) + max(bwd)
    from ..config import dtype_bytes

    s_bytes = n["actor"] * dtype_bytes(frozen_dtype)
    nvlink = g.nvlink or "pcie5-x16"
    sync = sync_seconds(
        s_bytes,
        n_trainers=groups["actor"],
        n_replicas=replicas,
        gather_link=nvlink,
        send_link=None if placement == "colocated" else sync_link,
    )
    return LayoutCost(placement, n_gpus, g.name, mem, gen, train, sync, mem.per_gpu <= g.memory_bytes)


def compare(models=("llama-2-7b", "llama-3.1-70b", "llama-3.1-405b"), *, n_gpus: dict | int = 64, **kw) -> list[dict]:
    """Both layouts for each model: rows of GB per GPU (1e9 B), fits, and modelled seconds. ``n_gpus`` and
    any keyword of ``layout_cost`` may be a dict keyed by model name (e.g. ``rollout_tp``)."""
    rows = []
    for name in models:
        n = n_gpus[name] if isinstance(n_gpus, dict) else n_gpus
        args = {k: (v[name] if isinstance(v, dict) and name in v else v) for k, v in kw.items()}
        for placement in ("colocated", "split"):
            c = layout_cost(name, placement=placement, n_gpus=n, **args)
            rows.append(
                {
                    "model": name,
                    "layout": placement,
                    "gpus": n,
                    "GB per GPU": c.per_gpu_bytes / 1e9,
                    "fits": c.fits,
                    "gen s": c.gen_s,
                    "train s": c.train_s,
                    "sync s": c.sync_s,
                    "step (sync) s": c.step_sync_s,
                    "step (async) s": c.step_async_s,
                }
            )
    return rows
