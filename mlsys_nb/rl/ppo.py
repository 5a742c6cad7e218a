"""PPO on gymnasium vector environments, in plain PyTorch (Schulman et al., 2017, arXiv:1707.06347).

One update = a rollout of ``n_steps`` steps in each of ``n_envs`` environments, then ``epochs`` passes
over it in minibatches of ``batch_size`` with the loss

    L = -mean(min(rho * A, clip(rho, 1 - eps, 1 + eps) * A)) + vf_coef * mean((V - R)^2) - ent_coef * H

(rho = pi_new(a|s) / pi_old(a|s), A normalised per minibatch, R the GAE returns; eq. 7 and 9 of the
paper). Environments reset in the same step an episode ends (gymnasium's ``AutoresetMode.SAME_STEP``),
so every stored transition is real; when an episode is cut by the time limit (truncated, not
terminated) the step's reward gets ``gamma * V(final_obs)`` so the value keeps bootstrapping.

``train_ppo(env_id, seed)`` runs until a greedy 100-episode evaluation reaches ``threshold`` (475 for
CartPole-v1) or ``total_steps`` environment steps; defaults are rl-zoo's CartPole-v1 settings
(8 envs x 32 steps, batch 256, 20 epochs, gamma 0.98, lambda 0.8, lr 1e-3 and clip 0.2 both linearly
decayed, tanh 64-64 actor and critic).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque

import numpy as np
import torch

from ..config import check_int, check_number, check_probability
from ..runtime.timing import Laps, Timer

from torch import nn
from torch.nn import functional as F


# ------------------------------------------------------------------ environments
def check_env_id(env_id: str):
    """The gymnasium spec of ``env_id``; a clear ``ValueError`` if it is unknown."""
    import gymnasium as gym

    if not isinstance(env_id, str) or env_id not in gym.registry:
        close = [k for k in gym.registry if isinstance(env_id, str) and env_id.split("-")[0].lower() in k.lower()]
        hint = f" (did you mean {', '.join(sorted(close)[:5])}?)" if close else ""
        raise ValueError(
            f"env_id {env_id!r} is not a registered gymnasium environment{hint}; e.g. 'CartPole-v1', 'Acrobot-v1'"
        )
    return gym.registry[env_id]


def make_envs(env_id: str, n_envs: int, same_step: bool = True):
    """``n_envs`` copies of ``env_id`` in one synchronous vector env (same-step autoreset by default)."""
    import gymnasium as gym

    check_env_id(env_id)
    mode = gym.vector.AutoresetMode.SAME_STEP if same_step else gym.vector.AutoresetMode.NEXT_STEP
    envs = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="sync", vector_kwargs={"autoreset_mode": mode})
    if not isinstance(envs.single_action_space, gym.spaces.Discrete):
        envs.close()
        raise TypeError(f"env_id {env_id!r} has action space {envs.single_action_space}: only Discrete is supported")
    return envs


# ------------------------------------------------------------------ the networks
def _layer(n_in, n_out, gain, generator=None):
    layer = nn.Linear(n_in, n_out)
    nn.init.orthogonal_(layer.weight, gain, generator=generator)
    nn.init.zeros_(layer.bias)
    return layer


class ActorCritic(nn.Module):
    """Separate tanh MLPs for the policy logits and the value (orthogonal init as in SB3/cleanrl)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64, generator=None):
        super().__init__()
        g, s = generator, math.sqrt(2)
        self.pi = nn.Sequential(
            _layer(obs_dim, hidden, s, g),
            nn.Tanh(),
            _layer(hidden, hidden, s, g),
            nn.Tanh(),
            _layer(hidden, n_actions, 0.01, g),
        )
        self.v = nn.Sequential(
            _layer(obs_dim, hidden, s, g), nn.Tanh(), _layer(hidden, hidden, s, g), nn.Tanh(), _layer(hidden, 1, 1.0, g)
        )

    @staticmethod
    def _mlp(seq: nn.Sequential, x: torch.Tensor) -> torch.Tensor:
        """``seq(x)`` for linear-tanh-linear-tanh-linear, as the same three ``F.linear`` and two ``tanh`` calls
        without ``nn.Module.__call__`` around each layer: bit-equal, and on CartPole's [8, 4] batches one
        module call instead of six (the rollouts make one or two per environment step)."""
        l0, _, l1, _, l2 = seq
        x = torch.tanh(F.linear(x, l0.weight, l0.bias))
        return F.linear(torch.tanh(F.linear(x, l1.weight, l1.bias)), l2.weight, l2.bias)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's logits ``self.pi(obs)`` (bit-equal, less call overhead: ``_mlp``)."""
        return self._mlp(self.pi, obs)

    def dist(self, obs: torch.Tensor) -> torch.distributions.Categorical:
        return torch.distributions.Categorical(logits=self.logits(obs))

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        return self._mlp(self.v, obs).squeeze(-1)


