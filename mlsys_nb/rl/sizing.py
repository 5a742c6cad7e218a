"""Sizing RLHF systems (models, not measurements): per-GPU memory and step time of co-located vs
disaggregated (split) layouts for real model sizes, with the weight-sync cost from ``data/hardware.yaml``.

- Memory: ``rlhf_estimate`` (the one RLHF memory calculator, here: it combines the training-memory
  model of ``mlsys_nb.memory`` with the KV cache of ``mlsys_nb.inference``), per GPU, with ``fits``
  against the GPU's memory.
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
- Steps: ``sync_step_s(gen, train, sync) = gen + sync + train`` (phases alternate) and
  ``async_step_s(gen, train, sync) = max(gen, train) + sync`` (split only: generation of step t+1
  overlaps training of step t, one-step off-policy); ``rl.placement`` checks its Ray runs against the
  same two functions.

``layout_cost(actor, placement=..., n_gpus=..., gpu=..., sync_link=...) -> LayoutCost``; ``compare_placements(...)``
gives both layouts for a list of models. Seconds and bytes throughout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..comm.cost import collective_time
from ..config import ModelConfig, check_choice, check_int, check_probability, dtype_bytes

from ..hardware import GPU, gpu as _gpu, link as _link
from ..inference.kv_cache import kv_bytes_per_token
from ..inference.roofline import decode_cost, prefill_cost
from ..memory import GB, model_state_bytes, param_count, preset, scalar_head_params

__all__ = [
    "LayoutCost",
    "RLHFMemory",
    "async_step_s",
    "compare_placements",
    "layout_cost",
    "rlhf_estimate",
    "sync_seconds",
    "sync_step_s",
]


# ---- the step-time closed forms (models) -------------------------------------------------------
def sync_step_s(gen_s: float, train_s: float, sync_s: float) -> float:
    """Closed form (model) of one step when phases alternate: ``gen + sync + train`` seconds."""
    return gen_s + sync_s + train_s


def async_step_s(gen_s: float, train_s: float, sync_s: float) -> float:
    """Closed form (model) of one step with generation of t+1 overlapped with training of t:
    ``max(gen, train) + sync`` seconds (the sync cannot overlap: the rollout waits for the weights)."""
    return max(gen_s, train_s) + sync_s


# ---- memory: four models and the rollouts' KV cache ---------------------------------------------
@dataclass(frozen=True)
class RLHFMemory:
    """Bytes per GPU of one PPO-RLHF setup, by role (a model of the states: no activations, no allocator
    fragmentation, no communication buffers). ``roles[name]`` = (GPUs of that role, bytes per GPU
    by part); ``per_gpu`` = the heaviest GPU; ``params`` = parameter counts of the four models; the rollout it
    was sized for (``rollout_batch`` sequences of ``prompt_len + response_len`` tokens, ``rollout_tp``, the frozen
    weights' ``frozen_dtype``), which ``layout_cost`` times."""

    placement: str
    n_gpus: int
    roles: dict
    params: dict
    rollout_batch: int
    prompt_len: int
    response_len: int
    rollout_tp: int
    frozen_dtype: object  # a name of ``config.DTYPE_BYTES`` or a torch.dtype

    @property
    def per_gpu(self) -> float:
        return max(sum(parts.values()) for _, parts in self.roles.values())

    def table(self) -> list[dict]:
        """One row per role and part, in GB (1e9 B) per GPU, for display."""
        return [
            {"role": r, "gpus": g, "part": k, "GB per GPU": v / GB}
            for r, (g, parts) in self.roles.items()
            for k, v in parts.items()
        ]


_RLHF_ROLES = ("actor", "critic", "reference", "reward", "rollout")


def rlhf_estimate(
    actor="llama-2-7b",
    *,
    critic=None,
    reward=None,
    n_gpus: int = 8,
    placement: str = "colocated",
    split: dict | None = None,
    rollout_batch: int = 256,
    prompt_len: int = 512,
    response_len: int = 512,
    rollout_tp: int = 1,
    precision: str = "bf16-mixed",
    optimizer: str = "adam",
    frozen_dtype="bf16",
    kv_dtype="bf16",
) -> RLHFMemory:
    """Memory per GPU of PPO-RLHF with four models (InstructGPT, Ouyang et al., 2022, arXiv:2203.02155):

    - actor (trained, LM head) and critic (trained, the actor's trunk with a scalar head unless ``critic``
      is given): params + grads + fp32 master + optimizer states EACH (``precision``/``optimizer`` as in
      ``model_state_bytes``: 16 B/param for bf16-mixed Adam), ZeRO-3-sharded over the GPUs of their role;
    - reference (frozen copy of the actor) and reward (frozen, scalar head; ``reward`` or the critic's
      shape): weights only in ``frozen_dtype``, sharded over their GPUs;
    - rollout engine: the actor's weights in ``frozen_dtype`` split ``rollout_tp`` ways (tensor parallel)
      and the KV cache of ``rollout_batch`` sequences of ``prompt_len + response_len`` tokens,
      ``2 * L * n_kv * d_h`` elements per token (GQA; ``inference.kv_bytes_per_token``), spread evenly
      over the rollout GPUs.

    ``placement="colocated"``: every role on all ``n_gpus`` (verl's hybrid engine; the parts add up on
    each GPU). ``placement="split"``: disjoint GPU groups, ``split`` = GPUs per role (keys actor, critic,
    reference, reward, rollout; default n/4, n/4, n/8, n/8, n/4), and the heaviest group sets ``per_gpu``.
    Models: a preset name (``presets()``) or a ``ModelConfig``. Bytes; ``GB = 1e9``.
    """
    models = {}
    for name, m in (("actor", actor), ("critic", critic), ("reward", reward)):
        if m is not None and not isinstance(m, ModelConfig):
            m = preset(m)
        models[name] = m
    a = models["actor"]
    for name, v in (
        ("n_gpus", n_gpus),
        ("rollout_batch", rollout_batch),
        ("rollout_tp", rollout_tp),
        ("response_len", response_len),
    ):
        check_int(name, v, 1)
    check_int("prompt_len", prompt_len, 0)
    if a.n_kv_heads % rollout_tp:
        raise ValueError(f"rollout_tp={rollout_tp}: must divide the actor's {a.n_kv_heads} KV heads")
    n = {
        "actor": param_count(a).total,
        "reference": param_count(a).total,
        "critic": param_count(models["critic"]).total if models["critic"] else scalar_head_params(a),
    }
    n["reward"] = param_count(models["reward"]).total if models["reward"] else n["critic"]
    if placement == "colocated":
        groups = dict.fromkeys(_RLHF_ROLES, n_gpus)
    elif placement == "split":
        if split is None:
            if n_gpus % 8:
                raise ValueError(f"n_gpus={n_gpus}: the default split needs a multiple of 8; pass split=")
            split = {
                "actor": n_gpus // 4,
                "critic": n_gpus // 4,
                "reference": n_gpus // 8,
                "reward": n_gpus // 8,
                "rollout": n_gpus // 4,
            }
        if set(split) != set(_RLHF_ROLES):
            raise ValueError(f"split={split!r}: needs exactly the keys {_RLHF_ROLES} (GPU counts)")
        for role, v in split.items():
            check_int(f"split[{role!r}] (GPUs)", v, 1)
        if sum(split.values()) != n_gpus:
            raise ValueError(f"split={split!r}: its GPU counts add up to {sum(split.values())}, not n_gpus={n_gpus}")
        groups = dict(split)
    else:
        check_choice("placement", placement, ("colocated", "split"))
    if groups["rollout"] % rollout_tp:
        raise ValueError(f"rollout_tp={rollout_tp}: must divide the rollout GPUs ({groups['rollout']})")
    fb = dtype_bytes(frozen_dtype, "frozen_dtype")
    parts = {}
    for role in ("actor", "critic"):
        s = model_state_bytes(n[role], dp=groups[role], zero=3, precision=precision, optimizer=optimizer)
        parts[role] = {
            f"{role} params": s.params,
            f"{role} grads": s.grads,
            f"{role} optimizer": s.optimizer,
            f"{role} master": s.master,
        }
    for role in ("reference", "reward"):
        parts[role] = {f"{role} weights": fb * math.ceil(n[role] / groups[role])}
    dtype_bytes(kv_dtype, "kv_dtype")
    # the one KV-per-token formula (GQA: n_kv heads; MLA: the latent)
    kv = rollout_batch * (prompt_len + response_len) * kv_bytes_per_token(a, kv_dtype)
    parts["rollout"] = {"rollout weights": fb * n["actor"] / rollout_tp, "KV cache": kv / groups["rollout"]}
    if placement == "colocated":
        roles = {"all": (n_gpus, {k: v for p in parts.values() for k, v in p.items()})}
    else:
        roles = {r: (groups[r], parts[r]) for r in _RLHF_ROLES}
    return RLHFMemory(placement, n_gpus, roles, n, rollout_batch, prompt_len, response_len, rollout_tp, frozen_dtype)


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
        return sync_step_s(self.gen_s, self.train_s, self.sync_s)

    @property
    def step_async_s(self) -> float:
        """One-step off-policy overlap; a co-located layout cannot overlap (same GPUs): equals sync."""
        if self.placement == "colocated":
            return self.step_sync_s
        return async_step_s(self.gen_s, self.train_s, self.sync_s)


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
    actor="llama-2-7b", *, gpu="H100-SXM", sync_link: str = "infiniband-ndr", mfu: float = 0.4, **setup
) -> LayoutCost:
    """Per-GPU memory and modelled step time of one PPO-RLHF layout (see the module docstring): the memory of
    ``rlhf_estimate(actor, **setup)`` (its keywords and defaults: ``placement``, ``n_gpus``, ``split``, the
    rollout's ``rollout_batch``, ``prompt_len``, ``response_len``, ``rollout_tp``, ``frozen_dtype``, ...), and the
    seconds of that setup's step on ``gpu`` at ``mfu``, a split layout's weights sent over ``sync_link``."""
    check_probability("mfu", mfu, lo_open=True)
    m: ModelConfig = preset(actor) if isinstance(actor, str) else actor
    g: GPU = _gpu(gpu) if isinstance(gpu, str) else gpu
    mem = rlhf_estimate(m, **setup)
    placement, n_gpus, rollout_tp = mem.placement, mem.n_gpus, mem.rollout_tp
    prompt_len, response_len, rollout_batch = mem.prompt_len, mem.response_len, mem.rollout_batch
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
    s_bytes = n["actor"] * dtype_bytes(mem.frozen_dtype)
    nvlink = g.nvlink or "pcie5-x16"
    sync = sync_seconds(
        s_bytes,
        n_trainers=groups["actor"],
        n_replicas=replicas,
        gather_link=nvlink,
        send_link=None if placement == "colocated" else sync_link,
    )
    return LayoutCost(placement, n_gpus, g.name, mem, gen, train, sync, mem.per_gpu <= g.memory_bytes)


def compare_placements(
    models=("llama-2-7b", "llama-3.1-70b", "llama-3.1-405b"), *, n_gpus: dict | int = 64, **kw
) -> list[dict]:
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
