"""Reinforcement learning in plain PyTorch: GAE, REINFORCE, actor-critic, PPO on gymnasium.

- ``gae(rewards, values, dones, last_value, gamma, lam)`` -> ``(advantages, returns)``, time-major
  ``[T]`` / ``[T, N]``, torch tensors or numpy arrays; ``discounted_returns`` is its lam = 1 reference.
- ``pg``: REINFORCE with and without a baseline (``reinforce_loss``, ``gradient_variance``: measured
  variance of the gradient estimate), ``train_reinforce``, and the one-step actor-critic
  ``train_actor_critic``.
- ``ppo``: ``ppo_loss`` (clipped surrogate, value loss, entropy bonus, advantage normalisation),
  ``train_ppo(env_id="CartPole-v1", seed=0, total_steps=None) -> (policy, curve)`` (vector envs with
  same-step autoreset, minibatch epochs, stops at a greedy 100-episode mean of 475), ``PPOConfig``.
- ``evaluate_policy(policy, env_id, episodes, seed)`` -> returns per episode (episode i seeded ``seed + i``).
- ``sb3_train``: the same task with stable-baselines3's PPO (rl-zoo settings), for comparisons.
- ``rlhf``: RLHF on a tiny language model: a hidden true reward, SFT, a Bradley-Terry reward model, PPO with
  the four models and a per-token KL penalty, GRPO, DPO, and reward hacking at KL coefficient 0.
- ``weight_sync``: RLHF trainer -> rollout weight synchronisation on real ranks (file, bucketed
  broadcast, zero-copy shared memory), ZeRO-3 gathers bucketed to avoid the full-gather spike; one
  ``WeightSync`` interface (``send(named_tensors)`` / ``receive(handle)``) over those and Ray's object store.
- ``placement``: co-located vs disaggregated RLHF on Ray actors, measured against the closed forms.
- ``sizing``: per-GPU memory and step time of RLHF layouts for real model sizes (pure functions;
  ``rlhf_estimate``: memory per GPU of PPO-RLHF's four models).
"""

from .gae import discounted_returns, gae

__all__ = [
    "discounted_returns",
    "evaluate_policy",
    "gae",
    "pg",
    "placement",
    "ppo",
    "rlhf",
    "sb3_train",
    "sizing",
    "train_ppo",
    "weight_sync",
]


def __getattr__(name):  # torch, gymnasium and pandas load on first use
    import importlib

    if name in ("ppo", "pg", "rlhf", "weight_sync", "placement", "sizing"):
        return importlib.import_module(f".{name}", __name__)
    if name in ("evaluate_policy", "train_ppo"):
        from . import ppo

        return getattr(ppo, name)
    if name == "sb3_train":
        from .baselines import sb3_train

        return sb3_train
    raise AttributeError(f"module 'mlsys_nb.rl' has no attribute {name!r}")