class Policy:
    """``policy(obs)`` -> action: greedy (argmax) by default, sampled with ``greedy=False``.

    ``obs`` one observation (returns an int) or a batch ``[B, obs_dim]`` (returns an int64 array)."""

    def __init__(self, model: ActorCritic):
        self.model = model

    @torch.inference_mode()
    def __call__(self, obs, greedy: bool = True):
        x = torch.as_tensor(np.asarray(obs), dtype=torch.float32)
        logits = self.model.logits(x)
        a = logits.argmax(-1) if greedy else torch.distributions.Categorical(logits=logits).sample()
        return int(a) if a.ndim == 0 else a.numpy()


# ------------------------------------------------------------------ the loss
def ppo_loss(
    new_logp,
    old_logp,
    advantages,
    values,
    returns,
    entropy,
    clip: float | None = 0.2,
    vf_coef: float = 0.5,
    ent_coef: float = 0.0,
    normalize: bool = True,
):
    """PPO's total loss and its parts for one minibatch (all tensors ``[B]``).

    ``clip=None`` gives the unclipped policy-gradient surrogate (what A2C optimises in one step).
    Returns ``(loss, parts)`` with parts ``policy``, ``value``, ``entropy``, ``clip_fraction``, ``approx_kl``.
    """
    if clip is not None:
        check_probability("clip", clip, lo_open=True, hi_open=True)
    if normalize and advantages.numel() > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    log_ratio = new_logp - old_logp
    ratio = log_ratio.exp()
    if clip is None:
        policy = -(ratio * advantages).mean()
        clip_fraction = torch.zeros(())
    else:
        policy = -torch.min(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages).mean()
        clip_fraction = ((ratio - 1).abs() > clip).float().mean()
    value = (values - returns).pow(2).mean()
    ent = entropy.mean()
    loss = policy + vf_coef * value - ent_coef * ent
    with torch.no_grad():
        approx_kl = ((ratio - 1) - log_ratio).mean()  # Schulman's k3 estimator of KL(old || new)
    return loss, {
        "policy": policy.detach(),
        "value": value.detach(),
        "entropy": ent.detach(),
        "clip_fraction": clip_fraction,
        "approx_kl": approx_kl,
    }


# ------------------------------------------------------------------ rollouts
class Rollout:
    """Collects ``n_steps`` x ``n_envs`` transitions; keeps the current observations between calls."""

    def __init__(self, envs, model: ActorCritic, seed: int, gamma: float, generator=None):
        self.envs, self.model, self.gamma, self.g = envs, model, gamma, generator
        obs, _ = envs.reset(seed=seed)
        self.obs = torch.as_tensor(obs, dtype=torch.float32)
        self.ep_return = np.zeros(envs.num_envs)
        self.finished: deque = deque(maxlen=100)  # returns of completed training episodes

    @torch.no_grad()
    def collect(self, n_steps: int) -> dict:
        n = self.envs.num_envs
        buf = {k: [] for k in ("obs", "actions", "logp", "values", "rewards", "dones")}
        for _ in range(n_steps):
            logits = self.model.logits(self.obs)
            probs = torch.softmax(logits, -1)
            action = torch.multinomial(probs, 1, generator=self.g).squeeze(-1)
            logp = torch.log_softmax(logits, -1).gather(-1, action[:, None]).squeeze(-1)
            value = self.model.value(self.obs)
            obs, reward, term, trunc, info = self.envs.step(action.numpy())
            self.ep_return += reward
            reward = reward.astype(np.float32)
            done = term | trunc
            for i in np.flatnonzero(done):
                self.finished.append(self.ep_return[i])
                self.ep_return[i] = 0.0
            cut = np.flatnonzero(trunc & ~term)  # time limit: bootstrap from the final observation
            if len(cut) and "final_obs" in info:  # (NEXT_STEP mode has none: used only to show why not)
                final = torch.as_tensor(np.stack(info["final_obs"][cut]), dtype=torch.float32)
                reward[cut] += self.gamma * self.model.value(final).numpy()
            for k, v in (
                ("obs", self.obs),
                ("actions", action),
                ("logp", logp),
                ("values", value),
                ("rewards", torch.from_numpy(reward)),
                ("dones", torch.from_numpy(done)),
            ):
                buf[k].append(v)
            self.obs = torch.as_tensor(obs, dtype=torch.float32)
        out = {k: torch.stack(v) for k, v in buf.items()}
        out["last_value"] = self.model.value(self.obs)
        out["steps"] = n_steps * n
        return out


