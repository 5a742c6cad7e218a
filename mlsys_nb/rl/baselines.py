"""The same CartPole task with stable-baselines3's PPO (the tool a user would otherwise pick).

``sb3_train(env_id, seed)`` uses rl-zoo's published CartPole-v1 settings (DLR-RM/rl-baselines3-zoo,
PPO hyper-parameters: 8 envs, n_steps 32, batch 256, gae_lambda 0.8, gamma 0.98, 20 epochs,
ent_coef 0, learning rate lin_1e-3 and clip lin_0.2 over 1e5 steps) and the stopping protocol of
``mlsys_nb.rl.ppo.train_ppo``: a greedy evaluation over 100 episodes (same seeds, same ``evaluate_policy``)
once the last 20 training episodes average 0.8 x threshold, at most every 4096 steps.
"""

from __future__ import annotations

import math

import numpy as np

from ..runtime.timing import Laps, Timer

RL_ZOO_CARTPOLE = {"n_steps": 32, "batch_size": 256, "gae_lambda": 0.8, "gamma": 0.98, "n_epochs": 20, "ent_coef": 0.0}
N_ENVS, N_TIMESTEPS = 8, 100_000


def sb3_train(
    env_id: str = "CartPole-v1",
    seed: int = 0,
    threshold: float | None = None,
    eval_episodes: int = 100,
    total_steps: int = N_TIMESTEPS,
    eval_trigger: float = 0.8,
    eval_every: int = 4096,
):
    """Train SB3 PPO until greedy evaluation reaches ``threshold``; returns ``(model, curve)`` like ``train_ppo``."""
    import pandas as pd
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.utils import LinearSchedule

    from .ppo import check_env_id, evaluate_policy

    spec = check_env_id(env_id)
    threshold = spec.reward_threshold if threshold is None else threshold
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    env = make_vec_env(env_id, n_envs=N_ENVS, seed=seed)
    model = PPO(
        "MlpPolicy",
        env,
        learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
        clip_range=LinearSchedule(0.2, 0.0, 1.0),
        seed=seed,
        device="cpu",
        verbose=0,
        **RL_ZOO_CARTPOLE,
    )
    # SB3's default logger makes an empty folder tempdir/SB3-<date> per run even at verbose=0: log nowhere instead
    model.set_logger(Logger(folder=None, output_formats=[]))

    def policy(obs):
        return model.predict(obs, deterministic=True)[0]

    class Stop(BaseCallback):
        def _on_training_start(self):
            self.rows, self.last_eval, self.reached, self.eval_s = [], -math.inf, None, 0.0
            self.clock = Laps()

        def _on_step(self):  # False stops learn() at once (before another update) once reached
            return self.reached is None

        def _on_rollout_start(self):  # called after the previous rollout's update
            steps = self.model.num_timesteps
            if steps == 0:
                return
            recent = [ep["r"] for ep in list(self.model.ep_info_buffer)[-20:]]
            mean_return = float(np.mean(recent)) if recent else math.nan
            eval_return = math.nan
            if recent and mean_return >= eval_trigger * threshold and steps - self.last_eval >= eval_every:
                self.last_eval = steps
                with Timer() as t:
                    eval_return = float(
                        evaluate_policy(policy, env_id, eval_episodes, 10**6 + 1000 * seed, stop_below=threshold).mean()
                    )
                self.eval_s += t.seconds
            self.rows.append((steps, self.clock.elapsed(), mean_return, eval_return))
            if eval_return >= threshold:
                self.reached = steps

        def _on_training_end(self):  # the last update's row (no rollout starts after it)
            steps = self.model.num_timesteps
            if self.reached is None and (not self.rows or self.rows[-1][0] != steps):
                recent = [ep["r"] for ep in list(self.model.ep_info_buffer)[-20:]]
                self.rows.append(
                    (steps, self.clock.elapsed(), float(np.mean(recent)) if recent else math.nan, math.nan)
                )

    cb = Stop()
    try:
        model.learn(total_timesteps=total_steps, callback=cb)
    finally:
        env.close()
        torch.set_num_threads(threads)
    curve = pd.DataFrame(cb.rows, columns=["env_steps", "wall_s", "mean_return", "eval_return"])
    curve.attrs.update(reached=cb.reached, eval_s=cb.eval_s, threshold=threshold, env_id=env_id, seed=seed)
    return model, curve
