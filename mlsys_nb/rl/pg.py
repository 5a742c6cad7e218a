"""Policy gradients from scratch: REINFORCE (Williams, 1992), baselines, and a one-step actor-critic.

The policy-gradient theorem (Sutton et al., 2000): grad J = E[ sum_t grad log pi(a_t|s_t) * Psi_t ] where
Psi_t can be the episode's total return, the return-to-go G_t (causality: an action does not change
past rewards), or G_t - b(s_t) for any baseline b that does not depend on a_t. All three have the same
expectation; they differ in variance, which ``gradient_variance`` measures on real episodes.

- ``returns_to_go(rewards, gamma)``; ``reinforce_loss(logp, rewards, gamma, baseline=None)``.
- ``gradient_variance(model, env_id, episodes, seed)``: per-episode gradient estimates of the three
  estimators, their mean and total variance (sum over parameters of the variance across episodes).
- ``train_reinforce(env_id, seed, iterations, baseline=True)``: Monte-Carlo policy gradient, baseline
  = a learned value network.
- ``train_actor_critic(env_id, seed, total_steps)``: advantage actor-critic (A2C; Mnih et al., 2016,
  arXiv:1602.01783): n-step bootstrapped advantages from ``gae``, one gradient step per rollout.
"""

from __future__ import annotations

import numpy as np
import torch

from ..runtime.timing import Laps
from .gae import gae
from .ppo import ActorCritic, Policy, Rollout, check_env_id, make_envs