# ------------------------------------------------------------------ evaluation
def evaluate_policy(
    policy, env_id: str = "CartPole-v1", episodes: int = 100, seed: int = 0, stop_below: float | None = None
) -> np.ndarray:
    """Returns of ``episodes`` episodes of ``policy`` (greedy if it is a ``Policy``); episode i reset with
    seed ``seed + i``. All episodes run side by side in one vector env.

    ``stop_below``: give up early (returning what finished, padded with 0) once the mean over all
    episodes can no longer reach that value (used by ``train_ppo`` to skip hopeless evaluations; the bound
    assumes rewards <= 1 per step and a time limit, as in CartPole).
    """
    check_int("episodes", episodes, 1)
    spec = check_env_id(env_id)
    envs = make_envs(env_id, episodes, same_step=False)
    max_return = float(spec.max_episode_steps or np.inf)
    try:
        obs, _ = envs.reset(seed=[seed + i for i in range(episodes)])
        returns, alive = np.zeros(episodes), np.ones(episodes, dtype=bool)
        while alive.any():
            obs, reward, term, trunc, _ = envs.step(np.asarray(policy(obs), dtype=np.int64))
            returns += reward * alive
            alive &= ~(term | trunc)
            if stop_below is not None and np.isfinite(max_return):
                best = returns.sum() + (max_return - returns[alive]).sum()  # CartPole: reward 1 per step
                if best < stop_below * episodes:
                    returns[alive] = 0.0
                    break
    finally:
        envs.close()
    return returns


# ------------------------------------------------------------------ training
@dataclasses.dataclass
class PPOConfig:
    """PPO hyper-parameters (defaults: rl-zoo's CartPole-v1: DLR-RM/rl-baselines3-zoo, PPO hyper-parameters)."""

    n_envs: int = 8
    n_steps: int = 32
    batch_size: int = 256
    epochs: int = 20
    gamma: float = 0.98
    lam: float = 0.8
    lr: float = 1e-3
    clip: float = 0.2
    anneal_steps: int = 100_000  # lr and clip decay linearly to `floor` of their start over these steps
    floor: float = 0.05  # (rl-zoo decays to 0 at its 100k-step budget; we may go on)
    ent_coef: float = 0.0
    vf_coef: float = 0.5
    max_grad_norm: float = 0.5
    hidden: int = 64
    eval_trigger: float = 0.8  # evaluate greedily once training returns reach this fraction of threshold
    eval_every: int = 4096  # ... and at most once per this many env steps

    def __post_init__(self):
        for name in ("n_envs", "n_steps", "batch_size", "epochs", "hidden", "anneal_steps", "eval_every"):
            v = getattr(self, name)
            check_int(name, v, 1)
        if (self.n_envs * self.n_steps) % self.batch_size:
            raise ValueError(
                f"batch_size must divide n_envs * n_steps = {self.n_envs * self.n_steps}, got {self.batch_size}"
            )
        for name in ("gamma", "lam", "floor"):
            check_probability(name, getattr(self, name))
        check_probability("clip", self.clip, lo_open=True, hi_open=True)
        check_number("lr", self.lr, 0, lo_open=True)


