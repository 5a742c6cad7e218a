"""Generalised advantage estimation (Schulman et al., 2015, arXiv:1506.02438, eq. 11-16).

One-step TD error at step t (no bootstrap across an episode end):

    delta_t = r_t + gamma * (1 - done_t) * V(s_{t+1}) - V(s_t)

and the advantage is the exponentially weighted sum of the TD errors that follow, cut at episode ends:

    A_t = delta_t + gamma * lam * (1 - done_t) * A_{t+1},        returns_t = A_t + V(s_t)

lam = 0 gives the one-step TD errors; lam = 1 gives the discounted return (bootstrapped from
``last_value`` if the rollout ends mid-episode) minus V(s_t).

Truncation (a time limit, not a real end) is the caller's business: add ``gamma * V(final_obs)`` to
that step's reward and mark the step done. ``mlsys_nb.rl.ppo`` does exactly that.
"""

from __future__ import annotations

import numpy as np

from ..config import check_probability


def _check(rewards, values, dones, last_value, gamma, lam):
    check_probability("gamma", gamma)
    check_probability("lam", lam)
    shape = tuple(rewards.shape)
    if len(shape) not in (1, 2) or shape[0] == 0:
        raise ValueError(f"rewards must be time-major [T] or [T, N] with T >= 1, got shape {shape}")
    for name, x in (("values", values), ("dones", dones)):
        if tuple(x.shape) != shape:
            raise ValueError(f"{name} must have the shape of rewards {shape}, got {tuple(x.shape)}")
    if tuple(np.shape(last_value)) != shape[1:]:
        raise ValueError(
            f"last_value must have shape {shape[1:]} (rewards' shape without time), got {tuple(np.shape(last_value))}"
        )


def gae(rewards, values, dones, last_value, gamma: float = 0.99, lam: float = 0.95):
    """Advantages and returns (value targets) of a time-major rollout.

    rewards, values, dones: ``[T]`` or ``[T, N]`` (N parallel environments), all torch tensors or all
    numpy arrays; ``dones[t]`` is true when the episode ended at step t (the next row starts a new
    episode); ``last_value``: value of the state after the last step, shape ``[]`` / ``[N]``.
    gamma: discount in [0, 1]; lam: GAE lambda in [0, 1].
    Returns ``(advantages, returns)`` with the type, dtype and shape of ``rewards`` (float).
    """
    is_torch = type(rewards).__module__.startswith("torch")
    if is_torch:
        import torch

        if not all(isinstance(x, torch.Tensor) for x in (values, dones)):
            raise TypeError("rewards is a torch tensor: values and dones must be torch tensors too")
        if not isinstance(last_value, torch.Tensor):
            last_value = torch.as_tensor(last_value, dtype=rewards.dtype, device=rewards.device)
        if not rewards.is_floating_point():
            raise TypeError(f"rewards must be a floating-point tensor, got {rewards.dtype}")
    else:
        rewards, values, dones = np.asarray(rewards), np.asarray(values), np.asarray(dones)
        last_value = np.asarray(last_value, dtype=rewards.dtype)
        if not np.issubdtype(rewards.dtype, np.floating):
            raise TypeError(f"rewards must be a floating-point array, got {rewards.dtype}")
    _check(rewards, values, dones, last_value, gamma, lam)

    notdone = 1.0 - (dones.to(rewards.dtype) if is_torch else dones.astype(rewards.dtype))
    values = values.to(rewards.dtype) if is_torch else values.astype(rewards.dtype)
    advantages = rewards.clone() if is_torch else rewards.copy()
    next_value, next_adv = last_value, 0.0
    for t in reversed(range(rewards.shape[0])):
        delta = rewards[t] + gamma * notdone[t] * next_value - values[t]
        next_adv = delta + gamma * lam * notdone[t] * next_adv
        advantages[t] = next_adv
        next_value = values[t]
    return advantages, advantages + values


def discounted_returns(rewards, dones, last_value, gamma: float):
    """Plain discounted return-to-go, cut at episode ends, bootstrapped from ``last_value`` (numpy).

    An independent reference for ``gae`` (lam = 1): G_t = r_t + gamma * (1 - done_t) * G_{t+1}.
    """
    rewards, dones = np.asarray(rewards, dtype=np.float64), np.asarray(dones, dtype=bool)
    out = np.zeros_like(rewards)
    g = np.asarray(last_value, dtype=np.float64)
    for t in reversed(range(len(rewards))):
        g = rewards[t] + gamma * np.where(dones[t], 0.0, g)
        out[t] = g
    return out