def returns_to_go(rewards: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = sum_{k >= t} gamma^(k - t) r_k for one episode ``[T]``."""
    # the recursion on numpy scalars of the tensor's dtype: the same roundings as the loop on 0-d tensors
    # (gamma rounded to that dtype, then one multiply and one add per step), without a tensor op per step
    r = rewards.detach().cpu().numpy()
    gam, g = r.dtype.type(gamma), r.dtype.type(0.0)
    out = np.empty_like(r)
    for t in range(len(r) - 1, -1, -1):
        g = r[t] + gam * g
        out[t] = g
    return torch.from_numpy(out).to(rewards.device)


def reinforce_loss(
    logp: torch.Tensor, rewards: torch.Tensor, gamma: float = 0.99, baseline=None, total_return: bool = False
) -> torch.Tensor:
    """Surrogate whose gradient is one episode's REINFORCE estimate: -sum_t log pi(a_t|s_t) * Psi_t.

    Psi_t = the whole discounted return if ``total_return``, else G_t (minus ``baseline[t]`` if given;
    the baseline is treated as a constant)."""
    g = returns_to_go(rewards, gamma)
    psi = g[0].expand_as(g) if total_return else g
    if baseline is not None:
        psi = psi - torch.as_tensor(baseline, dtype=psi.dtype).detach()
    return -(logp * psi).sum()


def run_episode(model: ActorCritic, env, seed: int, generator=None):
    """One episode with sampled actions: ``(obs [T, d], actions [T], rewards [T])`` tensors."""
    obs, _ = env.reset(seed=seed)
    o, a, r, done = [], [], [], False
    with torch.no_grad():  # one context for the episode, not one per step (the same ops, less overhead)
        while not done:
            x = torch.as_tensor(obs, dtype=torch.float32)
            action = int(torch.multinomial(torch.softmax(model.logits(x), -1), 1, generator=generator))
            obs, reward, term, trunc, _ = env.step(action)
            o.append(x), a.append(action), r.append(float(reward))
            done = term or trunc
    return torch.stack(o), torch.tensor(a), torch.tensor(r)


def run_episodes(model: ActorCritic, envs, seeds, generator=None):
    """One episode per copy of the vector env ``envs`` (``len(seeds)`` copies, next-step autoreset), side by
    side: copy i is reset with ``seeds[i]`` and steps with sampled actions until its episode ends (its later
    steps are dropped). Returns one ``(obs [T_i, d], actions [T_i], rewards [T_i])`` per seed, in order.

    The same episodes as ``run_episode`` per seed would give for the same actions; the actions are drawn as
    one [n, actions] sample per step instead of one per episode step, so the random stream differs. One
    policy forward, one sample and one vector step per step for all the episodes, where ``run_episode`` in a
    loop makes one of each per episode step: fewer seconds per env step."""
    n = len(seeds)
    if envs.num_envs != n:
        raise ValueError(f"seeds: one per copy of envs ({envs.num_envs}), got {n}")
    obs, _ = envs.reset(seed=[int(s) for s in seeds])
    alive, length = np.ones(n, dtype=bool), np.zeros(n, dtype=np.int64)
    o, a, r = [], [], []
    with torch.no_grad():
        while alive.any():
            x = torch.as_tensor(obs, dtype=torch.float32)
            action = torch.multinomial(torch.softmax(model.logits(x), -1), 1, generator=generator).squeeze(-1)
            obs, reward, term, trunc, _ = envs.step(action.numpy())
            o.append(x), a.append(action), r.append(torch.as_tensor(reward, dtype=torch.float32))
            length += alive
            alive &= ~(term | trunc)
    obs_t, act_t, rew_t = torch.stack(o, 1), torch.stack(a, 1), torch.stack(r, 1)  # [n, T_max, ...]
    return [(obs_t[i, :k], act_t[i, :k], rew_t[i, :k]) for i, k in enumerate(length.tolist())]


def _time_baseline(episodes, gamma):
    """b_t = mean over episodes of G_t (0 where an episode had ended): a state-independent baseline."""
    gs = [returns_to_go(r, gamma) for _, _, r in episodes]
    T = max(len(g) for g in gs)
    return torch.stack([torch.nn.functional.pad(g, (0, T - len(g))) for g in gs]).mean(0)


def gradient_variance(
    model: ActorCritic, env_id: str = "CartPole-v1", episodes: int = 100, seed: int = 0, gamma: float = 0.99
) -> dict:
    """Measured mean and variance of three REINFORCE gradient estimators for the policy of ``model``.

    Each estimate is one episode's gradient (flattened over the policy's parameters). The baseline is
    the time-indexed mean return-to-go of ``episodes`` OTHER episodes (independent of the scored ones,
    so it adds no bias). Returns ``{name: {"mean": vector, "variance": float}}`` for ``total_return``,
    ``reward_to_go`` and ``baseline``; variance = sum over parameters of the across-episode variance.
    """
    import gymnasium as gym

    check_env_id(env_id)
    env, g = gym.make(env_id), torch.Generator().manual_seed(seed)
    try:
        scored = [run_episode(model, env, seed + i, g) for i in range(episodes)]
        other = [run_episode(model, env, seed + episodes + i, g) for i in range(episodes)]
    finally:
        env.close()
    b = _time_baseline(other, gamma)
    params = list(model.pi.parameters())
    out = {}
    for name in ("total_return", "reward_to_go", "baseline"):
        grads = []
        for obs, act, rew in scored:
            logp = torch.log_softmax(model.pi(obs), -1).gather(-1, act[:, None]).squeeze(-1)
            base = (
                torch.nn.functional.pad(b, (0, max(0, len(rew) - len(b))))[: len(rew)] if name == "baseline" else None
            )
            loss = reinforce_loss(logp, rew, gamma, base, total_return=name == "total_return")
            grads.append(torch.cat([x.flatten() for x in torch.autograd.grad(-loss, params)]))
        G = torch.stack(grads)
        out[name] = {"mean": G.mean(0), "variance": float(G.var(0).sum())}
    return out


def train_reinforce(
    env_id: str = "CartPole-v1",
    seed: int = 0,
    iterations: int = 50,
    episodes: int = 8,
    baseline: bool = True,
    lr: float = 1e-2,
    gamma: float = 0.99,
    progress: bool = True,
):
    """REINFORCE, ``episodes`` episodes per update (played side by side: ``run_episodes``); with ``baseline``
    a value network fitted to G_t.

    Returns ``(policy, curve)``; curve rows ``iteration, env_steps, wall_s, mean_return``."""
    import pandas as pd
    from tqdm.auto import tqdm

    check_env_id(env_id)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    envs = make_envs(env_id, episodes, same_step=False)  # the episodes of an update run side by side
    model = ActorCritic(envs.single_observation_space.shape[0], int(envs.single_action_space.n), 64, g)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    rows, steps, clock = [], 0, Laps()
    try:
        for it in tqdm(
            range(iterations), desc=f"REINFORCE{' + baseline' if baseline else ''}", disable=not progress, leave=False
        ):
            batch = run_episodes(model, envs, [seed * 100_000 + it * episodes + i for i in range(episodes)], g)
            loss = 0.0
            for obs, act, rew in batch:
                logp = model.dist(obs).log_prob(act)
                G = returns_to_go(rew, gamma)
                if baseline:
                    v = model.value(obs)
                    loss = loss + reinforce_loss(logp, rew, gamma, v.detach()) + 0.5 * (v - G).pow(2).sum()
                else:
                    loss = loss + reinforce_loss(logp, rew, gamma)
            opt.zero_grad()
            (loss / sum(len(r) for _, _, r in batch)).backward()
            opt.step()
            steps += sum(len(r) for _, _, r in batch)
            rows.append((it, steps, clock.elapsed(), float(np.mean([r.sum() for _, _, r in batch]))))
    finally:
        envs.close()
        torch.set_num_threads(threads)
    return Policy(model), pd.DataFrame(rows, columns=["iteration", "env_steps", "wall_s", "mean_return"])


def train_actor_critic(
    env_id: str = "CartPole-v1",
    seed: int = 0,
    total_steps: int = 50_000,
    n_envs: int = 8,
    n_steps: int = 8,
    lr: float = 2e-3,
    gamma: float = 0.99,
    lam: float = 0.0,
    ent_coef: float = 0.0,
    progress: bool = True,
):
    """Advantage actor-critic: per rollout, A from ``gae`` (lam = 0: one-step TD errors), and ONE step on
    -mean(log pi * A) + 0.5 * mean((V - R)^2) - ent_coef * H. Returns ``(policy, curve)`` like ``ppo.train_ppo``."""
    import pandas as pd
    from tqdm.auto import tqdm

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    envs = make_envs(env_id, n_envs)
    model = ActorCritic(envs.single_observation_space.shape[0], int(envs.single_action_space.n), 64, g)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    roll = Rollout(envs, model, seed, gamma, g)
    rows, steps, clock = [], 0, Laps()
    bar = tqdm(total=total_steps, desc="actor-critic", disable=not progress, leave=False)
    try:
        while steps < total_steps:
            b = roll.collect(n_steps)
            adv, ret = gae(b["rewards"], b["values"], b["dones"], b["last_value"], gamma, lam)
            dist = model.dist(b["obs"])
            loss = (
                -(dist.log_prob(b["actions"]) * adv).mean()
                + 0.5 * (model.value(b["obs"]) - ret).pow(2).mean()
                - ent_coef * dist.entropy().mean()
            )
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            opt.step()
            steps += b["steps"]
            bar.update(b["steps"])
            recent = list(roll.finished)[-20:]
            rows.append((steps, clock.elapsed(), float(np.mean(recent)) if recent else float("nan")))
    finally:
        bar.close()
        envs.close()
        torch.set_num_threads(threads)
    return Policy(model), pd.DataFrame(rows, columns=["env_steps", "wall_s", "mean_return"])