def update(model, opt, batch: dict, cfg: PPOConfig, clip: float, generator=None) -> dict:
    """``cfg.epochs`` passes of minibatch PPO over one rollout (flattened over time and envs)."""
    from .gae import gae

    adv, ret = gae(batch["rewards"], batch["values"], batch["dones"], batch["last_value"], cfg.gamma, cfg.lam)
    flat = {
        "obs": batch["obs"].flatten(0, 1),
        "actions": batch["actions"].flatten(),
        "logp": batch["logp"].flatten(),
        "adv": adv.flatten(),
        "ret": ret.flatten(),
    }
    n = flat["actions"].numel()
    for _ in range(cfg.epochs):
        perm = torch.randperm(n, generator=generator)
        for start in range(0, n, cfg.batch_size):
            idx = perm[start : start + cfg.batch_size]
            obs = flat["obs"][idx]
            logp_all = torch.log_softmax(model.logits(obs), -1)
            entropy = -(logp_all.exp() * logp_all).sum(-1)
            new_logp = logp_all.gather(-1, flat["actions"][idx, None]).squeeze(-1)
            loss, parts = ppo_loss(
                new_logp,
                flat["logp"][idx],
                flat["adv"][idx],
                model.value(obs),
                flat["ret"][idx],
                entropy,
                clip,
                cfg.vf_coef,
                cfg.ent_coef,
            )
            opt.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
            opt.step()
    return parts


def train_ppo(
    env_id: str = "CartPole-v1",
    seed: int = 0,
    total_steps: int | None = None,
    *,
    threshold: float | None = None,
    config: PPOConfig | None = None,
    eval_episodes: int = 100,
    max_steps: int = 500_000,
    progress: bool = True,
):
    """Train PPO; returns ``(policy, curve)``.

    Stops when a greedy evaluation over ``eval_episodes`` episodes (seeds ``10**6 + 1000 * seed + i``)
    reaches ``threshold`` (default: the env's reward threshold, 475 for CartPole-v1), or after
    ``total_steps`` env steps if given (then no early stop; default cap ``max_steps``).
    ``curve``: DataFrame, one row per update: ``env_steps``, ``wall_s`` (training + evaluation),
    ``mean_return`` (last 20 finished training episodes, sampled actions), ``eval_return`` (NaN unless
    evaluated at that update). ``curve.attrs``: ``reached`` (env steps at the passing evaluation or None),
    ``eval_s`` (seconds spent in evaluations).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    spec = check_env_id(env_id)
    cfg = config or PPOConfig()
    if threshold is None:
        threshold = spec.reward_threshold if spec.reward_threshold is not None else math.inf
    if total_steps is not None:
        check_int("total_steps (or None)", total_steps, 1)
    budget = total_steps if total_steps is not None else max_steps
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    envs = make_envs(env_id, cfg.n_envs)
    try:
        model = ActorCritic(envs.single_observation_space.shape[0], int(envs.single_action_space.n), cfg.hidden, g)
        policy = Policy(model)
        opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, eps=1e-5)
        roll = Rollout(envs, model, seed, cfg.gamma, g)
        rows, steps, last_eval, reached, eval_s = [], 0, -cfg.eval_every, None, 0.0
        clock = Laps()
        bar = tqdm(total=budget, desc=f"PPO {env_id} seed {seed}", unit="step", disable=not progress, leave=False)
        while steps < budget:
            frac = max(1.0 - steps / cfg.anneal_steps, cfg.floor)
            for group in opt.param_groups:
                group["lr"] = cfg.lr * frac
            batch = roll.collect(cfg.n_steps)
            update(model, opt, batch, cfg, cfg.clip * frac, g)
            steps += batch["steps"]
            bar.update(batch["steps"])
            recent = list(roll.finished)[-20:]
            mean_return = float(np.mean(recent)) if recent else float("nan")
            eval_return = float("nan")
            if (
                total_steps is None
                and recent
                and mean_return >= cfg.eval_trigger * threshold
                and steps - last_eval >= cfg.eval_every
            ):
                last_eval = steps
                with Timer() as t_eval:
                    eval_return = float(
                        evaluate_policy(policy, env_id, eval_episodes, 10**6 + 1000 * seed, stop_below=threshold).mean()
                    )
                eval_s += t_eval.seconds
            rows.append((steps, clock.elapsed(), mean_return, eval_return))
            bar.set_postfix(mean_return=f"{mean_return:.0f}")
            if eval_return >= threshold:
                reached = steps
                bar.total = bar.n  # solved before the budget: a full bar (tqdm's notebook bar turns red at n < total)
                break
        bar.close()
    finally:
        envs.close()
        torch.set_num_threads(threads)
    curve = pd.DataFrame(rows, columns=["env_steps", "wall_s", "mean_return", "eval_return"])
    curve.attrs.update(reached=reached, eval_s=eval_s, threshold=threshold, env_id=env_id, seed=seed)
    return policy, curve
