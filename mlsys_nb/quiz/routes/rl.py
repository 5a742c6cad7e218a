"""Second routes of the topic ``rl``: GAE, PPO, GRPO, DPO and k3 in plain Python, the RLHF memory by
hand, and asynchronous RLHF simulated on a two-worker timeline."""

from __future__ import annotations

import math

from .model import kv_per_token, model_counts
from .registry import register_route


@register_route("rl.weight_sync_time")
def _(p):
    return (p["n"] - 1) * p["alpha"] + 2 * p["n_params"] / p["beta"]


@register_route("rl.rlhf_memory_per_gpu")
def _(p):
    """Actor and critic (trunk + scalar head) at 16 B/param over n (ZeRO-3), reference and reward frozen
    bf16 over n, the rollout engine's full bf16 actor and the KV cache of the batch (512 + 512 tokens)."""
    m = model_counts(p["actor"])
    cfg, n = m["cfg"], p["n_gpus"]
    actor = m["total"]
    critic = actor - (0 if cfg.tied_embeddings else m["embedding"]) + cfg.hidden + 1
    return (
        16 * (actor + critic) / n
        + 2 * (actor + critic) / n
        + 2 * actor
        + p["rollout_batch"] * 1024 * kv_per_token(cfg) / n
    )


@register_route("rl.gae_advantage")
def _(p):
    r, v, g, lam = p["rewards"], p["values"], p["gamma"], p["lam"]
    vals = v + [p["last_value"]]
    return sum((g * lam) ** t * (r[t] + g * vals[t + 1] - vals[t]) for t in range(len(r)))


@register_route("rl.ppo_clipped_objective")
def _(p):
    r, a, e = p["ratio"], p["advantage"], p["clip"]
    return min(r * a, min(max(r, 1 - e), 1 + e) * a)


@register_route("rl.grpo_advantage")
def _(p):
    r, i = p["rewards"], p["index"]
    mean = sum(r) / len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (len(r) - 1))
    return (r[i] - mean) / (std + 1e-6)


@register_route("rl.dpo_loss")
def _(p):
    m = p["beta"] * ((p["pc"] - p["rc"]) - (p["pr"] - p["rr"]))
    return math.log1p(math.exp(-m))


@register_route("rl.kl_k3_estimate")
def _(p):
    q = p["logp_ref"] - p["logp"]
    return math.exp(q) - q - 1


def rlhf_timeline(gen_s, train_s, sync_s, *, lag: int, steps: int = 40) -> list[float]:
    """End times of the weight syncs of ``steps`` RLHF steps on a rollout worker and a trainer,
    event by event. The rollout's ops: gen(k) needs the weights of sync(k − lag) (lag 1: synchronous;
    lag 2: one step off-policy, so gen(k+1) runs while the trainer trains on batch k); train(k) needs
    gen(k); sync(k) needs train(k) and a free rollout, and occupies both workers."""
    roll = trainer = 0.0
    gen_end: dict[int, float] = {}
    sync_end: dict[int, float] = {}

    def gen(k):
        nonlocal roll
        start = max(roll, sync_end.get(k - lag, 0.0))
        roll = gen_end[k] = start + gen_s

    for k in range(lag):
        gen(k)
    for k in range(steps):
        done = max(trainer, gen_end[k]) + train_s
        sync_end[k] = roll = trainer = max(done, roll) + sync_s
        gen(k + lag)
    return [sync_end[k] for k in range(steps)]


@register_route("rl.async_rlhf_speedup")
def _(p):
    """Both schedules simulated event by event on a rollout worker and a trainer (rlhf_timeline)."""

    def period(lag):
        ends = rlhf_timeline(p["gen_s"], p["train_s"], p["sync_s"], lag=lag)
        return (ends[-1] - ends[len(ends) // 2]) / (len(ends) - 1 - len(ends) // 2)

    return period(1) / period(2)
